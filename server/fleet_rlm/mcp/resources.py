"""Resources: runs, their traces, and volume files, addressable by fleet:// URIs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from fleet_rlm.core.trace import build_trace
from fleet_rlm.mcp.views import jsonable, run_state, run_summary

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.mcp.provider import EngineProvider

RECENT_RUNS = 50
MAX_RESOURCE_BYTES = 8 * 1024 * 1024  # bigger files: page with the read_file tool


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    async def engine() -> Engine:
        try:
            return await provider.get()
        except ValueError as exc:  # ConfigError: say what to fix rather than "internal error"
            raise ResourceError(str(exc)) from exc

    @server.resource(
        "fleet://runs",
        name="runs",
        title="Recent runs",
        mime_type="application/json",
        description=f"The {RECENT_RUNS} most recent runs, newest first.",
    )
    async def runs() -> str:
        rows = (await engine()).list_runs(limit=RECENT_RUNS)
        return _json([jsonable(run_summary(r)) for r in rows])

    @server.resource(
        "fleet://runs/{run_id}",
        name="run",
        title="A run",
        mime_type="application/json",
        description="A run's status, answer and live progress counters.",
    )
    async def run(run_id: str) -> str:
        state = run_state(await engine(), run_id)
        if state is None:
            raise ResourceNotFoundError(f"no run '{run_id}'")
        return _json(jsonable(state))

    @server.resource(
        "fleet://runs/{run_id}/trace",
        name="trace",
        title="A run's trace",
        mime_type="application/json",
        description="Every node and step of a run: code, output, sub-queries, children (can be large).",
    )
    async def trace(run_id: str) -> str:
        eng = await engine()
        if eng.get_run(run_id) is None:
            raise ResourceNotFoundError(f"no run '{run_id}'")
        return _json(build_trace(eng.events(run_id)))

    @server.resource(
        "fleet://volumes/{volume}/{+path}",
        name="volume-file",
        title="A file in a volume",
        description="A file of a volume: text, or binary as a blob. Paths cannot leave the volume.",
    )
    async def volume_file(volume: str, path: str) -> str | bytes:
        from fleet_rlm.volumes import VolumeError

        eng = await engine()
        try:
            entry = eng.volumes.stat(volume, path)
            if entry["type"] != "file":
                raise ResourceNotFoundError(f"no file '{path}' in volume '{volume}' (it is a {entry['type']})")
            if entry["size"] > MAX_RESOURCE_BYTES:
                raise ResourceError(f"'{path}' is larger than {MAX_RESOURCE_BYTES:,} bytes: use the read_file tool")
            data = eng.volumes.read(volume, path)
        except VolumeError as exc:
            raise ResourceError(str(exc)) from exc
        if b"\x00" in data:  # valid UTF-8 can still be binary: send it as a blob
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
