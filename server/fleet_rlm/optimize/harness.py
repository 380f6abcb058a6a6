"""The module DSPy's optimizers tune: a dataset row (question, context) in, the Engine's answer out.

The RLM program's loop takes a node runtime, not an example, so ``RLMHarness`` wraps it: its
``forward`` replays the row as a new run through the same Engine, sandbox and budgets as any run
(an ``eval`` run whose parent is the optimization), with the candidate program (``program``, the
predictors ``program.act`` and ``program.extract`` the optimizers change). Nothing recorded is
reused as an answer, except an earlier replay of the same candidate on the same row within the
same optimization lineage (the evaluation cache, so a rerun after a crash skips finished work).

Optimizers call ``forward`` from a worker thread; the replay runs on the Engine's event loop.
A whole successful run is handed to DSPy's trace as one ``act`` call (its last step, with every
earlier step in its transcript): BootstrapFewShot turns it into a demo, GEPA reflects on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import dspy

from fleet_rlm.core.engine import Replay
from fleet_rlm.core.program import RLMProgram, Step, render_transcript
from fleet_rlm.optimize.datasets import example_key
from fleet_rlm.optimize.versions import fingerprint, program_state
from fleet_rlm.types import OPTIMIZE_EVAL, RunRequest

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.node import NodeRuntime
    from fleet_rlm.core.program import NodeResult
    from fleet_rlm.optimize.metrics import Metric


class Stopped(Exception):
    """The optimization was cancelled or reached its cap: every further replay refuses at once."""


@dataclass
class Outcome:
    run_id: str | None
    answer: str | None
    steps: list[dict[str, str]]
    submitted: bool
    llm_calls: int
    cost: float | None
    cached: bool


@dataclass
class Tally:
    """Counters of one optimization's replays, read by the runner for its summary."""

    evaluations: int = 0
    cached: int = 0
    llm_calls: int = 0
    cost: float = 0.0
    trials: dict[str, dict[str, Any]] = field(default_factory=dict)  # candidate hash -> {trial, sum, n}


class _Recorder:
    """Hands the run's program calls on, keeping the root node's result (its steps)."""

    def __init__(self, program: RLMProgram) -> None:
        self.program = program
        self.root: NodeResult | None = None

    async def aforward(self, runtime: NodeRuntime) -> NodeResult:
        result = await self.program.aforward(runtime)
        if runtime.depth == 0:
            self.root = result
        return result


