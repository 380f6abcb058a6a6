"""The operations every face offers, on their own: what a face returns is what these return."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fleet_rlm.core import operations
from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from tests.core.test_follow_cli_run import kill, run_id_of, start_cli_run
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio


async def test_cancel_stops_a_live_run_and_leaves_an_ended_one(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    oracle.state.latency = 0.5
    oracle.add(Scenario("slow one", ["print(1)", "print(2)", "print(3)", "SUBMIT('late')"]))
    async with Engine() as engine:
        run_id = await engine.start_run(RunRequest("slow one", context_text="x"))
        while not oracle.requests():  # the run is under way: its first model call has arrived
            await asyncio.sleep(0.02)
        stopped = await operations.cancel_run(engine, "last")
        assert (stopped.run_id, stopped.cancelled, stopped.status) == (run_id, True, "cancelled")
        again = await operations.cancel_run(engine, run_id[-6:])  # any run reference
        assert (again.cancelled, again.status) == (False, "cancelled")
        assert again.message == "the run already ended (cancelled)"


@pytest.mark.slow
async def test_cancel_names_the_process_that_owns_the_run(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.state.latency = 0.5
    oracle.add(Scenario("elsewhere", ["print(1)", "print(2)", "print(3)", "SUBMIT('x')"]))
    async with Engine() as engine:
        proc = start_cli_run("elsewhere", fleet_env, tmp_path / "cli.log")
        try:
            run_id = await run_id_of(engine, "elsewhere")
            result = await operations.cancel_run(engine, run_id)
        finally:
            kill(proc)
    assert not result.cancelled and result.status in ("queued", "running")
    assert f"another process (pid {proc.pid} on " in result.message and "stop it there" in result.message


def test_retention_passes_a_pinned_run_by_until_it_is_unpinned(fleet_env: dict) -> None:
    from fleet_rlm.config import load_settings
    from fleet_rlm.core import housekeeping
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.store import RunRecord

    settings = load_settings()
    month_ago = time.time() - 40 * 86400
    with Workspace.open(settings) as ws:
        for run_id in ("rkeep0000001", "rlose0000002"):
            ws.store.runs.create(RunRecord(run_id, "old question", status="succeeded", created_at=month_ago))
        summary = operations.pin_run(ws, "keep0000001")  # any run reference
        assert (summary.run_id, summary.pinned) == ("rkeep0000001", True)
        assert housekeeping.delete_runs_older_than(ws, settings, 30) == 1
        assert [r.id for r in ws.runs()] == ["rkeep0000001"] and ws.run("rkeep0000001").pinned
        assert operations.pin_run(ws, "rkeep0000001", pinned=False).pinned is False
        assert housekeeping.delete_runs_older_than(ws, settings, 30) == 1
        assert ws.runs() == []
