"""Optimizations in the background: a DSPy optimizer (GEPA, MIPROv2, BootstrapFewShot) over the
RLM program, on a dataset, yielding a program version with scores before and after.

An optimization is a run-like stream: a ``runs`` row of kind ``optimize`` under its id (its status,
owner process, and ``interrupted`` if that process dies) and an event log on the same bus as runs
(``optimize.started``, ``optimize.eval`` per replay, ``optimize.scored``, ``optimize.finished``,
then ``run.finished``). It runs as an Engine task (``engine.cancel(id)`` stops it, as does closing
the engine); the optimizer itself runs in a worker thread, each replay on the Engine's loop.

The steps: score the base program on train and holdout; compile; score the candidate on both;
save the version. A rerun (``resume``) shares the earlier attempt's lineage: its evaluation cache
(every finished replay is skipped) and GEPA's own saved state (GEPA resumes; BootstrapFewShot and
MIPROv2 restart with the cache warm).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_rlm.errors import Conflict, FleetError, UserError
from fleet_rlm.optimize import datasets, versions
from fleet_rlm.optimize.metrics import get_metric
from fleet_rlm.optimize.views import BUILTIN, Estimate, OptimizationList, OptimizationState, Scores
from fleet_rlm.store import Dataset, DatasetRow, Optimization, ProgramVersion, RunRecord
from fleet_rlm.types import (
    ACTIVE_STATUSES,
    OPTIMIZE_FINISHED,
    OPTIMIZE_SCORED,
    OPTIMIZE_STARTED,
    RUN_FINISHED,
    RUN_STARTED,
)

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.optimize.harness import Replayer
    from fleet_rlm.store import Store

log = logging.getLogger(__name__)
OPTIMIZERS = ("gepa", "mipro", "bootstrap")
DEFAULT_METRIC = "normalised"
THREADS = 4  # replays in flight at once
MAX_DEMOS = 3


@dataclass
class OptimizeRequest:
    """What a face asks for; see docs/optimization.md. ``trials``: GEPA full evaluations of the
    train split (default 4), MIPROv2 trials (default 4); unused by bootstrap."""

    dataset: str
    optimizer: str
    metric: str = DEFAULT_METRIC
    base_version: str | None = None  # default: the active version
    trials: int | None = None
    max_llm_calls: int | None = None  # cap over all replays
    max_cost: float | None = None
    seed: int = 0
    limits: dict[str, Any] = field(default_factory=dict)  # per replay: max_iters, max_llm_calls, ...
    resume: str | None = None  # an earlier optimization to continue (its settings, its cache)

    def check(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"unknown optimizer '{self.optimizer}': use one of {', '.join(OPTIMIZERS)}")
        for name in ("trials", "max_llm_calls"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"{name} must be a whole number of 1 or more, not {value!r}")
        if self.max_cost is not None and not self.max_cost > 0:
            raise UserError(f"max_cost must be more than 0, not {self.max_cost}")


def _evaluations(req: OptimizeRequest, train: int, holdout: int) -> int:
    """Replays at most (before and after on both splits, plus the optimizer's own)."""
    scoring = 2 * (train + holdout)
    trials = req.trials or 4
    if req.optimizer == "bootstrap":
        return scoring + train
    if req.optimizer == "gepa":
        return scoring + trials * train
    return scoring + MAX_DEMOS * train + trials * train  # mipro: bootstrapped demo sets, then trials


def estimate(engine: Engine, req: OptimizeRequest, train: int, holdout: int) -> Estimate:
    """Calls and cost at most, before starting: replays times the per-replay call budget; cost where
    the per-run cost cap is set (LiteLLM prices alone cannot bound a run's tokens)."""
    evaluations = _evaluations(req, train, holdout)
    per_run_calls = int(req.limits.get("max_llm_calls") or engine.settings.max_llm_calls)
    proposals = 0 if req.optimizer == "bootstrap" else (req.trials or 4) * 2
    per_run_cost = req.limits.get("max_cost") or engine.settings.max_cost
    return Estimate(
        evaluations=evaluations,
        llm_calls=evaluations * per_run_calls + proposals,
        cost=round(evaluations * per_run_cost, 4) if per_run_cost else None,
        max_llm_calls=req.max_llm_calls,
    )


def _resumed(store: Store, req: OptimizeRequest) -> tuple[OptimizeRequest, str]:
    """The request to run and its lineage: a rerun takes the earlier attempt's settings and cache."""
    if req.resume is None:
        return req, ""
    earlier = store.optimize.get_optimization(req.resume)
    row = store.runs.get(req.resume)
    if earlier is None or row is None:
        raise UserError(f"no optimization '{req.resume}' to resume: list them with `fleet-rlm programs ls`")
    if row.status in ACTIVE_STATUSES:
        raise Conflict(f"optimization '{req.resume}' is still {row.status}: cancel it first")
    params = earlier.params or {}
    again = OptimizeRequest(**{**params, "resume": req.resume})
    return again, earlier.lineage


async def start(engine: Engine, req: OptimizeRequest) -> tuple[str, Estimate]:
    """Check the request, record the optimization and start it; its id and estimate, at once."""
    workspace = engine.workspace
    store = workspace.store
    req, lineage = _resumed(store, req)
    req.check()
    get_metric(req.metric, engine.settings)  # an unknown metric fails here, not in the thread
    dataset = datasets.require(workspace, req.dataset)
    if not dataset.train:
        raise UserError(f"dataset '{req.dataset}' has no train rows")
    base = req.base_version if req.base_version not in (None, BUILTIN) else None
    if req.base_version is None:
        base = versions.active(workspace)
    elif base is not None:
        versions.require(workspace, base)
    from fleet_rlm.core.engine import new_id
    from fleet_rlm.core.lm import preflight

    engine.validate(_probe(req.limits))  # the model, sandbox and per-replay limits, as a run would check them
    engine.check_cost_cap(req.max_cost)  # the cap over all replays adds up the same prices
    await preflight(*engine.models())
    guess = estimate(engine, req, dataset.train, dataset.holdout)
    opt_id = new_id("o")
    lineage = lineage or opt_id
    params = {k: v for k, v in asdict(req).items() if k != "resume"}
    await store.write(store.runs.create, RunRecord(
        id=opt_id, kind="optimize", question=f"optimize with {req.optimizer} on dataset {dataset.name}",
        status="running", request=params, created_at=time.time(), started_at=time.time(), owner_pid=os.getpid(),
        owner_host=socket.gethostname(), program_version=base,
    ))  # fmt: skip
    await store.write(store.optimize.create_optimization, Optimization(
        id=opt_id, lineage=lineage, dataset_id=dataset.id, optimizer=req.optimizer, metric=req.metric,
        base_version=base, params=params, version_id=None, scores={}, created_at=time.time(),
    ))  # fmt: skip
    assert engine.bus is not None
    engine.bus.publish(opt_id, RUN_STARTED, {"question": f"optimize {dataset.name} with {req.optimizer}",
                                             "limits": req.limits, "session_id": None})  # fmt: skip
    engine.bus.publish(opt_id, OPTIMIZE_STARTED, {
        "dataset": dataset.name, "optimizer": req.optimizer, "metric": req.metric, "base_version": base,
        "train": dataset.train, "holdout": dataset.holdout, "estimate": guess.model_dump(),
        "resumed_from": req.resume,
    })  # fmt: skip
    engine.start_task(opt_id, _run(engine, opt_id, lineage, req, dataset, base))
    return opt_id, guess


def _probe(limits: dict[str, Any]) -> Any:
    from fleet_rlm.types import RunRequest

    return RunRequest("optimization preflight", **limits)


async def _run(
    engine: Engine, opt_id: str, lineage: str, req: OptimizeRequest, dataset: Dataset, base: str | None
) -> None:
    from fleet_rlm.optimize.harness import Replayer, Stopped

    store = engine.workspace.store
    loop = asyncio.get_running_loop()
    replayer = Replayer(engine, loop, optimization_id=opt_id, lineage=lineage, limits=req.limits,
                        cap_llm_calls=req.max_llm_calls, cap_cost=req.max_cost)  # fmt: skip
    rows = store.optimize.dataset_rows(dataset.id)
    work_dir = engine.settings.home / "optimize" / lineage
    job = loop.run_in_executor(None, _optimize, engine, replayer, req, rows, base, work_dir)
    status, error, version_id, scores = "failed", None, None, Scores()
    try:
        program, scores = await asyncio.shield(job)
        version_id = await _save(engine.workspace, opt_id, dataset, req, base, program, scores)
        status = "succeeded"
    except asyncio.CancelledError:
        status, error = "cancelled", "cancelled by the user"
        await _wind_down(replayer, job, error)
    except Stopped as exc:
        status, error = ("cancelled" if "cancelled" in str(exc) else "failed"), str(exc)
    except FleetError as exc:
        error = exc.message
    except Exception as exc:
        log.debug("optimization %s failed", opt_id, exc_info=True)
        error = replayer.stop_reason or f"{type(exc).__name__}: {exc}"
    await _finish(engine, opt_id, status, error, version_id, scores, replayer)


async def _wind_down(replayer: Replayer, job: asyncio.Future[Any], reason: str) -> None:
    """Stop the optimizer thread: refuse new replays, cancel those in flight, wait for it to end."""
    replayer.stop(reason)
    await replayer.cancel_active()
    with contextlib.suppress(BaseException):
        await job


class _LibraryOutput(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` that takes what optimizer threads write (DSPy's progress bars
    and lines) away from the faces, which show the optimization's own events: to stderr while
    ``shown`` (stdout may be a protocol channel, MCP over stdio, or exactly one JSON object,
    ``--json``), else nowhere. Other threads write through."""

    quiet = threading.local()
    shown = True  # the CLI drops them unless --verbose: show_library_output()

    def __init__(self, original: Any, sink: Any) -> None:
        self.original = original
        self.sink = sink  # a stream installed before this one: a write never comes back up to it
        self.buffer = getattr(original, "buffer", None)  # binary writers (protocols) bypass us

    def write(self, text: str) -> int:
        if not getattr(self.quiet, "on", False):
            return int(self.original.write(text))
        return int(self.sink.write(text)) if self.shown else len(text)

    def flush(self) -> None:
        self.original.flush()

    def fileno(self) -> int:
        return int(self.original.fileno())

    def isatty(self) -> bool:
        return bool(self.original.isatty())

    @classmethod
    def install(cls) -> None:
        if not isinstance(sys.stderr, cls):
            sys.stderr = cls(sys.stderr, sink=sys.stderr)
        if not isinstance(sys.stdout, cls):
            sys.stdout = cls(sys.stdout, sink=sys.stderr)

    @classmethod
    @contextlib.contextmanager
    def on_this_thread(cls) -> Any:
        cls.install()
        cls.quiet.on = True
        try:
            yield
        finally:
            cls.quiet.on = False


def show_library_output(shown: bool) -> None:
    """Whether DSPy's log lines and progress bars reach stderr during optimizations (the CLI's
    ``--verbose``). Call it before optimizing: the streams are wrapped now, before a live progress
    display wraps them in turn, and DSPy, imported now, does not reset its logger's level later."""
    import dspy  # noqa: F401  (configures the "dspy" logger on import)

    _LibraryOutput.install()
    _LibraryOutput.shown = shown
    logging.getLogger("dspy").setLevel(logging.INFO if shown else logging.CRITICAL + 1)


@_LibraryOutput.on_this_thread()  # a fresh context for each call: what the optimizer prints is routed
def _optimize(
    engine: Engine,
    replayer: Replayer,
    req: OptimizeRequest,
    rows: list[DatasetRow],
    base: str | None,
    work_dir: Path,
) -> tuple[Any, Scores]:
    """On a worker thread: score the base, compile, score the candidate."""
    import dspy

    from fleet_rlm.core.program import RLMProgram
    from fleet_rlm.optimize.harness import RLMHarness

    metric = get_metric(req.metric, engine.settings)
    train, holdout = _examples(rows, "train"), _examples(rows, "holdout")
    program = RLMProgram()
    program.load_state(versions.state_of(engine.workspace, base))
    student = RLMHarness(replayer, program)
    root_lm = engine.models()[0]
    with dspy.context(lm=root_lm):
        before = _score(engine, replayer, metric, student, train, holdout, "before")
        compiled = _compile(req, replayer, metric, student, train, root_lm, work_dir)
        after = _score(engine, replayer, metric, compiled, train, holdout, "after")
    scores = Scores(train_before=before[0], holdout_before=before[1], train_after=after[0], holdout_after=after[1],
                    n_train=len(train), n_holdout=len(holdout))  # fmt: skip
    return compiled.program, scores


def _examples(rows: list[DatasetRow], split: str) -> list[Any]:
    import dspy

    return [
        dspy.Example(question=r.question, context_text=r.context_text, context_paths=r.context_paths or [],
                     answer=r.answer).with_inputs("question", "context_text", "context_paths")
        for r in rows if r.split == split
    ]  # fmt: skip


def _score(
    engine: Engine, replayer: Replayer, metric: Any, program: Any, train: list[Any], holdout: list[Any], which: str
) -> tuple[float, float | None]:
    """Mean scores on train and holdout, each published as ``optimize.scored``."""
    import dspy

    from fleet_rlm.optimize.harness import DspyMetric, Stopped

    out: list[float | None] = []
    for split, examples in (("train", train), ("holdout", holdout)):
        if not examples:
            out.append(None)
            continue
        evaluate = dspy.Evaluate(devset=examples, metric=DspyMetric(metric, replayer, "score"), num_threads=THREADS,
                                 display_progress=False, max_errors=len(examples) * 10, failure_score=0.0)  # fmt: skip
        result = evaluate(program)
        if replayer.stop_reason:
            raise Stopped(replayer.stop_reason)
        mean = round(sum(float(s or 0.0) for _, _, s in result.results) / len(examples), 4)
        assert engine.bus is not None
        engine.bus.publish(replayer.optimization_id, OPTIMIZE_SCORED,
                           {"split": split, "program": which, "score": mean, "n": len(examples)})  # fmt: skip
        out.append(mean)
    return out[0] or 0.0, out[1]


def _compile(
    req: OptimizeRequest, replayer: Replayer, metric: Any, student: Any, train: list[Any], lm: Any, work_dir: Path
) -> Any:
    import dspy

    from fleet_rlm.optimize.harness import DspyMetric

    trials = req.trials or 4
    if req.optimizer == "bootstrap":
        optimizer = dspy.BootstrapFewShot(metric=DspyMetric(metric, replayer, "demo"), max_bootstrapped_demos=MAX_DEMOS,
                                          max_labeled_demos=0, max_rounds=1, max_errors=len(train) * 10)  # fmt: skip
        return optimizer.compile(student, trainset=train)
    if req.optimizer == "gepa":
        optimizer = dspy.GEPA(
            metric=DspyMetric(metric, replayer, "feedback"), max_metric_calls=trials * len(train), reflection_lm=lm,
            reflection_minibatch_size=min(3, len(train)), use_merge=False, num_threads=THREADS, seed=req.seed,
            component_selector=_act_only, log_dir=str(work_dir / "gepa"), track_stats=False,
            gepa_kwargs={"stop_callbacks": [lambda _state: replayer.stop_reason is not None]},
        )  # fmt: skip
        return optimizer.compile(student, trainset=train, valset=train)
    optimizer = dspy.MIPROv2(
        metric=DspyMetric(metric, replayer, "score"), prompt_model=lm, task_model=lm, auto=None,
        num_candidates=max(2, trials // 2), max_bootstrapped_demos=MAX_DEMOS, max_labeled_demos=0,
        num_threads=THREADS, seed=req.seed, verbose=False, track_stats=False, metric_threshold=1.0,
        max_errors=len(train) * 10,
    )  # fmt: skip
    return optimizer.compile(student, trainset=train, valset=train, num_trials=trials, minibatch=False,
                             program_aware_proposer=False, data_aware_proposer=False)  # fmt: skip


def _act_only(state: Any, trajectories: Any, subsample_scores: Any, candidate_idx: int, candidate: Any) -> list[str]:
    """GEPA reflects on the step-writing predictor: whole runs are traced as ``act`` calls."""
    return ["program.act"]


async def _save(
    workspace: Workspace,
    opt_id: str,
    dataset: Dataset,
    req: OptimizeRequest,
    base: str | None,
    program: Any,
    scores: Scores,
) -> str:
    state = versions.program_state(program)
    version_id = versions.new_version_id()
    store = workspace.store
    await store.write(store.optimize.add_program_version, ProgramVersion(
        id=version_id, base_id=base, optimization_id=opt_id, dataset_id=dataset.id, optimizer=req.optimizer,
        metric=req.metric, scores=scores.model_dump(), state=state,
        changes=versions.changes(versions.state_of(workspace, base), state), created_at=time.time(),
    ))  # fmt: skip
    return version_id


async def _finish(
    engine: Engine,
    opt_id: str,
    status: str,
    error: str | None,
    version_id: str | None,
    scores: Scores,
    replayer: Replayer,
) -> None:
    store = engine.workspace.store
    bus = engine.bus
    assert bus is not None
    passed, why = versions.gate(scores) if version_id else (False, error or "no version")
    await store.write(store.optimize.update_optimization, opt_id, version_id=version_id, scores=scores.model_dump())
    row = store.runs.get(opt_id)
    started = row.started_at if row and row.started_at else time.time()
    finished = time.time()
    summary = f"version {version_id}: {why}" if version_id else None
    tally = replayer.tally
    final = store.submit(store.runs.update, opt_id, status=status, answer=summary, error=error, finished_at=finished,
                         llm_calls=tally.llm_calls, iterations=tally.evaluations)  # fmt: skip
    bus.publish(opt_id, OPTIMIZE_FINISHED, {"status": status, "version_id": version_id, "scores": scores.model_dump(
        exclude={"n_train", "n_holdout"}), "gate": {"passed": passed, "reason": why}, "error": error})  # fmt: skip
    bus.publish(opt_id, RUN_FINISHED, {
        "status": status, "answer": summary, "stop_reason": None, "error": error, "usage": {},
        "iterations": tally.evaluations, "llm_calls": tally.llm_calls, "seconds": round(finished - started, 3),
    })  # fmt: skip
    await bus.flush()
    final.result()


# -- the read side ------------------------------------------------------------------------------


def state(workspace: Workspace, opt_id: str) -> OptimizationState:
    """An optimization as it is now (status from its run row; trials folded from its events)."""
    store = workspace.store
    opt = store.optimize.get_optimization(opt_id)
    row = store.runs.get(opt_id)
    if opt is None or row is None:
        from fleet_rlm.errors import NotFound

        raise NotFound(f"no optimization '{opt_id}': list them with `fleet-rlm programs ls --optimizations`")
    trials: dict[int, dict[str, Any]] = {}
    evaluations = cached = 0
    gate: dict[str, Any] = {}
    for event in store.runs.events(opt_id):
        data = event["data"]
        if event["kind"] == "optimize.eval":
            evaluations, cached = evaluations + 1, cached + bool(data["cached"])
            t = trials.setdefault(data["trial"], {"trial": data["trial"], "candidate": data["candidate"], "sum": 0.0,
                                                  "evaluations": 0})  # fmt: skip
            t["sum"] += data["score"]
            t["evaluations"] += 1
        elif event["kind"] == OPTIMIZE_FINISHED:
            gate = data.get("gate") or {}
    return OptimizationState(
        id=opt_id, status=row.status, dataset=datasets.name_of(workspace, opt.dataset_id),
        optimizer=opt.optimizer, metric=opt.metric, base_version=opt.base_version,
        version_id=opt.version_id, scores=Scores(**(opt.scores or {})), gate=gate, error=row.error,
        evaluations=evaluations, cached=cached, created_at=opt.created_at, finished_at=row.finished_at,
        trials=[{"trial": t["trial"], "candidate": t["candidate"], "score": round(t["sum"] / t["evaluations"], 4),
                 "evaluations": t["evaluations"]} for t in sorted(trials.values(), key=lambda t: t["trial"])],
    )  # fmt: skip


def list_optimizations(workspace: Workspace, limit: int = 50) -> OptimizationList:
    found = workspace.store.optimize.list_optimizations(limit)
    return OptimizationList(optimizations=[state(workspace, o.id) for o in found])


async def wait(engine: Engine, opt_id: str) -> OptimizationState:
    """Follow the optimization's events until it ends; its final state."""
    async with contextlib.aclosing(engine.subscribe(opt_id)) as events:
        async for _event in events:
            pass
    return state(engine.workspace, opt_id)
