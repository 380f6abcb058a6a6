"""Resources: runs, their traces, and volume files, addressable by fleet:// URIs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from fleet_rlm.errors import FleetError, NotFound, TooLarge
from fleet_rlm.mcp.views import run_state

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.mcp.provider import EngineProvider

RECENT_RUNS = 50
MAX_RESOURCE_BYTES = 8 * 1024 * 1024  # bigger files: page with the read_file tool


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    async def engine() -> Engine:
        with _resource_errors():
            return await provider.get()

    @server.resource(
        "fleet://runs",
        name="runs",
        title="Recent runs",
        mime_type="application/json",
        description=f"The {RECENT_RUNS} most recent runs, newest first.",
    )
    async def runs() -> str:
        page = (await engine()).workspace.list_runs(limit=RECENT_RUNS)
        return _json([r.model_dump(mode="json") for r in page.runs])

    @server.resource(
        "fleet://runs/{run_id}",
        name="run",
        title="A run",
        mime_type="application/json",
        description="A run's status, answer and live progress counters.",
    )
    async def run(run_id: str) -> str:
        eng = await engine()
        with _resource_errors():
            return _json(run_state(eng.workspace, run_id).model_dump(mode="json"))

    @server.resource(
        "fleet://runs/{run_id}/trace",
        name="trace",
        title="A run's trace",
        mime_type="application/json",
        description="Every node and step of a run: code, output, sub-queries, children (can be large).",
    )
    async def trace(run_id: str) -> str:
        eng = await engine()
        with _resource_errors():
            return _json(eng.workspace.trace(run_id))

    @server.resource(
        "fleet://volumes/{volume}/{+path}",
        name="volume-file",
        title="A file in a volume",
        description="A file of a volume: text, or binary as a blob. Paths cannot leave the volume.",
    )
    async def volume_file(volume: str, path: str) -> str | bytes:
        eng = await engine()
        with _resource_errors():
            try:  # in a worker thread: with Daytona volumes the read is network I/O
                data = await anyio.to_thread.run_sync(eng.workspace.file_bytes, volume, path, MAX_RESOURCE_BYTES)
            except TooLarge as exc:
                raise ResourceError(f"{exc.message} (the read_file tool pages through it)") from exc
        if b"\x00" in data:  # valid UTF-8 can still be binary: send it as a blob
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data


@contextlib.contextmanager
def _resource_errors() -> Iterator[None]:
    try:
        yield
    except NotFound as exc:
        raise ResourceNotFoundError(exc.message) from exc
    except FleetError as exc:  # e.g. a ConfigError: say what to fix rather than "internal error"
        raise ResourceError(exc.message) from exc


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
