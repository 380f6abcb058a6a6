"""Fixtures for the web face: the app over a fresh FLEET_HOME and the scripted model, as an
in-process ASGI client (finite responses) or under uvicorn in a thread (SSE streams: httpx's
ASGITransport buffers a whole body, so an endless stream never yields there); and the real
`fleet web` command as a process, for the browser tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from fleet_rlm.mcp.server import http_app as mcp_face
from fleet_rlm.web.app import create_app
from tests.support import fake_sandbox
from tests.support.asgi_server import serve_asgi
from tests.support.oracle_lm import OracleLM, Scenario

TOKEN = "web-test-token-8c1f2e9a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1:8000"
QUICK = ["print(len(context))\nSUBMIT('answered: ' + query[:20])"]
# Steps that each print and loop, so a run emits events for a while (about 0.2 s per step).
SLOW = ["import time\ntime.sleep(0.2)\nprint('step')"] * 6 + ["SUBMIT('slow done')"]
BIN = Path(sys.executable).parent
URL = re.compile(r"(http://127\.0\.0\.1:\d+)/#token=([A-Za-z0-9_\-.~%]+)")


@pytest.fixture
def fake_env(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test settings with the fast in-process sandbox (isolation is not what these tests test)."""
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    return {**fleet_env, "FLEET_SANDBOX": "fake"}


@pytest.fixture
def scripted(oracle: OracleLM) -> OracleLM:
    oracle.add(Scenario("quick question", QUICK))
    oracle.add(Scenario("slow question", SLOW))
    return oracle


@asynccontextmanager
async def running(app: Starlette) -> AsyncIterator[Starlette]:
    """The app with its lifespan running (ASGITransport does not run it)."""
    async with app.router.lifespan_context(app):
        yield app


@asynccontextmanager
async def api_client(**options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a fresh app (its own Engine, MCP at /mcp as `fleet web` serves it), authenticated
    with the bearer token."""
    app = create_app(token=TOKEN, port=8000, **{"mcp": mcp_face, **options})
    async with running(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, headers=AUTH, timeout=60) as client:
            yield client


@pytest.fixture
async def client(fake_env: dict[str, str], scripted: OracleLM) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client() as c:
        yield c


def serving(app: Starlette) -> AbstractContextManager[str]:
    """Serve ``app`` under uvicorn on a free loopback port in a thread; yields the base URL."""
    return serve_asgi(lambda _port: app)


async def wait_finished(client: httpx.AsyncClient, run_id: str, timeout: float = 60) -> dict[str, Any]:
    import anyio

    with anyio.fail_after(timeout):
        while True:
            state = (await client.get(f"/api/runs/{run_id}")).json()
            if state["status"] not in ("queued", "running"):
                return state
            await anyio.sleep(0.05)


def parse_sse(text: str) -> list[dict[str, str]]:
    """SSE frames as dicts of their fields (comments under ':')."""
    frames = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        frame: dict[str, str] = {}
        for line in block.split("\n"):
            if not line:
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            frame[name] = frame[name] + "\n" + value if name in frame and name == "data" else value
        if frame:
            frames.append(frame)
    return frames


@dataclass
class WebServer:
    base: str
    token: str
    home: Path
    env: dict[str, str]
    proc: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    @property
    def login_url(self) -> str:
        return f"{self.base}/#token={self.token}"

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)


@contextmanager
def fleet_web(root: Path, env: dict[str, str], wrap: Sequence[str] = ()) -> Iterator[WebServer]:
    """`fleet web --no-open --port 0` run in ``root`` with ``env`` (behind the ``wrap`` command, if any)
    until the block ends; FLEET_HOME is ``env``'s. Fails if it does not print its address within 60 s."""
    command = [*wrap, str(BIN / "fleet"), "web", "--no-open", "--port", "0"]
    proc = subprocess.Popen(command, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    output: list[str] = []
    threading.Thread(target=_drain, args=(proc.stdout, output), daemon=True).start()
    deadline = time.monotonic() + 60
    found = None
    while time.monotonic() < deadline and proc.poll() is None and not found:
        found = next((m for m in map(URL.search, list(output)) if m), None)
        time.sleep(0.1)
    try:
        if not found:
            pytest.fail("`fleet web --no-open --port 0` did not print its http://127.0.0.1:PORT/#token=... address:\n"
                        + "".join(output))  # fmt: skip
        yield WebServer(found.group(1), found.group(2), Path(env["FLEET_HOME"]), env, proc, output)
    finally:
        _stop(proc)


def _drain(stream: object, into: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.append(line)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group (start_new_session)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
