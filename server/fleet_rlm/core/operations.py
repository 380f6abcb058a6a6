"""Operations on the workspace that every face offers, written once.

A face (CLI, MCP, web, agent, desktop) translates its request into one of these calls and the
returned view into its own wire; it decides nothing itself, so the faces cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from fleet_rlm.core.types import ACTIVE_STATUSES
from fleet_rlm.core.views import CancelResult

if TYPE_CHECKING:  # the faces import this module at start-up; the engine (dspy) loads on first use
    from fleet_rlm.core.engine import Engine


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
