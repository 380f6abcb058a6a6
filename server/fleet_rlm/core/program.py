"""The RLM program: a ``dspy.Module`` whose two predictors optimizers can tune.

``act`` writes the next code step from the REPL transcript; ``extract`` gives the best answer
when a budget runs out. The transcript is a ``dspy.History`` of (observation, reasoning, code)
turns, rendered by the chat adapter as alternating user/assistant messages, so every request
extends the previous one: the prompt is append-only and provider prefix caches hit.

Per-step cost matters on long runs (``python -m bench`` measures it through the CLI): the
adapter renders each turn and the system message once per run, and a root call takes dspy's
synchronous model path in one worker thread (see ``RootPredict``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from fleet_rlm.core.budget import BudgetExhausted
from fleet_rlm.core.types import NodeHost


class RLMAction(dspy.Signature):
    """You answer a query about a context too large to read at once, by writing Python code
    that runs in a persistent REPL. Variables persist between steps.

    Available in the REPL:
    - `context` (str): the full input. Several sources are concatenated with headers;
      `sources` lists them as {name, start, end} character offsets into `context`.
    - `query` (str): the question.
    - `llm_query(prompt) -> str`: ask a sub-model about a piece of text (it sees only the prompt;
      it can read roughly 100K characters at once).
    - `llm_query_batched(prompts) -> list[str]`: many sub-queries at once, run concurrently;
      a failed slot holds a string starting with "[ERROR]".
    - `rlm_query(prompt, context=None) -> str`: hand a hard sub-problem to a child RLM with its own
      REPL (its `query` is `prompt`, its `context` is `context`); `rlm_query_batched(prompts,
      contexts=None) -> list[str]` runs several children concurrently.
    - `volumes` (dict): name -> folder of each mounted volume, with durable `memory/`, `artifacts/`,
      `buffers/` and `meta/` subfolders; files written there outlive the run.
    - `SUBMIT(answer)`: end with the final answer. Only call it after you have seen the evidence.

    Work in small steps: look at the data's shape first (lengths, a few lines), locate with string
    operations or regular expressions, use sub-queries for meaning, aggregate in Python, then
    SUBMIT. Print what you need to see; both printed output and the value of a last-line
    expression are shown, truncated in the middle if long. Never print the whole context."""

    observation: str = dspy.InputField(desc="What the REPL showed after your last code, or the task at the start.")
    history: dspy.History = dspy.InputField(desc="Earlier steps.")
    reasoning: str = dspy.OutputField(desc="What you learned and what you do next, briefly.")
    code: str = dspy.OutputField(desc="Python code to run next, in a ```python block.")

    @classmethod
    def delete(cls, name: str) -> Any:
        """The adapter drops the history field on every step; signatures are immutable, so cache it."""
        return _without_field(cls, name)


_BARE: dict[tuple[Any, str], Any] = {}  # (signature, field) -> the signature without it


def _without_field(signature: Any, name: str) -> Any:  # dspy has no types: its signatures are Any here
    key = (signature, name)
    if key not in _BARE:
        _BARE[key] = dspy.Signature.delete.__func__(signature, name)
    return _BARE[key]


class RLMExtract(dspy.Signature):
    """A budget ran out before the REPL work called SUBMIT. From the transcript of that work,
    give the best final answer to the query you can support with what the REPL showed. Say
    plainly if the evidence is incomplete."""

    query: str = dspy.InputField()
    transcript: str = dspy.InputField(desc="The steps taken: reasoning, code and output.")
    answer: str = dspy.OutputField()


@dataclass
class Step:
    observation: str
    reasoning: str
    code: str


@dataclass
class NodeResult:
    answer: str | None
    status: str  # succeeded | failed
    stop_reason: str | None
    iterations: int
    steps: list[Step] = field(default_factory=list)


class TranscriptAdapter(dspy.ChatAdapter):
    """The chat adapter, rendering each transcript turn once per run.

    The transcript only grows; re-rendering every earlier turn on every step was the runtime's
    largest per-step cost (quadratic over a run). Rendered turns are reused by content.
    """

    def __init__(self) -> None:
        # No JSON fallback: a second, unbudgeted call per bad reply; the loop asks again instead.
        super().__init__(use_json_adapter_fallback=False)
        self._turns: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self._system: dict[tuple[Any, ...], str] = {}

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        """The same for every step of a run (about 0.3 ms to build), so built once per signature."""
        shape = (signature, signature.instructions, tuple(signature.fields))
        if shape not in self._system:
            self._system[shape] = super().format_system_message(signature)
        return self._system[shape]

    def format_conversation_history(
        self, signature: type[dspy.Signature], history_field_name: str, inputs: dict[str, Any]
    ) -> list[dict[str, Any]]:
        history = inputs.get(history_field_name)
        if history is None:
            plain: list[dict[str, Any]] = super().format_conversation_history(signature, history_field_name, inputs)
            return plain
        shape = (signature.instructions, tuple(signature.fields))
        messages: list[dict[str, Any]] = []
        for turn in history.messages:
            key = (shape, tuple(turn.items()))
            if key not in self._turns:
                one = {history_field_name: dspy.History(messages=[turn])}
                self._turns[key] = super().format_conversation_history(signature, history_field_name, one)
            messages.extend(self._turns[key])
        del inputs[history_field_name]
        return messages

    def format_demos(self, signature: type[dspy.Signature], demos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A demo carrying a transcript (an optimizer's whole successful run: its earlier steps as
        ``history``, then its last step) is shown as that run's turns; other demos as dspy does."""
        name = self._get_history_field_name(signature)
        whole = [d for d in demos if name and d.get(name) is not None]
        messages: list[dict[str, Any]] = super().format_demos(
            signature, [d for d in demos if not (name and d.get(name) is not None)]
        )
        if not whole:
            return messages
        bare = _without_field(signature, name)
        for demo in whole:
            history = demo[name]
            turns = history.messages if isinstance(history, dspy.History) else history.get("messages", [])
            for index, turn in enumerate([*turns, {k: demo[k] for k in bare.fields if k in demo}]):
                prefix = TRAJECTORY_DEMO if index == 0 else ""
                messages.append({"role": "user", "content": self.format_user_message_content(bare, turn, prefix)})
                messages.append({"role": "assistant", "content": self.format_assistant_message_content(bare, turn)})
        return messages


