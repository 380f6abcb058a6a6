"""A run whose store's disk fills up while it runs (FLEET_HOME on a real, small tmpfs).

Its end (the final row and ``run.finished``) is tried again while the disk stays full, so space freed
meanwhile records it as it ended; past that, everyone following the run sees it end (failed: the
store's disk is full), waiting for it says so, and the store records it failed as soon as it can be
written again, instead of leaving it ``running`` for as long as the process lives."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import StoreFull
from fleet_rlm.types import RunRequest
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.small_disk import fill, free, small_home

pytestmark = pytest.mark.anyio
STEPS = ["print('working ' * 2000)", "print('still working ' * 2000)", "SUBMIT('done')"]


@pytest.fixture
def disk(tmp_path: Path, fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """FLEET_HOME on a 16 MB tmpfs; the fast in-process sandbox (isolation is not what this tests)."""
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    with small_home(tmp_path, monkeypatch) as mounted:
        yield mounted


@pytest.fixture
async def engine(disk: Path, oracle: OracleLM) -> AsyncIterator[Engine]:
    oracle.add(Scenario("fill the disk", STEPS))
    async with Engine() as e:
        yield e


async def _start_then_fill(engine: Engine, oracle: OracleLM, disk: Path) -> str:
    """Start a run and fill the disk while its first model call waits; then let the call answer."""
    oracle.state.hold = threading.Event()
    run_id = await engine.start_run(RunRequest("fill the disk", context_text=["some text"]))
    with anyio.fail_after(60):
        while not oracle.requests("root"):
            await anyio.sleep(0.02)
    fill(disk)
    oracle.state.hold.set()
    return run_id


class _FreeOn(logging.Handler):
    """Frees the disk when the engine says it tries the run's end again: space comes back mid-wait."""

    def __init__(self, disk: Path) -> None:
        super().__init__()
        self.disk = disk
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.seen.append(message)
        if "trying again" in message:
            free(self.disk)


async def test_a_run_s_end_is_tried_again_and_recorded_once_space_is_freed(
    engine: Engine, oracle: OracleLM, disk: Path
) -> None:
    handler = _FreeOn(disk)
    logger = logging.getLogger("fleet_rlm.core.engine")
    logger.addHandler(handler)
    try:
        run_id = await _start_then_fill(engine, oracle, disk)
        with anyio.fail_after(60):
            result = await engine.wait(run_id)
    finally:
        logger.removeHandler(handler)
    assert any("the store's disk is full" in m and "trying again" in m for m in handler.seen), handler.seen
    assert result.status == "succeeded" and result.answer == "done"
    events = engine.events(run_id)
    assert events[-1]["kind"] == "run.finished" and events[-1]["data"]["status"] == "succeeded"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # what was lost took no seq


async def test_a_run_that_cannot_be_recorded_ends_for_its_followers_and_is_recorded_failed_later(
    engine: Engine, oracle: OracleLM, disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleet_rlm.core.engine._FULL_RETRIES", (0.05,))  # give up soon: the disk stays full
    seen: list[dict] = []

    async def follow(run_id: str) -> None:
        async for event in engine.subscribe(run_id):
            seen.append(event)

    run_id = await _start_then_fill(engine, oracle, disk)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follow, run_id)
        with anyio.fail_after(60), pytest.raises(StoreFull, match=f"^the store's disk is full.*run {run_id}"):
            await engine.wait(run_id)
    # The follower was not left waiting for an end the store could not take.
    assert seen[-1]["kind"] == "run.finished" and seen[-1]["data"]["status"] == "failed"
    assert seen[-1]["data"]["error"].startswith("the store's disk is full")
    assert seen[-1]["data"]["answer"] == "done"  # what the run found is kept beside the failure
    row = engine.get_run(run_id)
    assert row is not None and row.status == "running"  # nothing can be written yet

    free(disk)
    with anyio.fail_after(60):
        while (row := engine.get_run(run_id)) is not None and row.status == "running":
            await anyio.sleep(0.05)
    assert row is not None and row.status == "failed" and row.finished_at is not None
    assert row.error is not None and row.error.startswith("the store's disk is full")
    events = engine.events(run_id)
    assert events[-1]["kind"] == "run.finished" and events[-1]["seq"] == seen[-1]["seq"]
    assert events[-1]["data"]["error"] == seen[-1]["data"]["error"]
    result = await engine.wait(run_id)  # recorded now: waiting answers with the record
    assert result.status == "failed" and result.error == row.error