class Replayer:
    """One optimization's way into the Engine: replays, the cache, the counters, the stop switch.

    Shared (never copied) by every copy of the harness an optimizer makes."""

    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        *,
        optimization_id: str,
        lineage: str,
        limits: dict[str, Any],
        cap_llm_calls: int | None = None,
        cap_cost: float | None = None,
    ) -> None:
        self.engine = engine
        self.loop = loop
        self.optimization_id = optimization_id
        self.lineage = lineage
        self.limits = limits
        self.cap_llm_calls = cap_llm_calls
        self.cap_cost = cap_cost
        self.tally = Tally()
        self.stop_reason: str | None = None
        self.active: set[str] = set()  # replay runs in progress (the runner cancels them on stop)
        self._cancelling: set[str] = set()
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> Replayer:
        return self

    def __copy__(self) -> Replayer:
        return self

    def stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    # -- on the optimizer's thread ------------------------------------------------------------

    def answer(self, program: RLMProgram, question: str, context_text: str | None, paths: list[str]) -> dspy.Prediction:
        if self.stop_reason:
            raise Stopped(self.stop_reason)
        store = self.engine.workspace.store
        candidate = fingerprint(program_state(program))
        example = example_key(question, context_text, paths)
        hit = store.optimize.cached_eval(self.lineage, candidate, example)
        if hit is not None:
            outcome = Outcome(hit.run_id, hit.answer, hit.steps or [], bool(hit.steps), hit.llm_calls, hit.cost,
                              cached=True)  # fmt: skip
        else:
            self._check_cap()
            replay = self._replay(program, candidate, question, context_text, paths)
            try:  # an empty context: the optimizer's dspy settings (its trace) stay out of the run
                outcome = contextvars.Context().run(asyncio.run_coroutine_threadsafe, replay, self.loop).result()
            except concurrent.futures.CancelledError:
                raise Stopped(self.stop_reason or "cancelled") from None
            if self.stop_reason:  # cancelled mid-replay: its answer is not an evaluation
                raise Stopped(self.stop_reason)
            # Steps are kept for submitted runs only (they are the demos): "has steps" means submitted.
            store.submit(store.optimize.cache_eval, self.lineage, candidate, example, run_id=outcome.run_id,
                         answer=outcome.answer, steps=outcome.steps if outcome.submitted else [],
                         llm_calls=outcome.llm_calls, cost=outcome.cost).result()  # fmt: skip
        with self._lock:
            self.tally.llm_calls += 0 if outcome.cached else outcome.llm_calls
            self.tally.cost += 0.0 if outcome.cached or outcome.cost is None else outcome.cost
        self._trace(program, outcome)
        return dspy.Prediction(answer=outcome.answer or "", run_id=outcome.run_id, cached=outcome.cached,
                               candidate=candidate, example=example, submitted=outcome.submitted)  # fmt: skip

    def _check_cap(self) -> None:
        if self.cap_llm_calls is not None and self.tally.llm_calls >= self.cap_llm_calls:
            self.stop(f"the cap of {self.cap_llm_calls} model calls was reached")
        elif self.cap_cost is not None and self.tally.cost >= self.cap_cost:
            self.stop(f"the cap of {self.cap_cost:g} USD was reached")
        if self.stop_reason:
            raise Stopped(self.stop_reason)

    def _trace(self, program: RLMProgram, outcome: Outcome) -> None:
        """A submitted run, whole, as one ``act`` call in DSPy's trace (when an optimizer traces)."""
        trace = dspy.settings.trace
        if trace is None or not outcome.submitted or not outcome.steps:
            return
        *earlier, last = outcome.steps
        inputs = {"transcript": render_transcript([Step(**s) for s in earlier], last["observation"])}
        trace.append((program.act, inputs, dspy.Prediction(reasoning=last["reasoning"], code=last["code"])))

    def record(self, prediction: dspy.Prediction, score: float, feedback: str) -> None:
        """Count a scored evaluation and publish it (the faces draw the score chart from these)."""
        with self._lock:
            tally = self.tally
            tally.evaluations += 1
            tally.cached += bool(prediction.cached)
            trial = tally.trials.setdefault(prediction.candidate, {"trial": len(tally.trials) + 1, "sum": 0.0, "n": 0})
            trial["sum"] += score
            trial["n"] += 1
            data = {
                "trial": trial["trial"], "candidate": prediction.candidate[:12], "example": prediction.example[:12],
                "score": score, "feedback": feedback[:1000], "run_id": prediction.run_id,
                "cached": bool(prediction.cached), "evaluations": tally.evaluations, "llm_calls": tally.llm_calls,
            }  # fmt: skip
        assert self.engine.bus is not None
        self.engine.bus.publish(self.optimization_id, OPTIMIZE_EVAL, data)

    # -- on the engine's loop -----------------------------------------------------------------

    async def _replay(
        self, program: RLMProgram, candidate: str, question: str, context_text: str | None, paths: list[str]
    ) -> Outcome:
        recorder = _Recorder(program)
        req = RunRequest(question, context_text=[context_text] if context_text else [], context_paths=paths,
                         **self.limits)  # fmt: skip
        replay = Replay(program=recorder, version=f"candidate:{candidate[:12]}", parent=self.optimization_id)
        run_id = await self.engine.start_run(req, replay=replay)
        self.active.add(run_id)
        try:
            if self.stop_reason:  # stopped while this one was starting: the wind-down may have missed it
                await self.cancel_run(run_id)
            result = await self.engine.wait(run_id)
        finally:
            self.active.discard(run_id)
        steps: list[Step] = recorder.root.steps if recorder.root else []
        cost = (result.usage.get("total") or {}).get("cost")
        return Outcome(
            run_id=run_id,
            answer=result.answer,
            steps=[asdict(s) for s in steps],
            submitted=result.status == "succeeded" and result.stop_reason is None,
            llm_calls=result.llm_calls,
            cost=cost,
            cached=False,
        )

    async def cancel_active(self) -> None:
        """Cancel the replays in flight (after ``stop``, so no new one starts)."""
        for run_id in list(self.active):
            await self.cancel_run(run_id)

    async def cancel_run(self, run_id: str) -> None:
        """Cancel a replay once (the wind-down and the replay itself may both ask)."""
        if run_id in self._cancelling:
            return
        self._cancelling.add(run_id)
        await asyncio.sleep(0)  # a run task created just now takes its first step (and records it) first
        await self.engine.cancel(run_id)


class RLMHarness(dspy.Module):
    """``forward(question, context_text, context_paths)`` replays a row with ``self.program``."""

    def __init__(self, replayer: Replayer, program: RLMProgram | None = None) -> None:
        super().__init__()
        self.program = program or RLMProgram()
        self.replayer = replayer

    def forward(
        self, question: str, context_text: str | None = None, context_paths: list[str] | None = None
    ) -> dspy.Prediction:
        return self.replayer.answer(self.program, question, context_text, list(context_paths or []))


Mode = Literal["score", "feedback", "demo"]


class DspyMetric:
    """A metric as each optimizer wants it: a float (``score``: evaluation, MIPROv2), a score with
    feedback text (``feedback``: GEPA), or "is this run a demo" (``demo``: BootstrapFewShot: right,
    and submitted). Module-level calls are counted and published once each."""

    def __init__(self, metric: Metric, replayer: Replayer, mode: Mode) -> None:
        self.metric = metric
        self.replayer = replayer
        self.mode = mode

    def __call__(
        self,
        gold: dspy.Example,
        pred: dspy.Prediction,
        trace: Any = None,
        pred_name: Any = None,
        pred_trace: Any = None,
    ) -> Any:
        result = self.metric(gold.answer, pred.get("answer"), gold.question)
        if pred_name is None:  # GEPA asks again per predictor for feedback: not another evaluation
            self.replayer.record(pred, result.score, result.feedback)
        if self.mode == "feedback":
            return dspy.Prediction(score=result.score, feedback=result.feedback)
        if self.mode == "demo":
            return result.score >= 1.0 and bool(pred.get("submitted"))
        return result.score
