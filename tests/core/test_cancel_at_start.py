"""A run stopped before it executes is recorded as cancelled, with its events through run.finished.

Two ways a run could be stopped before its task took a step: ``Engine.cancel`` right after
``start_run`` returned (a task cancelled before its first step never runs its body), and the caller
of ``start_run`` cancelled while the run's row was being written (the row is written all the same).
Either left the row ``queued`` with no events until a restart. Judged from the store (SQLite itself)
and the engine's face, on the real sandbox.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

BOUND = 60.0  # seconds: only a hang gets near it


def stored(home: Path, run_id: str) -> tuple[str, list[str]]:
    """(status, event kinds in order) of a run, read from SQLite itself."""
    db = sqlite3.connect(home / "fleet.db")
    try:
        (status,) = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        kinds = [k for (k,) in db.execute("SELECT kind FROM events WHERE run_id = ? ORDER BY seq", (run_id,))]
    finally:
        db.close()
    return status, kinds


async def test_run_cancelled_before_its_first_step_is_recorded_cancelled(
    fleet_env: dict[str, str], oracle: OracleLM
) -> None:
    oracle.add(Scenario("stop me", ["SUBMIT('ran anyway')"]))
    home = Path(fleet_env["FLEET_HOME"])
    async with Engine() as engine:
        run_id = await engine.start_run(RunRequest("stop me", context_text=["x"]))
        async with asyncio.timeout(BOUND):
            assert await engine.cancel(run_id)  # no await between: its task has not begun
        assert engine.get_run(run_id).status == "cancelled"  # type: ignore[union-attr]
        result = await engine.wait(run_id)
        assert result.status == "cancelled" and result.answer is None
        events = engine.events(run_id)
        assert [e["kind"] for e in events] == ["run.started", "run.finished"]
        assert events[-1]["data"]["status"] == "cancelled"
        assert not oracle.requests(), "a run stopped before it began asked the model"
    assert stored(home, run_id) == ("cancelled", ["run.started", "run.finished"])


async def test_engine_closing_before_a_run_begins_records_it_cancelled(
    fleet_env: dict[str, str], oracle: OracleLM
) -> None:
    oracle.add(Scenario("stop me", ["SUBMIT('ran anyway')"]))
    home = Path(fleet_env["FLEET_HOME"])
    async with Engine() as engine:
        run_id = await engine.start_run(RunRequest("stop me", context_text=["x"]))
    assert stored(home, run_id) == ("cancelled", ["run.started", "run.finished"])


async def test_caller_of_start_run_cancelled_at_any_point_leaves_no_run_queued(
    fleet_env: dict[str, str], oracle: OracleLM
) -> None:
    """The caller goes away after 0..N loop turns: inside the row's write or just after it. A run
    whose row exists ends on its own (nobody else will stop it), recorded cancelled."""
    oracle.add(Scenario("warm up", ["SUBMIT('warm')"]))
    oracle.add(Scenario("go away", ["SUBMIT('ran anyway')"]))
    home = Path(fleet_env["FLEET_HOME"])
    async with Engine() as engine:
        await engine.run(RunRequest("warm up", context_text=["x"]))  # the model check runs once, here
        abandoned: set[str] = set()  # questions whose start_run raised CancelledError
        for turns in range(16):
            question = f"go away {turns}"
            starting = asyncio.ensure_future(engine.start_run(RunRequest(question, context_text=["x"])))
            for _ in range(turns):
                await asyncio.sleep(0)
            starting.cancel()
            try:
                await starting
            except asyncio.CancelledError:
                abandoned.add(question)
        async with asyncio.timeout(BOUND):
            while any(r.status in ("queued", "running") for r in engine.list_runs(limit=100)):
                await asyncio.sleep(0.05)
        runs = [r for r in engine.list_runs(limit=100) if r.question.startswith("go away")]
    written = [r for r in runs if r.question in abandoned]
    assert written, "no cancel landed while a row was written: the test tested nothing"
    for run in runs:
        status, kinds = stored(home, run.id)
        assert kinds[-1:] == ["run.finished"], (run.question, status, kinds)
        if run.question in abandoned:  # its caller went away: nobody follows it, so it ends at once
            assert status == "cancelled" and kinds == ["run.started", "run.finished"], (run.question, status, kinds)
