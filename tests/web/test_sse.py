"""SSE against uvicorn in a thread (httpx's ASGITransport buffers whole bodies, so live streams
need a real server): resume with Last-Event-ID, a client leaving mid-run, 100 subscribers at once,
keep-alive comments, the browser page's session id, and a run owned by another process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet_rlm.web.app import create_app
from tests.support.oracle_lm import OracleLM
from tests.web.conftest import AUTH, TOKEN, parse_sse, serving

pytestmark = pytest.mark.anyio
BIN = Path(sys.executable).parent


@pytest.fixture
def server(fake_env: dict[str, str], scripted: OracleLM) -> Iterator[tuple[str, object]]:
    app = create_app(token=TOKEN, sse_ping=0.3)
    with serving(app) as base:
        yield base, app


async def _start(client: httpx.AsyncClient, question: str = "slow question") -> str:
    started = await client.post("/api/runs", json={"question": question})
    assert started.status_code == 202, started.text
    return str(started.json()["run_id"])


async def _read(client: httpx.AsyncClient, url: str, *, stop_after: int | None = None, **kw: object) -> list[dict]:
    """Events of a stream (frames with an id), to its end or until ``stop_after`` events, then leave."""
    events: list[dict] = []
    async with client.stream("GET", url, **kw) as response:  # type: ignore[arg-type]
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        buffer = ""
        async for chunk in response.aiter_text():
            buffer += chunk.replace("\r\n", "\n")
            *done, buffer = buffer.split("\n\n")
            for frame in parse_sse("\n\n".join(done)):
                if "id" in frame:
                    events.append({"id": int(frame["id"]), "event": frame["event"], **json.loads(frame["data"])})
                    if stop_after is not None and len(events) >= stop_after:
                        return events
    return events


def _engine(app: object):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while (engine := app.state.fleet.current) is None:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return engine


@pytest.mark.slow
async def test_resume_with_last_event_id_delivers_each_event_once(server: tuple[str, object]) -> None:
    base, _ = server
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as client:
        run_id = await _start(client)
        first = await _read(client, f"/api/runs/{run_id}/events", stop_after=3)
        last_id = first[-1]["id"]
        rest = await _read(client, f"/api/runs/{run_id}/events", headers={"Last-Event-ID": str(last_id)})
    seqs = [e["id"] for e in first + rest]
    assert seqs == list(range(1, len(seqs) + 1))  # in order, no gap, no duplicate
    assert all(e["id"] == e["seq"] and e["event"] == e["kind"] for e in first + rest)
    assert rest[-1]["kind"] == "run.finished" and rest[-1]["data"]["answer"] == "slow done"


async def test_a_client_leaving_mid_run_closes_its_subscription(server: tuple[str, object]) -> None:
    base, app = server
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as client:
        run_id = await _start(client)
        bus = _engine(app).bus
        before = bus.subscriber_count()
        got = await _read(client, f"/api/runs/{run_id}/events", stop_after=2)  # then the connection closes
        assert [e["id"] for e in got] == [1, 2]
        deadline = time.monotonic() + 10
        while bus.subscriber_count() > before:
            assert time.monotonic() < deadline, "the subscription outlived its client"
            await asyncio.sleep(0.05)
        # The run itself goes on, unaffected.
        while (await client.get(f"/api/runs/{run_id}")).json()["status"] == "running":
            await asyncio.sleep(0.05)
        assert (await client.get(f"/api/runs/{run_id}")).json()["answer"] == "slow done"


@pytest.mark.slow
async def test_hundred_subscribers_get_every_event(server: tuple[str, object]) -> None:
    base, app = server
    limits = httpx.Limits(max_connections=120)
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=120, limits=limits) as client:
        run_id = await _start(client)
        baseline = _engine(app).bus.subscriber_count()  # the MCP face watches every run
        streams = await asyncio.gather(*(_read(client, f"/api/runs/{run_id}/events") for _ in range(100)))
        export = (await client.get(f"/api/runs/{run_id}/export")).text.splitlines()
    expected = [json.loads(line)["seq"] for line in export]
    assert expected[-1] >= 10
    for events in streams:
        assert [e["id"] for e in events] == expected
    assert _engine(app).bus.subscriber_count() == baseline


@pytest.mark.slow
async def test_keep_alive_and_the_session_the_page_streams_with(server: tuple[str, object]) -> None:
    base, _ = server
    async with httpx.AsyncClient(base_url=base, timeout=60) as browser:  # as the page: never the token itself
        session = (await browser.post("/api/auth", json={"token": TOKEN})).json()["session"]
        browser.headers["Authorization"] = f"Bearer {session}"
        run_id = await _start(browser)
        async with browser.stream("GET", f"/api/runs/{run_id}/events") as response:
            raw = (await response.aread()).decode()
    assert raw.startswith("retry: 2000")
    assert ": ping" in raw  # a keep-alive comment while the run was quiet (every 0.3 s here)
    assert "event: run.finished" in raw


@pytest.mark.slow
async def test_a_run_owned_by_another_process_streams_live(server: tuple[str, object], fake_env: dict) -> None:
    """The CLI runs the question in its own process (real local sandbox); the web app streams it."""
    base, _ = server
    env = {**os.environ, **fake_env, "FLEET_SANDBOX": "local", "FLEET_NO_KEYRING": "1"}
    cli = subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", "slow question", "--text", "x", "--json", "--trace-mode", "off"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as client:
            deadline = time.monotonic() + 60
            while not (runs := (await client.get("/api/runs")).json()["runs"]):
                assert time.monotonic() < deadline and cli.poll() is None, cli.stderr.read() if cli.stderr else ""
                await asyncio.sleep(0.05)
            run_id = runs[0]["run_id"]
            events = await _read(client, f"/api/runs/{run_id}/events", stop_after=2)
            live = cli.poll() is None  # the events came while the other process was still running it
            events += await _read(client, f"/api/runs/{run_id}/events", headers={"Last-Event-ID": "2"})
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err
    assert json.loads(out)["answer"] == "slow done"
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["kind"] == "run.finished" and events[-1]["data"]["answer"] == "slow done"
    assert live
