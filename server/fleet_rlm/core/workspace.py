"""The read side of the runtime: runs, traces, events and volumes, as every face shows them.

It opens the store and the volumes and nothing else (no DSPy, no model, no sandbox), so read-only
commands (`fleet-rlm runs`, `trace`, `export`, `volumes`) start instantly. The ``Engine`` holds one
and answers its read calls through it, so both paths say the same thing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from fleet_rlm.core import views
from fleet_rlm.core.errors import NotFound, UserError
from fleet_rlm.core.rerun import ReplayReport, replay_report
from fleet_rlm.core.types import ACTIVE_STATUSES, STATUSES, Event, RunResult
from fleet_rlm.store import RunRecord, Store
from fleet_rlm.volumes import LocalVolumes, volumes_for

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

EXPORT_PAGE = 1000
MAX_ENTRIES = 1000  # a recursive listing of a big volume must not flood the caller


class Workspace:
    """Use as ``with Workspace.open(settings) as ws:``, or take ``engine.workspace``."""

    def __init__(self, store: Store, volumes: LocalVolumes) -> None:
        self.store = store
        self.volumes = volumes

    @classmethod
    def open(cls, settings: Settings) -> Workspace:
        settings.make_home()
        return cls(Store(settings.store_path), volumes_for(settings))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------

    def run(self, run_id: str) -> RunRecord:
        """The run's row; NotFound names the fix."""
        row = self.store.get_run(run_id)
        if row is None:
            raise NotFound(f"no run '{run_id}': list recent runs with `fleet-rlm runs` (MCP: list_runs)")
        return row

    def run_state(self, run_id: str) -> views.RunState:
        return views.run_state(self.run(run_id), self.store.events(run_id))

    def run_result(self, run_id: str) -> RunResult:
        return views.run_result(self.run(run_id))

    def replay_report(self, run_id: str) -> ReplayReport:
        """How a replay compares with the run it replays, step by step (docs/replay.md)."""
        row = self.run(run_id)
        if row.kind != "replay" or row.parent_run_id is None:
            raise UserError(f"run '{run_id}' is not a replay: `fleet-rlm replay {run_id}` replays it")
        source = self.run(row.parent_run_id)
        return replay_report(row, self.store.events(run_id), source, self.store.events(source.id))

    def finished_runs_since(self, since: float, limit: int = 1000) -> list[str]:
        """Ids of people's runs created since ``since`` that have ended, oldest first: what a regression
        replay (`fleet-rlm replay --all --since DATE`) goes through."""
        rows = self.store.list_runs(limit=limit, kind="run")
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
        rows = self.store.list_runs(limit=limit + 1, offset=offset, status=status, session_id=session_id, q=q)
        return views.RunList(
            runs=[views.run_summary(r) for r in rows[:limit]], offset=offset, has_more=len(rows) > limit
        )

    def runs(self, **filters: Any) -> list[RunRecord]:
        """Rows, for faces that need more than the summary (e.g. the CLI's JSON listing)."""
        return self.store.list_runs(**filters)

    # -- events and traces --------------------------------------------------------------------

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        return self.store.events(run_id, after_seq=after_seq, limit=limit)

    def export(self, run_id: str) -> Iterator[Event]:
        """Every event of a run in seq order, read a page at a time (a long run can be big)."""
        self.run(run_id)
        after = 0
        while page := self.store.events(run_id, after_seq=after, limit=EXPORT_PAGE):
            yield from page
            after = page[-1]["seq"]

    def trace(self, run_id: str) -> dict[str, Any]:
        """The whole run as a tree (see ``core.trace``)."""
        from fleet_rlm.core.trace import build_trace

        self.run(run_id)
        return build_trace(self.store.events(run_id))

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
        self.run(run_id)
        events = self.store.events(run_id)
        return views.trace_page(run_id, events, node=node, step=step, detail=detail, offset=offset, limit=limit)

    # -- feedback -----------------------------------------------------------------------------

    def feedback(self, run_id: str) -> list[views.Feedback]:
        """Judgements of the run's answer, oldest first (the optimizer's training signal)."""
        self.run(run_id)
        return [views.Feedback.model_validate(row) for row in self.store.feedback(run_id)]

    async def add_feedback(
        self, run_id: str, correct: bool, expected: str | None = None, comment: str | None = None
    ) -> views.Feedback:
        self.run(run_id)
        row = await self.store.write(self.store.add_feedback, run_id, correct, expected, comment)
        return views.Feedback.model_validate(row)

    # -- volumes ------------------------------------------------------------------------------

    def volume_list(self) -> views.VolumeList:
        return views.VolumeList(volumes=[views.VolumeInfo(**v) for v in self.volumes.list_volumes()])

    def files(self, volume: str, path: str = "", recursive: bool = False, limit: int = MAX_ENTRIES) -> views.FileList:
        """Entries under ``path`` of a volume, at most ``limit`` (``truncated`` says if there are more)."""
        entries = self.volumes.list_files(volume, path, recursive=recursive)
        return views.FileList(
            volume=volume,
            path=path,
            entries=[views.FileEntry(**e) for e in entries[:limit]],
            truncated=len(entries) > limit,
        )

    def text(self, volume: str, path: str, offset: int = 0, length: int = 65536) -> views.TextRange:
        """A byte range of a text file of a volume (links and pipes refused, binary files too)."""
        entry = self.volumes.stat(volume, path)
        if entry["type"] != "file":
            raise UserError(f"'{path}' in volume '{volume}' is not a file (it is a {entry['type']})")
        data = self.volumes.read(volume, path, offset, length)
        if b"\x00" in data:
            raise UserError(f"'{path}' in volume '{volume}' looks binary: download it instead of reading it as text")
        return views.text_range(volume, path, data, offset, entry["size"])
