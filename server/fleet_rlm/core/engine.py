"""The Engine: one per process. Starts runs, keeps sessions, owns the store and the bus.

Every face (CLI, MCP, web) calls these methods and nothing else of the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_rlm.config import ConfigError, Settings, load_settings
from fleet_rlm.core.admission import admit, text_to_read
from fleet_rlm.core.events import EventBus
from fleet_rlm.core.inputs.documents import Converter
from fleet_rlm.core.inputs.remote import fetch_sources
from fleet_rlm.core.rerun import Rerun, plan_fork, plan_replay, record_inputs
from fleet_rlm.core.run import RunContext, limits_for, load_inputs, open_sandbox, sandbox_spec
from fleet_rlm.core.tape import Tape
from fleet_rlm.core.telemetry import Telemetry, start_telemetry
from fleet_rlm.core.tools import open_tools
from fleet_rlm.core.workspace import Workspace
from fleet_rlm.errors import Conflict, FleetError, StoreError, StoreFull
from fleet_rlm.sandbox.base import Sandbox, create_sandbox
from fleet_rlm.store import ACTIVE_STATUSES, RunRecord, Store
from fleet_rlm.types import RUN_FINISHED, Event, RunRequest, RunResult
from fleet_rlm.volumes import Volumes, volumes_for
from fleet_rlm.volumes.quota import volume_quota

log = logging.getLogger(__name__)

# A run's end (its final row and run.finished) that the store's full disk refuses is tried again after
# each of these pauses (seconds), so space freed meanwhile records the run as it ended. Past them, its
# followers see it end failed and it is recorded so as soon as the store can be written again, tried
# every _RECORD_LATER seconds (first, at most).
_FULL_RETRIES = (0.5, 1.0, 2.0, 4.0)
_RECORD_LATER = (0.5, 5.0)
_FULL_DISK_END = "the store's disk is full: this run ended ({status}), but its record could not be saved whole"


def new_id(prefix: str) -> str:
    """Random first, so two ids differ from their first characters and a few of them name a run
    (lists sort by the recorded time, not by id); the creation time after it keeps ids unique."""
    return f"{prefix}{secrets.token_hex(3)}{int(time.time() * 1000):x}"


@dataclass
class Replay:
    """A run an optimization makes: a candidate program answering a dataset row (``optimize.harness``);
    not ``Engine.replay``, which runs a recorded run again from its record (``core.rerun``)."""

    program: Any  # an RLMProgram (or a wrapper with its ``aforward(runtime)``)
    version: str  # recorded as the run's program version: a version id or "candidate:<hash>"
    parent: str  # the optimization's id


@dataclass
class Unrecorded:
    """A run's end the store's full disk refused: recorded failed once the store can be written again."""

    fields: dict[str, Any]  # the run row's final columns
    data: dict[str, Any]  # its run.finished
    error: StoreFull  # what waiting for the run raises meanwhile


@dataclass
class Session:
    """A REPL that outlives one run: variables from earlier answers stay for follow-ups."""

    id: str
    work_dir: Path
    sandbox: Sandbox | None = None
    has_context: bool = False
    started: bool = False  # its sandbox ran once, so "not alive" now means it died
    lost_state: bool = False  # the REPL died (or its process did) since the last run
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class Engine:
    """Use as ``async with Engine() as engine:``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.store: Store | None = None
        self.bus: EventBus | None = None
        self._volumes: Volumes | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sessions: dict[str, Session] = {}
        self._programs: dict[str | None, Any] = {}  # program version id (None: built-in) -> RLMProgram
        self._lms: tuple[Any, Any] | None = None
        self._named_lms: dict[str, Any] = {}  # settings.models, each built once (named_model)
        self._reaper: asyncio.Task[None] | None = None
        self._workspace: Workspace | None = None
        self._preflight = asyncio.Lock()
        self._telemetry: Telemetry | None = None
        self._unrecorded: dict[str, Unrecorded] = {}  # run id -> its end, waiting for the store's disk
        self._recorder: asyncio.Task[None] | None = None
        # Runs whose task has not taken its first step: cancelling such a task would skip its body (no
        # final row, no run.finished), so a stop asks it to end as it begins, recorded cancelled.
        self._unbegun: set[str] = set()
        self._stop_at_start: set[str] = set()

    async def __aenter__(self) -> Engine:
        self.settings.make_home()
        self.store = Store(self.settings.store_path)
        self._workspace = Workspace(self.store, lambda: self.volumes)
        self.bus = EventBus(self.store)
        self._telemetry = start_telemetry(self.settings, self.store)  # None unless OpenTelemetry export is on
        interrupted = self.store.runs.mark_interrupted()
        if interrupted:
            log.warning("marked %d run(s) interrupted: their process stopped", len(interrupted))
        self._remove_orphaned_scratch()
        self._reaper = asyncio.create_task(self._reap_idle_sessions())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _remove_orphaned_scratch(self) -> None:
        """Remove scratch folders of runs that ended without cleaning up (their process was killed).

        Whoever noticed the death first (this start, or any read of the run) recorded it, so
        look at the folders, not at what this start marked."""
        store = self._require_store()
        for folder in self.settings.work_root.iterdir():
            row = store.runs.get(folder.name)
            if row is not None and row.status not in ACTIVE_STATUSES:
                shutil.rmtree(folder, ignore_errors=True)

    async def close(self) -> None:
        if self._reaper:
            self._reaper.cancel()
        for task_id, task in list(self._tasks.items()):
            self._stop(task_id, task)
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._recorder:  # after the runs: one cancelled while waiting for the disk hands its end here
            self._recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recorder
        await self._record_unrecorded_once()  # a last try; if the disk is still full, readers find it interrupted
        # Sessions stay open in the store: a later process may continue them (with a fresh REPL).
        for session in list(self._sessions.values()):
            await self._discard(session)
        self._sessions.clear()
        if self.store:
            # Commits every queued event and row update, then stops the writer thread.
            await asyncio.to_thread(self.store.close)
            self.store = None
        if self._telemetry:  # after the store: every committed event has reached it
            await asyncio.to_thread(self._telemetry.close)
            self._telemetry = None

    # -- runs ----------------------------------------------------------------------------------

    def _require_store(self) -> Store:
        if self.store is None:
            raise RuntimeError("the engine is not started: use `async with Engine() as engine`")
        return self.store

    def validate(self, req: RunRequest) -> None:
        """Fail fast, before a run exists, on anything the user can fix (RunRequest checked its own fields)."""
        admit(self.settings, req, lambda: self.volumes)
        text_to_read(self.settings, req)
        self.models()  # the LMs themselves: dspy refuses some settings (a small max_tokens for reasoning models)
        self.check_cost_cap(limits_for(req, self.settings).max_cost)
        if req.session_id and req.session_id not in self._sessions:
            row = self._require_store().sessions.get(req.session_id)
            if row is not None and row.closed_at is not None:
                raise Conflict(f"session '{req.session_id}' is closed: use a new session id")

    def check_cost_cap(self, max_cost: float | None) -> None:
        """ConfigError, with the fix, when a run could not enforce this cost cap (a model without a known price)."""
        from fleet_rlm.core.lm import check_cost_cap

        check_cost_cap(max_cost, *self.models())

    async def start_run(self, req: RunRequest, *, replay: Replay | None = None, rerun: Rerun | None = None) -> str:
        """Validate, record the run as queued and start it; returns the run id at once.

        The run uses the active program version (recorded on its row), or ``replay``'s candidate.
        ``rerun``: a replay or fork of a recorded run (``replay``, ``fork`` below)."""
        store = self._require_store()
        live = rerun is None or rerun.kind == "fork"  # a replay asks no model: nothing to check it against
        if live:
            self.validate(req)
        from fleet_rlm.core.lm import preflight

        # Once per engine: a wrong model or a closed port, before a run exists; doubts become the run's warnings.
        async with self._preflight:  # a burst of first runs waits for one check, not one each
            doubts = await preflight(*self.models()) if live else []
        if req.session_id and store.sessions.get(req.session_id) is None:
            await store.write(store.sessions.create, req.session_id)  # naming a new session starts it
        run_id = new_id("r")
        version = replay.version if replay else store.optimize.active_program_version()
        program = replay.program if replay else self._program_for(version)
        record = RunRecord(
            id=run_id,
            session_id=req.session_id,
            parent_run_id=replay.parent if replay else rerun.source.id if rerun else None,
            kind="eval" if replay else "replay" if rerun and rerun.kind == "replay" else "run",
            fork_at=rerun.fork.at if rerun and rerun.fork else None,
            program_version=version,
            question=req.question,
            status="queued",
            answer=None,
            stop_reason=None,
            error=None,
            request=req.to_dict(),
            usage={},
            iterations=0,
            llm_calls=0,
            created_at=time.time(),
            started_at=None,
            finished_at=None,
            owner_pid=os.getpid(),
            owner_host=socket.gethostname(),
        )
        # The row is written whatever the caller does meanwhile (the write is shielded), so a caller that
        # goes away before it is there still gets its run started, to end at once recorded cancelled
        # with its run.finished: no row is left queued with nobody to run it.
        created = asyncio.ensure_future(store.write(store.runs.create, record))
        abandoned: asyncio.CancelledError | None = None
        while not created.done():
            try:
                await asyncio.shield(created)
            except asyncio.CancelledError as exc:
                abandoned = exc
        created.result()  # the write failed: no row, no run
        self._unbegun.add(run_id)
        self.start_task(run_id, self._execute(run_id, req, program, doubts, rerun))
        if abandoned is not None:  # nobody will follow or cancel it
            self._stop(run_id, self._tasks[run_id])
            raise abandoned  # the caught one: anyio's scope knows its own cancel by its message
        return run_id

    async def replay(self, run_id: str) -> str:
        """Run a finished run again against the current code in a fresh sandbox, every model call answered
        from its record (none made, nothing paid); returns the replay's run id at once. ``wait`` for it,
        then ``workspace.replay_report(id)`` says where it parted from the record (docs/replay.md)."""
        return await self._rerun(*plan_replay(self._require_store(), self.workspace.resolve_run(run_id)))

    async def fork(
        self,
        run_id: str,
        at: str,
        *,
        code: str | None = None,
        instruction: str | None = None,
        max_iters: int | None = None,
    ) -> str:
        """A new run that replays ``run_id``'s steps before ``at`` ("3", "root:3", "root.1:2") from its
        record, runs ``code`` at that step (or asks the model, with ``instruction`` added to its transcript)
        and goes on live to its end; returns its id at once. It records its parent and fork step."""
        store, run_id = self._require_store(), self.workspace.resolve_run(run_id)
        return await self._rerun(*plan_fork(store, run_id, at, code=code, instruction=instruction, max_iters=max_iters))

    async def _rerun(self, req: RunRequest, rerun: Rerun) -> str:
        run_id = await self.start_run(req, rerun=rerun)
        store = self._require_store()
        used = store.uploads.of_run(rerun.source.id)  # the files it reads live as long as a run uses them
        if used:
            try:
                await store.write(store.uploads.attach, run_id, used)
            except asyncio.CancelledError:  # its caller went away: nobody will follow or stop it
                if (task := self._tasks.get(run_id)) is not None:
                    self._stop(run_id, task)
                raise
        return run_id

    def start_task(self, task_id: str, job: Coroutine[Any, Any, None]) -> None:
        """Run a background job under this engine (a run, an optimization): ``cancel(task_id)``
        stops it, ``close`` stops it too."""
        self._tasks[task_id] = asyncio.create_task(job, name=f"job {task_id}")
        self._tasks[task_id].add_done_callback(lambda _t: self._tasks.pop(task_id, None))

    def _program_for(self, version: str | None) -> Any:
        """The program of a version (None: the built-in one), loaded once from its saved state."""
        if version not in self._programs:
            from fleet_rlm.core.program import RLMProgram

            program = RLMProgram()
            if version is not None:
                row = self._require_store().optimize.get_program_version(version)
                if row is None:
                    raise ConfigError(
                        f"the active program version '{version}' is missing: "
                        "run `fleet-rlm programs rollback` or promote another version"
                    )
                assert row.state is not None  # only listings leave a version's state out
                try:
                    program.load_state(row.state)
                except ValueError as exc:
                    raise ConfigError(f"program version '{version}': {exc} (`fleet-rlm programs rollback`)") from None
            self._programs[version] = program
        return self._programs[version]

    async def run(self, req: RunRequest) -> RunResult:
        return await self.wait(await self.start_run(req))

    async def wait(self, run_id: str) -> RunResult:
        run_id = self.workspace.resolve_run(run_id)
        task = self._tasks.get(run_id)
        if task is not None:
            await asyncio.shield(task)
        unrecorded = self._unrecorded.get(run_id)
        if unrecorded is not None:  # the store holds no end for it (yet): say why, not "running"
            raise unrecorded.error
        return self.workspace.run_result(run_id)

    async def cancel(self, run_id: str) -> bool:
        """Stop a run of this process; its sandbox work stops and it is recorded as cancelled."""
        task = self._tasks.get(run_id) or self._tasks.get(self.workspace.resolve_run(run_id))
        if task is None or task.done():
            return False
        self._stop(run_id, task)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    def _stop(self, task_id: str, task: asyncio.Task[None]) -> None:
        """Cancel a job; a run that has not begun is asked to end as it begins instead, since a task
        cancelled before its first step never runs its body (the run would stay queued, with no events)."""
        if task_id in self._unbegun:
            self._stop_at_start.add(task_id)
        else:
            task.cancel()

    def apply_settings(self, settings: Settings) -> None:
        """Use ``settings`` from the next run on (saved settings apply without a restart).

        Runs in progress keep theirs; the data folder cannot move while the engine runs."""
        if settings == self.settings:
            return
        if settings.home != self.settings.home:
            raise ConfigError(f"FLEET_HOME changed to {settings.home}: restart to use the new folder")
        self.settings = settings
        self._lms = None  # the model settings may have changed
        self._named_lms = {}
        if self._volumes is not None:
            self._volumes.quota = volume_quota(settings)

    @property
    def volumes(self) -> Volumes:
        """The volume store ``settings.sandbox`` names (folders, or Daytona volumes), made on first use:
        a sandbox setting no store serves fails what needs volumes, not the engine."""
        if self._volumes is None:
            self._volumes = volumes_for(self.settings)
        return self._volumes

    @property
    def workspace(self) -> Workspace:
        """The read side (runs, traces, volumes) every face renders; see ``core.workspace``."""
        if self._workspace is None:
            raise RuntimeError("the engine is not started: use `async with Engine() as engine`")
        return self._workspace

    def get_run(self, run_id: str) -> RunRecord | None:
        return self._require_store().runs.get(run_id)

    def list_runs(self, **filters: Any) -> list[RunRecord]:
        return self.workspace.runs(**filters)

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        return self.workspace.events(run_id, after_seq=after_seq, limit=limit)

    def subscribe(self, run_id: str | None, after_seq: int = 0) -> AsyncGenerator[Event, None]:
        assert self.bus is not None, "the engine is not started"
        return self.bus.subscribe(run_id, after_seq=after_seq)

    def _emit(self, run_id: str) -> Any:
        bus = self.bus
        assert bus is not None

        def emit(
            kind: str, data: dict[str, Any], *, node: str = "root", parent: str | None = None, depth: int = 0
        ) -> None:
            bus.publish(run_id, kind, data, node=node, parent=parent, depth=depth)  # queued: never waits for SQLite

        return emit

    async def _execute(
        self, run_id: str, req: RunRequest, program: Any, warnings: list[str], rerun: Rerun | None = None
    ) -> None:
        self._unbegun.discard(run_id)
        stopped = run_id in self._stop_at_start  # stopped before this first step: it ends at once
        self._stop_at_start.discard(run_id)
        store = self._require_store()
        emit = self._emit(run_id)
        started = time.time()
        # Queued, not awaited: it commits before the run's events (queue order is commit order).
        store.submit(store.runs.update, run_id, status="running", started_at=started)
        limits = limits_for(req, self.settings)
        opening = {"question": req.question[:2000], "limits": limits.__dict__, "session_id": req.session_id}
        emit("run.started", opening | ({"lineage": rerun.lineage} if rerun else {}))
        for message in warnings + (rerun.warnings if rerun else []):
            emit("warning", {"message": message})
        ctx: RunContext | None = None
        status, answer, stop_reason, error = "failed", None, None, None
        scratch = self.settings.work_root / run_id  # host-only: no sandbox sees or writes it
        session: Session | None = None
        holds_lock = False
        tools = contextlib.AsyncExitStack()  # the run's MCP client sessions (core.tools), closed at its end
        try:
            if stopped:
                raise asyncio.CancelledError
            scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
            if req.session_id:
                session = await self._session(req.session_id)
                await session.lock.acquire()
                holds_lock = True
                if session.lost_state:
                    emit(
                        "warning",
                        {
                            "message": f"session {session.id}: the earlier REPL state is gone (its "
                            "sandbox or process stopped); this run starts a fresh REPL"
                        },
                    )
                    session.lost_state = False
            # Every run keeps its record; a replay's or fork's tape also answers from its source's.
            keep = functools.partial(store.records.keep, run_id)
            tape = rerun.tape(keep, emit) if rerun else Tape(keep, emit)
            volumes = self._rerun_volumes(rerun, emit) if rerun else self.mounted_volumes(req.volume)
            ctx = self._run_context(run_id, emit, limits, scratch, volumes, program, tape)
            ctx.tools = await tools.enter_async_context(open_tools(self.settings, req, tape))
            # Pages and a repository come in before the sandbox starts: a fetch that fails costs none.
            named = await fetch_sources(req, self.settings, scratch / "fetched", emit)
            spec = ctx.sandbox_spec("root")
            existing = session.sandbox if session else None
            async with open_sandbox(self.settings, spec, existing, usage=ctx.usage) as sandbox:
                if session is not None:
                    session.started = True
                for message in sandbox.warnings:
                    emit("warning", {"message": message})
                if spec.read_only_volumes and volumes and not getattr(sandbox, "volumes_read_only", False):
                    emit(
                        "warning",
                        {
                            "message": "this sandbox cannot mount volumes read-only: what the replayed "
                            "code writes to a volume, it writes again"
                        },
                    )
                staged = await load_inputs(
                    sandbox,
                    ctx.inputs_file("root"),
                    req.question,
                    paths=req.context_paths,
                    texts=req.context_text,
                    volumes=self.volumes,
                    roots=self.settings.allowed_context_roots,
                    keep_context=bool(session and session.has_context),
                    include_hidden=req.include_hidden,
                    converter=Converter(self.settings.home / "cache" / "documents", isolation=self.settings.isolation),
                    named=named,
                )
                if staged is not None:
                    emit(
                        "context.loaded",
                        {
                            "chars": staged.length,
                            "sources": len(staged.sources),
                            "skipped": staged.skipped[:50],
                            "report": staged.report(),
                            **staged.counts(),
                        },
                    )
                    if session is not None:
                        session.has_context = True
                await record_inputs(tape, req.context_text, list(volumes), staged)
                from fleet_rlm.core.node import NodeRuntime

                root = NodeRuntime(
                    ctx, node="root", parent=None, depth=0, query=req.question, sandbox=sandbox, staged=staged
                )
                result = await ctx.run_node(root)
            status, answer, stop_reason = result.status, result.answer, result.stop_reason
            if answer is None:
                error = f"no answer: {stop_reason}"
        except asyncio.CancelledError:
            status, stop_reason = "cancelled", "cancelled by the user"
            if session is not None:  # the REPL may be mid-step; its state can't be trusted
                await self._drop_sandbox(session)
        except FleetError as exc:  # written for the user already
            error = exc.message
        except Exception as exc:
            from fleet_rlm.core.lm import explain_lm_error

            error = explain_lm_error(exc, ctx.root_lm if ctx else None)
            log.debug("run %s failed", run_id, exc_info=True)
        finally:
            if session is not None:
                session.last_used = time.monotonic()
                if not session.started:  # its sandbox never started (it failed to): the next run makes a new one
                    await self._drop_sandbox(session)
                if holds_lock:
                    session.lock.release()
            # Recorded first: a cancel landing during the clean-up must not leave the run "running".
            await self._finish(run_id, ctx, status, answer, stop_reason, error, started)
            with contextlib.suppress(Exception):  # a server that broke meanwhile changes nothing recorded
                await tools.aclose()
            await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)

    def models(self) -> tuple[Any, Any]:
        """Root and sub LM, built once: settings don't change for an engine's lifetime."""
        if self._lms is None:
            from fleet_rlm.core.lm import build_lm

            self._lms = (build_lm(self.settings), build_lm(self.settings, role="sub"))
        return self._lms

    def named_model(self, name: str) -> Any:
        """Named model ``name`` of the settings (``llm_query(model=NAME)``), built once like ``models``."""
        lm = self._named_lms.get(name)
        if lm is None:
            from fleet_rlm.core.lm import build_named_lm

            lm = self._named_lms[name] = build_named_lm(self.settings, name)
        return lm

    def _run_context(
        self, run_id: str, emit: Any, limits: Any, scratch: Path, volumes: dict[str, Path], program: Any, tape: Tape
    ) -> RunContext:
        root_lm, sub_lm = self._replay_models() if tape.mode == "replay" else self.models()
        return RunContext(
            run_id=run_id,
            settings=self.settings,
            limits=limits,
            emit=emit,
            root_lm=root_lm,
            sub_lm=sub_lm,
            program=program,
            scratch=scratch,
            volumes=volumes,
            volume_store=self.volumes,
            tape=tape,
            named_models=self.named_model,
        )

    def _replay_models(self) -> tuple[Any, Any]:
        """A replay's LMs: the configured ones, or, with no model configured at all, a stand-in that is
        never called (the record answers every call, or the replay ends where it cannot)."""
        try:
            return self.models()
        except ConfigError:
            from fleet_rlm.core.lm import MeteredLM

            stand_in = MeteredLM("openai/recorded", api_key="not-needed", cache=False, num_retries=0)
            return stand_in, stand_in

    def _rerun_volumes(self, rerun: Rerun, emit: Any) -> dict[str, Path]:
        """The volumes the source run mounted (not those made since: the model's first view would differ)."""
        names = set(self.volumes.names())
        gone = [name for name in rerun.volumes if name not in names]
        if gone:
            emit("warning", {"message": f"volume(s) {', '.join(gone)} the recorded run mounted are gone"})
        return {name: self.volumes.path(name) for name in rerun.volumes if name in names}

    async def _finish(
        self,
        run_id: str,
        ctx: RunContext | None,
        status: str,
        answer: str | None,
        stop_reason: str | None,
        error: str | None,
        started: float,
    ) -> None:
        """Record the final row and run.finished (one transaction); both are durable when this returns.

        A full disk is waited out for a while (``_FULL_RETRIES``); past that the run's followers see it
        end, waiting for it raises ``StoreFull``, and it is recorded failed once the store writes again."""
        store = self._require_store()
        usage = ctx.usage_report() if ctx else {}
        iterations = ctx.iterations if ctx else 0
        llm_calls = ctx.budget.llm_calls if ctx else 0
        finished = time.time()
        fields = {
            "status": status, "answer": answer, "stop_reason": stop_reason, "error": error, "usage": usage,
            "iterations": iterations, "llm_calls": llm_calls, "finished_at": finished,
        }  # fmt: skip
        data = {
            "status": status, "answer": answer, "stop_reason": stop_reason, "error": error, "usage": usage,
            "iterations": iterations, "llm_calls": llm_calls, "seconds": round(finished - started, 3),
        }  # fmt: skip
        full: StoreFull | None = None
        try:
            for pause in (0.0, *_FULL_RETRIES):
                if pause:
                    await asyncio.sleep(pause)
                try:
                    # Queued at once (a cancel landing here cannot leave it out) and shielded.
                    await store.write(_record_end, store, run_id, fields, data)
                    return
                except StoreFull as exc:
                    if full is None:
                        log.warning("%s; run %s ended (%s): trying again to record it", exc, run_id, status)
                    full = exc
        except asyncio.CancelledError:  # the engine closes while the disk is full
            if full is not None:
                self._record_later(run_id, fields, data, full)
            raise
        assert full is not None
        self._record_later(run_id, fields, data, full)

    def _record_later(self, run_id: str, fields: dict[str, Any], data: dict[str, Any], full: StoreFull) -> None:
        """End the run for its followers now and record it failed once the store can be written again."""
        error = _FULL_DISK_END.format(status=fields["status"])
        where = self.store.path.parent if self.store else self.settings.home
        end = Unrecorded(
            fields={**fields, "status": "failed", "error": error},
            data={**data, "status": "failed", "error": error},
            error=StoreFull(
                f"the store's disk is full: run {run_id} ended ({fields['status']}) but could not be recorded;"
                f" free space on the disk of {where}"
            ),
        )
        self._unrecorded[run_id] = end
        if self.bus is not None:
            self.bus.end_unstored(run_id, end.data)
        log.info("%s: run %s is recorded failed once the store can be written again", full, run_id)
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.create_task(self._record_when_possible(), name="record runs' ends")

    async def _record_when_possible(self) -> None:
        pause = _RECORD_LATER[0]
        while self._unrecorded:
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RECORD_LATER[1])
            await self._record_unrecorded_once()

    async def _record_unrecorded_once(self) -> bool:
        """Try to record every unrecorded run's end; False while the store still refuses."""
        store = self.store
        for run_id, end in list(self._unrecorded.items()):
            if store is None:
                return False
            try:
                if await store.write(_record_end, store, run_id, end.fields, end.data, only_active=True):
                    log.warning("run %s is recorded failed: the store's disk was full when it ended", run_id)
            except StoreError:  # still full (or locked by another process): the next round
                return False
            except Exception:  # the run is gone (deleted): nothing to record
                log.warning("run %s's end could not be recorded", run_id, exc_info=True)
            self._unrecorded.pop(run_id, None)
        return True

    # -- sessions ------------------------------------------------------------------------------

    async def open_session(self, name: str | None = None) -> str:
        session_id = new_id("s")
        self._require_store().sessions.create(session_id, name=name)
        await self._session(session_id)
        return session_id

    async def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            # The REPL's own folder, inside a host-only session folder.
            session = Session(session_id, self.settings.work_root / session_id / "repl")
            # Runs from an earlier process: their REPL state did not survive it.
            session.lost_state = bool(self._require_store().runs.list(session_id=session_id, limit=2)[1:])
            self._sessions[session_id] = session
        box = session.sandbox
        died = box is not None and session.started and not box.alive
        if box is None or died:
            session.lost_state = session.lost_state or died
            spec = sandbox_spec(self.settings, session.work_dir, self.mounted_volumes())
            session.sandbox = create_sandbox(self.settings, spec)
            session.has_context = session.started = False
        self._require_store().sessions.touch(session_id)
        return session

    def mounted_volumes(self, only: str | None = None) -> dict[str, Path]:
        """The volumes a sandbox sees: the one asked for (created if new), else all of them."""
        if only:
            return {only: self.volumes.ensure(only)}
        return {name: self.volumes.path(name) for name in self.volumes.names()}

    async def _drop_sandbox(self, session: Session) -> None:
        if session.sandbox is not None:
            await session.sandbox.shutdown()
            session.sandbox = None
            session.has_context = False

    async def _discard(self, session: Session) -> None:
        """Stop a session's REPL and remove its scratch folder (the store row is untouched)."""
        await self._drop_sandbox(session)
        await asyncio.to_thread(shutil.rmtree, session.work_dir.parent, ignore_errors=True)

    async def close_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            await self._discard(session)
        if self.store is not None:
            self.store.sessions.close(session_id)

    async def _reap_idle_sessions(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, self.settings.session_idle_seconds))
            now = time.monotonic()
            for sid, session in list(self._sessions.items()):
                if not session.lock.locked() and now - session.last_used > self.settings.session_idle_seconds:
                    log.info("closing idle session %s", sid)
                    await self.close_session(sid)


def _record_end(
    store: Store, run_id: str, fields: dict[str, Any], data: dict[str, Any], *, only_active: bool = False
) -> bool:
    """On the store's writer thread, in one transaction: the run's final row and its run.finished.
    ``only_active``: not if the run has ended meanwhile (a late try of a write that got through)."""
    if only_active:
        rows = store.read("SELECT status FROM runs WHERE id = ?", (run_id,))
        if not rows or rows[0][0] not in ACTIVE_STATUSES:
            return False
    store.runs.update(run_id, **fields)
    store.runs.append_event(run_id, RUN_FINISHED, data)
    return True
