"""The read side of the runtime: runs, traces, events and volumes, as every face shows them.

It opens the store and the volumes and nothing else (no DSPy, no model, no sandbox), so read-only
commands (`fleet-rlm runs`, `trace`, `export`) start instantly. The ``Engine`` holds one and answers
its read calls through it, so both paths say the same thing. Its volume calls (list, read, write,
delete) are ``VolumeOperations``, which the CLI's `volumes` uses without opening the store.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from fleet_rlm.core import views
from fleet_rlm.core.rerun import ReplayReport, replay_report
from fleet_rlm.core.volume_operations import VolumeOperations
from fleet_rlm.errors import Conflict, NotFound, RunNotFound, UserError
from fleet_rlm.store import RunRecord, Store
from fleet_rlm.types import ACTIVE_STATUSES, LM_CALL, STATUSES, Event, RunResult
from fleet_rlm.volumes import Volumes, volumes_for

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

EXPORT_PAGE = 1000
INPUTS_PAGE = 50  # events read at a time looking for context.loaded (a few come before it)
MIN_ID_PART = 4  # hex characters of an id that refer to a run (after its kind letter, for a prefix)
MAX_REF_CHARS = 64  # longer than any run id (a kind letter, 6 random hex, the creation time in ms as hex)
SHOWN_REF_CHARS = 80  # of a reference a message quotes
MAX_BACK = 2**63 - 1  # the largest offset SQLite takes: last~N past it names no run either
_LAST = re.compile(r"last(?:~(\d+))?")


def shown_ref(ref: str) -> str:
    """A run reference as a message quotes it: its first characters when it is long."""
    return ref if len(ref) <= SHOWN_REF_CHARS else ref[:SHOWN_REF_CHARS] + "…"


class Workspace(VolumeOperations):
    """Use as ``with Workspace.open(settings) as ws:``, or take ``engine.workspace``."""

    def __init__(self, store: Store, volumes: Callable[[], Volumes]) -> None:
        super().__init__(volumes)
        self.store = store

    @classmethod
    def open(cls, settings: Settings) -> Workspace:
        settings.make_home()
        return cls(Store(settings.store_path), functools.cache(functools.partial(volumes_for, settings)))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------

    def resolve_run(self, ref: str) -> str:
        """The full id of the run ``ref`` names: its id, ``last`` (the newest run), ``last~N`` (the N-th
        before it), or a unique start or end of its id. Every face takes run ids through here. A
        reference longer than any id names no run, and a message quotes only its head."""
        if last := _LAST.fullmatch(ref):
            return self._newest_run(int(last.group(1) or 0), ref)
        if len(ref) > MAX_REF_CHARS:  # no id is this long: no query (a LIKE pattern has a limit)
            raise RunNotFound(f"no run '{shown_ref(ref)}'")
        if self.store.runs.exists(ref):
            return ref
        if len(ref) < MIN_ID_PART:
            raise RunNotFound(f"no run '{ref}': give at least {MIN_ID_PART} characters of its id, or last")
        found = self.store.runs.ids_matching(ref, prefix=len(ref) > MIN_ID_PART)
        if not found:
            raise RunNotFound(f"no run '{ref}'")
        if len(found) > 1:
            raise UserError(f"'{ref}' matches more than one run, e.g. {' and '.join(found)}: give more characters")
        return found[0]

    def _newest_run(self, back: int, ref: str) -> str:
        rows = self.store.runs.list(limit=1, offset=back, kind="run") if back <= MAX_BACK else []
        if not rows:
            raise RunNotFound(f"no run '{shown_ref(ref)}': there are fewer than {shown_ref(str(back + 1))} runs")
        return rows[0].id

    def run(self, run_id: str) -> RunRecord:
        """The run's row (``run_id`` may be any reference ``resolve_run`` takes); NotFound names the fix."""
        full_id = self.resolve_run(run_id)
        row = self.store.runs.get(full_id)
        if row is None:  # deleted just now
            raise RunNotFound(f"no run '{full_id}'")
        return row

    def run_state(self, run_id: str) -> views.RunState:
        row = self.run(run_id)
        return views.run_state(row, self.store.runs.events(row.id))

    def run_result(self, run_id: str) -> RunResult:
        return views.run_result(self.run(run_id))

    def inputs(self, run_id: str) -> views.InputsSummary | None:
        """What went into the run's context (``views.inputs_of``), read without its steps: the context
        is loaded before the first model call, so the reading stops there."""
        full_id = self.resolve_run(run_id)
        after = 0
        while page := self.store.runs.events(full_id, after_seq=after, limit=INPUTS_PAGE):
            found = views.inputs_of(page)
            if found is not None or any(e["kind"] == LM_CALL for e in page):
                return found
            after = page[-1]["seq"]
        return None

    def replay_report(self, run_id: str) -> ReplayReport:
        """How a replay compares with the run it replays, step by step (docs/replay.md)."""
        row = self.run(run_id)
        if row.kind != "replay" or row.parent_run_id is None:
            raise UserError(f"run '{row.id}' is not a replay: `fleet-rlm replay {row.id}` replays it")
        source = self.run(row.parent_run_id)
        return replay_report(row, self.store.runs.events(row.id), source, self.store.runs.events(source.id))

    def finished_runs_since(self, since: float, limit: int = 1000) -> list[str]:
        """Ids of people's runs created since ``since`` that have ended, oldest first: what a regression
        replay (`fleet-rlm replay --all --since DATE`) goes through."""
        rows = self.store.runs.list(limit=limit, kind="run")
        return [r.id for r in reversed(rows) if r.created_at >= since and r.status not in ACTIVE_STATUSES]

    def list_runs(
        self,
        *,
        limit: int = 50,
        offset: int = 0,
        status: str | None = None,
        session_id: str | None = None,
        q: str | None = None,
    ) -> views.RunList:
        """Newest first, one page; ``has_more`` says whether another page exists. ``q``: only runs
        whose question contains it."""
        if status is not None and status not in STATUSES:
            raise UserError(f"unknown status '{status}': use one of {', '.join(STATUSES)}")
        if limit < 1 or offset < 0:
            raise UserError("limit must be at least 1 and offset at least 0")
        rows = self.store.runs.list(limit=limit + 1, offset=offset, status=status, session_id=session_id, q=q)
        return views.RunList(
            runs=[views.run_summary(r) for r in rows[:limit]], offset=offset, has_more=len(rows) > limit
        )

    def runs(self, **filters: Any) -> list[RunRecord]:
        """Rows, for faces that need more than the summary (e.g. the CLI's JSON listing)."""
        return self.store.runs.list(**filters)

    # -- sessions -----------------------------------------------------------------------------

    def list_sessions(self, include_closed: bool = False) -> views.SessionList:
        """Sessions (REPLs that outlive one run), most recently used first."""
        rows = self.store.sessions.list(include_closed=include_closed)
        return views.SessionList(sessions=[views.SessionInfo.model_validate(r, from_attributes=True) for r in rows])

    def session(self, session_id: str) -> views.SessionInfo:
        """One session, open or closed; NotFound names the fix."""
        row = self.store.sessions.get(session_id)
        if row is None:
            raise NotFound(f"no session '{session_id}': list them with GET /api/sessions")
        return views.SessionInfo.model_validate(row, from_attributes=True)

    # -- events and traces --------------------------------------------------------------------

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        return self.store.runs.events(run_id, after_seq=after_seq, limit=limit)

    def export(self, run_id: str) -> Iterator[Event]:
        """Every event of a run in seq order, read a page at a time (a long run can be big)."""
        full_id = self.resolve_run(run_id)
        after = 0
        while page := self.store.runs.events(full_id, after_seq=after, limit=EXPORT_PAGE):
            yield from page
            after = page[-1]["seq"]

    def trace(self, run_id: str) -> dict[str, Any]:
        """The whole run as a tree (see ``core.trace``)."""
        from fleet_rlm.core.trace import build_trace

        return build_trace(self.store.runs.events(self.resolve_run(run_id)))

    def trace_page(
        self,
        run_id: str,
        *,
        node: str = "root",
        step: int | None = None,
        detail: Literal["summary", "full"] = "summary",
        offset: int = 0,
        limit: int = 20,
    ) -> views.TraceView:
        full_id = self.resolve_run(run_id)
        events = self.store.runs.events(full_id)
        return views.trace_page(full_id, events, node=node, step=step, detail=detail, offset=offset, limit=limit)

    # -- feedback -----------------------------------------------------------------------------

    def feedback(self, run_id: str) -> list[views.Feedback]:
        """Judgements of the run's answer, oldest first (the optimizer's training signal)."""
        full_id = self.resolve_run(run_id)
        return [
            views.Feedback.model_validate(row, from_attributes=True) for row in self.store.uploads.feedback(full_id)
        ]

    async def add_feedback(
        self, run_id: str, correct: bool, expected: str | None = None, comment: str | None = None
    ) -> views.Feedback:
        full_id = self.resolve_run(run_id)
        if correct:
            self._check_answered(full_id)
        row = await self.store.write(self.store.uploads.add_feedback, full_id, correct, expected, comment)
        return views.Feedback.model_validate(row, from_attributes=True)

    def _check_answered(self, run_id: str) -> None:
        """Only an answer can be right: a run without one is marked wrong, with the right answer."""
        run = self.store.runs.get(run_id)
        if run is None or (run.answer or "").strip():
            return
        if run.status in ACTIVE_STATUSES:
            raise Conflict(f"run {run_id} has not finished yet: judge its answer once it has one")
        raise Conflict(f"run {run_id} gave no answer ({run.status}), so it cannot be marked correct: "
                       "mark it wrong and give the expected answer")  # fmt: skip
