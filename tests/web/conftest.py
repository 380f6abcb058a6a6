"""Fixtures for the web face: the app over a fresh FLEET_HOME and the scripted model, as an
in-process ASGI client (finite responses) or under uvicorn in a thread (SSE streams: httpx's
ASGITransport buffers a whole body, so an endless stream never yields there)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from fleet_rlm.web import create_app
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario

TOKEN = "web-test-token-8c1f2e9a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1:8000"
QUICK = ["print(len(context))\nSUBMIT('answered: ' + query[:20])"]
# Steps that each print and loop, so a run emits events for a while (about 0.2 s per step).
SLOW = ["import time\ntime.sleep(0.2)\nprint('step')"] * 6 + ["SUBMIT('slow done')"]


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
    """A client of a fresh app (its own Engine), authenticated with the bearer token."""
    app = create_app(token=TOKEN, port=8000, **options)
    async with running(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, headers=AUTH, timeout=60) as client:
            yield client


@pytest.fixture
async def client(fake_env: dict[str, str], scripted: OracleLM) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client() as c:
        yield c


@contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """Serve ``app`` under uvicorn on a free loopback port in a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


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
