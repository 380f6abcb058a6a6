"""Engine state shaped for MCP: shared by tools and resources so both say the same thing."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.exceptions import ToolError

from fleet_rlm.core.progress import ProgressTracker
from fleet_rlm.mcp.models import Progress, RunOutput, RunState, RunSummary, trace_uri
from fleet_rlm.redaction import redact_text

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.types import RunResult
    from fleet_rlm.store import RunRecord


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors the user can fix into tool errors the model reads.

    Any other exception reaches the client only as "Error executing tool", so messages written
    for people (ConfigError, ContextError, VolumeError, ...) must be re-raised as ToolError,
    with secrets masked: the reply leaves this machine's trust boundary.
    """
    from fleet_rlm.volumes import VolumeError

    try:
        yield
    except ToolError:
        raise
    except (ValueError, VolumeError, KeyError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ToolError(redact_text(str(message))) from exc


def unknown_run(run_id: str) -> ToolError:
    return ToolError(f"no run '{run_id}': call list_runs to see recent runs")


def run_output(result: RunResult) -> RunOutput:
    return RunOutput(
        run_id=result.run_id,
        status=result.status,  # type: ignore[arg-type]
        answer=result.answer,
        iterations=result.iterations,
        llm_calls=result.llm_calls,
        usage=result.usage or {},
        seconds=result.seconds,
        stop_reason=result.stop_reason,
        error=result.error,
        session_id=result.session_id,
        trace_uri=trace_uri(result.run_id),
    )


def progress_of(engine: Engine, run_id: str) -> Progress:
    tracker = ProgressTracker()
    for event in engine.events(run_id):
        tracker.feed(event)
    return Progress(**dataclasses.asdict(tracker.state))


def run_state(engine: Engine, run_id: str) -> RunState | None:
    rec = engine.get_run(run_id)
    if rec is None:
        return None
    progress = progress_of(engine, run_id)
    return RunState(
        run_id=rec.id,
        status=rec.status,  # type: ignore[arg-type]
        question=rec.question,
        answer=rec.answer,
        error=rec.error,
        stop_reason=rec.stop_reason,
        session_id=rec.session_id,
        created_at=rec.created_at,
        started_at=rec.started_at,
        finished_at=rec.finished_at,
        seconds=_seconds(rec),
        # While a run is going the row's counters are still 0; the events know better.
        iterations=rec.iterations or progress.root_steps,
        llm_calls=rec.llm_calls or progress.llm_calls,
        usage=rec.usage or {},
        progress=progress,
        trace_uri=trace_uri(rec.id),
    )


def run_summary(rec: RunRecord) -> RunSummary:
    return RunSummary(
        run_id=rec.id,
        status=rec.status,  # type: ignore[arg-type]
        question=rec.question[:200],
        answer_preview=(rec.answer or "")[:200] or None,
        created_at=rec.created_at,
        seconds=_seconds(rec) if rec.started_at else None,
        session_id=rec.session_id,
    )


def _seconds(rec: RunRecord) -> float:
    end = rec.finished_at or time.time()
    return round(end - (rec.started_at or rec.created_at), 3)


def jsonable(model: Any) -> Any:
    return model.model_dump(mode="json") if hasattr(model, "model_dump") else model
