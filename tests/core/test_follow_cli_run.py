"""The web app's engine follows a run that another process (a real `fleet-rlm run`) is running:
live, every event exactly once and in order, to its run.finished, also when that process is killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.types import ACTIVE_STATUSES
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BIN = Path(sys.executable).parent


def start_cli_run(question: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            [str(BIN / "fleet-rlm"), "run", question, "--text", "x", "--json"],
            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def run_id_of(engine: Engine, question: str) -> str:
    """The id of the CLI's run, as soon as it has recorded it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = [r for r in engine.list_runs() if r.question == question]
        if rows:
            return rows[0].id
        await asyncio.sleep(0.05)
    raise AssertionError(f"the CLI never recorded its run {question!r}")


async def collect(events: AsyncIterator[dict[str, Any]], into: list, probe: Callable[[], Any] = lambda: None) -> Any:
    """Append events to ``into`` up to the first run.finished; return ``probe()`` taken at the first one."""
    probed = None
    async with aclosing(events):
        async for event in events:
            if not into:
                probed = probe()
            into.append(event)
            if event["kind"] == "run.finished":
                break
    return probed


async def test_a_cli_run_is_followed_live_by_another_process(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.state.latency = 0.3  # each model call: the run is still going while it is followed
    oracle.add(Scenario("follow me", ["print('one')", "print('two')", "SUBMIT('done')"]))
    async with Engine() as engine:
        everything: list[dict[str, Any]] = []
        watcher = asyncio.create_task(collect(engine.subscribe(None), everything))
        await asyncio.sleep(0.3)  # it has taken its place in the store's event order
        proc = start_cli_run("follow me", fleet_env, tmp_path / "cli.log")
        try:
            run_id = await run_id_of(engine, "follow me")
            got: list[dict[str, Any]] = []
            status_at_first = await asyncio.wait_for(
                collect(engine.subscribe(run_id), got, lambda: engine.get_run(run_id).status), 120
            )
            assert await asyncio.to_thread(proc.wait, 60) == 0, (tmp_path / "cli.log").read_text()
            await asyncio.wait_for(watcher, 10)
        finally:
            kill(proc)
        stored = engine.events(run_id)
    assert status_at_first in ACTIVE_STATUSES  # the events came while it ran: tailed live, not replayed
    assert got == stored  # every event exactly once, in order
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    assert got[0]["kind"] == "run.started" and [e["kind"] for e in got].count("code.executed") == 3
    assert got[-1]["kind"] == "run.finished" and got[-1]["data"]["status"] == "succeeded"
    assert got[-1]["data"]["answer"] == "done"
    assert everything == stored  # the all-runs subscription saw it too


async def test_following_a_cli_run_whose_process_is_killed_ends_interrupted(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path
) -> None:
    oracle.state.latency = 0.3
    oracle.add(Scenario("hang", ["print('working')", "import time\ntime.sleep(120)"]))
    async with Engine() as engine:
        proc = start_cli_run("hang", fleet_env, tmp_path / "cli.log")
        try:
            run_id = await run_id_of(engine, "hang")
            got: list[dict[str, Any]] = []
            follower = asyncio.create_task(collect(engine.subscribe(run_id), got))
            deadline = time.monotonic() + 90
            while len(got) < 5:  # started, context, lm, code, lm: it is in its endless step
                assert time.monotonic() < deadline and not follower.done(), "the run never got going"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(kill, proc)
            await asyncio.wait_for(follower, 30)
        finally:
            kill(proc)
        stored = engine.events(run_id)
        row = engine.get_run(run_id)
    assert got == stored
    assert got[-1]["kind"] == "run.finished" and got[-1]["data"]["status"] == "interrupted"
    assert row.status == "interrupted" and row.stop_reason == f"the process running it stopped (pid {proc.pid})"