TRAJECTORY_DEMO = "An example: a whole earlier run of this task that found the right answer, step by step."


FORMAT_HELP = (
    "Error: your last reply could not be read. Reply with the fields [[ ## reasoning ## ]] and "
    "[[ ## code ## ]] (Python in a ```python block), then [[ ## completed ## ]]."
)

_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The code inside the reply's fences (python, py or untagged), or the bare reply."""
    blocks = _FENCE.findall(text or "")
    if not blocks:
        return (text or "").strip()
    wrong = {tag for tag, _ in blocks if tag.lower() not in {"", "python", "py", "python3"}}
    if wrong:
        raise SyntaxError(f"code fenced as {', '.join(sorted(wrong))}; write Python in a ```python block")
    return "\n".join(body.strip("\n") for _, body in blocks)


# Root calls block a thread each for one model call; sized for every node of a few concurrent
# runs stepping at once (beyond it they queue). Kept apart from asyncio's default executor, whose
# few threads dspy's own async calls (the sub-queries) hop through.
_ROOT_CALLS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="fleet-root-lm")


class RootPredict(dspy.Predict):
    """A ``dspy.Predict`` whose async call runs the synchronous model path in one worker thread.

    dspy 3.4's async LM path hops through worker threads four times per call (capability
    planning, request preparation, routing, pricing); one hop around the synchronous path
    costs about 1.5-2 ms less per step on a 2-core machine, which is most of a step when the
    model answers quickly. Context variables (dspy settings, usage metering) travel with the
    call. A cancelled step stops waiting at once; its model call finishes in the thread and
    is discarded.
    """

    async def acall(self, *args: Any, **kwargs: Any) -> dspy.Prediction:
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_ROOT_CALLS, functools.partial(context.run, self, *args, **kwargs))


class RLMProgram(dspy.Module):
    """The recursive loop. One instance serves the root and every child node of a run."""

    def __init__(self) -> None:
        super().__init__()
        self.act = RootPredict(RLMAction)
        self.extract = RootPredict(RLMExtract)

    async def aforward(self, runtime: NodeHost) -> NodeResult:
        steps: list[Step] = []
        observation = runtime.opening_observation()
        stop_reason: str | None = None
        for index in range(runtime.max_iters):
            try:
                runtime.budget.reserve(1)
                action = await runtime.predict(
                    self.act, step=index + 1, observation=observation, history=_history(steps)
                )
            except BudgetExhausted as exc:
                stop_reason = exc.reason
                break
            except AdapterParseError as exc:  # a malformed reply costs a step, not the run
                reply = str(exc.lm_response or "")[:2000]
                runtime.warn(f"step {index + 1}: the model's reply did not follow the format")
                steps.append(Step(observation, "(unparseable reply)", reply))
                observation = FORMAT_HELP + "\n\n" + runtime.status_line(index + 2)
                continue
            outcome = await runtime.execute(action.code, step=index + 1)
            steps.append(Step(observation, action.reasoning, action.code))
            if outcome.final is not None:
                return NodeResult(outcome.final, "succeeded", None, index + 1, steps)
            observation = outcome.shown + "\n\n" + runtime.status_line(index + 2)
        else:
            stop_reason = f"step limit of {runtime.max_iters} reached"
        answer = await self._extract(runtime, steps, observation, stop_reason or "budget exhausted")
        status = "succeeded" if answer is not None else "failed"
        return NodeResult(answer, status, stop_reason, len(steps), steps)

    async def _extract(self, runtime: NodeHost, steps: list[Step], last_observation: str, reason: str) -> str | None:
        """Best answer from the work so far; one extra model call beyond the budget."""
        runtime.warn(f"{reason}; extracting the best answer from {len(steps)} steps")
        shown = [s.observation for s in steps[1:]] + [last_observation]
        transcript = "\n\n".join(
            f"Step {i}\nReasoning: {s.reasoning}\nCode:\n{s.code}\nThen the REPL showed:\n{out}"
            for i, (s, out) in enumerate(zip(steps, shown, strict=True), start=1)
        )
        try:
            result = await runtime.predict(
                self.extract, step=len(steps) + 1, final=True, query=runtime.query_preview(), transcript=transcript
            )
        except Exception as exc:  # an unreachable model must not hide the stop reason
            runtime.warn(f"extraction failed: {exc}")
            return None
        return str(result.answer)


def _history(steps: list[Step]) -> dspy.History:
    return dspy.History(
        messages=[{"observation": s.observation, "reasoning": s.reasoning, "code": s.code} for s in steps]
    )
