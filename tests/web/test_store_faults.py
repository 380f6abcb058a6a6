"""The web face when the store cannot write: another process holds its lock, or its disk is full.

Both are outages the user can act on, so both answer 503 with the sentence that says what to do (the
CLI's words), never a 500 "internal error (a bug)". A run whose disk fills up while it runs ends for
its live followers, the API keeps answering, and the run is recorded failed once space is freed,
instead of showing `running` for as long as the server lives. The full disk is a real, small tmpfs."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from fleet_rlm.config import load_settings
from fleet_rlm.web.app import create_app
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.small_disk import fill, free, small_home
from tests.web.conftest import AUTH, TOKEN, serving, wait_finished

pytestmark = pytest.mark.anyio
STEPS = ["print('working ' * 2000)", "print('still working ' * 2000)", "SUBMIT('done')"]


async def test_a_store_locked_by_another_process_is_a_503_that_says_so(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleet_rlm.store.db._BUSY_SECONDS", 0.2)  # set before the writer's connection opens
    first = await client.post("/api/runs", json={"question": "quick question", "context_text": ["x"]})
    assert first.status_code == 202, first.text
    await wait_finished(client, first.json()["run_id"])  # the server has written: its writer is connected
    holder = sqlite3.connect(load_settings().store_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another fleet-rlm process in the middle of a long write
    try:
        refused = await client.post("/api/runs", json={"question": "quick question", "context_text": ["x"]})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert refused.status_code == 503, refused.text
    body = refused.json()
    assert body["error"] == "unavailable"
    assert body["message"].endswith(
        "stayed locked for 0.2 s by another fleet-rlm process; try again when it is less busy"
    )
    again = await client.post("/api/runs", json={"question": "quick question", "context_text": ["x"]})
    assert again.status_code == 202, again.text  # and nothing was harmed


@pytest.fixture
def disk(tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """FLEET_HOME on a 16 MB tmpfs (the fast in-process sandbox: isolation is not what this tests)."""
    with small_home(tmp_path, monkeypatch) as mounted:
        yield mounted


@pytest.mark.slow
async def test_a_run_whose_disk_fills_up_ends_and_is_recorded_failed_once_space_is_freed(
    disk: Path, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleet_rlm.core.engine._FULL_RETRIES", (0.05,))  # the disk stays full: give up soon
    oracle.add(Scenario("fill the disk", STEPS))
    oracle.state.hold = threading.Event()  # the first model call waits while the test fills the disk
    with serving(create_app(token=TOKEN, sse_ping=0.3)) as base:
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as client:
            started = await client.post("/api/runs", json={"question": "fill the disk", "context_text": ["x"]})
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            with anyio.fail_after(60):
                while not oracle.requests("root"):
                    await anyio.sleep(0.02)
            followed: list[dict] = []
            ended = anyio.Event()

            async def follow() -> None:
                async with client.stream("GET", f"/api/runs/{run_id}/events") as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("data:"):
                            followed.append(json.loads(line.removeprefix("data:")))
                ended.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                with anyio.fail_after(60):
                    while not followed:  # the stream is open and live before the disk fills
                        await anyio.sleep(0.02)
                fill(disk)
                oracle.state.hold.set()
                with anyio.fail_after(60):  # it ends: it does not wait for an end the store cannot take
                    await ended.wait()
            end = followed[-1]
            assert end["kind"] == "run.finished" and end["data"]["status"] == "failed"
            assert end["data"]["error"].startswith("the store's disk is full")

            # Still full: the server answers, reads as they are and refuses what it cannot record.
            state = await client.get(f"/api/runs/{run_id}")
            assert state.status_code == 200 and state.json()["status"] == "running"
            refused = await client.post("/api/runs", json={"question": "fill the disk", "context_text": ["x"]})
            assert refused.status_code == 503 and refused.json()["message"].startswith("the store's disk is full")

            free(disk)
            final = await wait_finished(client, run_id)
            assert final["status"] == "failed" and final["error"].startswith("the store's disk is full")
