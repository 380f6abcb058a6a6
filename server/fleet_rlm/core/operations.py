"""Operations on the workspace that every face offers, written once.

A face (CLI, MCP, web, agent, desktop) translates its request into one of these calls and the
returned view into its own wire; it decides nothing itself, so the faces cannot drift apart.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from fleet_rlm.core.progress import ProgressTracker
from fleet_rlm.core.views import CancelResult, RunSummary, run_summary
from fleet_rlm.types import ACTIVE_STATUSES, RunResult

if TYPE_CHECKING:  # the faces import this module at start-up; the engine (dspy) loads on first use
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.workspace import Workspace

Report = Callable[[int, str], Awaitable[None]]
"""Receives a progress line and how many events led to it (a count that only grows)."""

BATCH_INTERVAL = 0.25  # seconds between progress lines inside one batch of sub-queries
CANCEL_GRACE = 30.0  # seconds a cancelled run gets to stop its sandbox and record itself


def pin_run(workspace: Workspace, ref: str, pinned: bool = True) -> RunSummary:
    """Pin a run (any run reference) so retention keeps it, or unpin it; the run as it now is."""
    run_id = workspace.resolve_run(ref)
    workspace.store.runs.update(run_id, pinned=pinned)
    return run_summary(workspace.run(run_id))


def own_active_runs(engine: Engine) -> list[str]:
    """Runs this process is running or has queued (another process's runs are its own to stop)."""
    rows = [r for status in ACTIVE_STATUSES for r in engine.list_runs(status=status, kind=None)]
    return [r.id for r in rows if r.owner_pid == os.getpid()]


async def cancel_own_runs(engine: Engine) -> int:
    """Stop every run of this process (each recorded as cancelled), e.g. when its window closes."""
    return sum([await engine.cancel(run_id) for run_id in own_active_runs(engine)])


async def cancel_run(engine: Engine, ref: str) -> CancelResult:
    """Stop a run of this process, named by any run reference (``last``, a unique part of an id).

    A run that already ended is left as it is; a run another process owns is named with that
    process, since only it can stop the run's sandbox."""
    row = engine.workspace.run(ref)
    if row.status not in ACTIVE_STATUSES:
        return CancelResult(
            run_id=row.id, cancelled=False, status=row.status, message=f"the run already ended ({row.status})"
        )
    with anyio.CancelScope(shield=True):  # once asked, the cancellation is recorded even if the asker goes away
        cancelled = await engine.cancel(row.id)
    if cancelled:
        return CancelResult(
            run_id=row.id, cancelled=True, status=engine.workspace.run(row.id).status, message="cancelled"
        )
    owner = f"pid {row.owner_pid} on {row.owner_host}"
    message = f"another process ({owner}) runs it: stop it there"
    return CancelResult(run_id=row.id, cancelled=False, status=row.status, message=message)


async def follow(engine: Engine, job_id: str, report: Report, *, interval: float = BATCH_INTERVAL) -> None:
    """Relay a run's (or an optimization's) progress lines until it ends: every step, child and
    ending, and inside a batch of sub-queries at most one line per ``interval`` and always its last."""
    tracker = ProgressTracker()
    last_report = 0.0
    async with contextlib.aclosing(engine.subscribe(job_id)) as events:
        async for event in events:
            line = tracker.feed(event)
            if line is None:
                continue
            now, s = time.monotonic(), tracker.state
            in_batch = event["kind"] == "subcall.finished" and s.subqueries_done < s.subqueries_total
            if in_batch and now - last_report < interval:
                continue
            last_report = now
            await report(s.events, line)


@contextlib.asynccontextmanager
async def stopped_if_abandoned(engine: Engine, job_id: str) -> AsyncIterator[None]:
    """Around a face's wait for a run or an optimization: a waiter that is cancelled (its client went
    away, its turn was stopped) cancels the job, so it is recorded cancelled rather than left going."""
    finished = False
    try:
        yield
        finished = True
    finally:
        if not finished:  # shielded, or the pending cancellation would abort the clean-up itself
            with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_GRACE):
                await engine.cancel(job_id)


async def follow_to_end(engine: Engine, run_id: str, report: Report, *, interval: float = BATCH_INTERVAL) -> RunResult:
    """``follow`` a started run and return its result; abandoned, the run is stopped."""
    async with stopped_if_abandoned(engine, run_id):
        await follow(engine, run_id, report, interval=interval)
        return await engine.wait(run_id)
