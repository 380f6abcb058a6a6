"""The RLM program: a ``dspy.Module`` whose two predictors optimizers can tune.

``act`` writes the next code step from the run's transcript; ``extract`` gives the best answer
when a budget runs out. The transcript is one text that only grows: the task, then per step the
reasoning, the code and what the REPL showed. It is the last field of the request, so request
*k* is, up to the closing format reminder, a prefix of request *k+1* and provider prefix caches
hit.

Per-step cost matters on long runs (``python -m bench`` measures it through the CLI): the
transcript is extended, never re-rendered; it travels as one message, because dspy's model
client spends about 14 µs per message per call, which a turn-per-message prompt pays on every
earlier step; the system message is built once per run; and a root call takes dspy's
synchronous model path in one worker thread (see ``RootPredict``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from fleet_rlm.core import replies
from fleet_rlm.core.budget import BudgetExhausted
from fleet_rlm.types import NodeHost


class RLMAction(dspy.Signature):
    """You answer a query about a context too large to read at once, by writing Python code
    that runs in a persistent REPL. Variables persist between steps.

    Available in the REPL:
    - `context` (str): the full input. Several sources are concatenated with headers;
      `sources` lists them as {name, start, end} character offsets into `context`.
    - `query` (str): the question.
    - `llm_query(prompt, images=None) -> str`: ask a sub-model about a piece of text (it sees only the
      prompt; it can read roughly 100K characters at once); `images` is a list of up to 8 images it
      sees too: names of `sources` entries of kind "image", or bytes (PNG, JPEG, GIF, WebP).
    - `llm_query_batched(prompts, images=None) -> list[str]`: many sub-queries at once, run
      concurrently (`images`: one list per prompt); a failed slot holds a string starting with "[ERROR]".
    - `rlm_query(prompt, context=None) -> str`: hand a hard sub-problem to a child RLM with its own
      REPL (its `query` is `prompt`, its `context` is `context`); `rlm_query_batched(prompts,
      contexts=None) -> list[str]` runs several children concurrently.
    - `volumes` (dict): name -> folder of each mounted volume, with durable `memory/`, `artifacts/`,
      `buffers/` and `meta/` subfolders; files written there outlive the run.
    - tools, when the opening observation lists some: plain functions (`server.tool(arg=...)`,
      `name(...)`) run on the host, returning Python values; a failed or refused call raises.
    - `SUBMIT(answer)`: end with the final answer. Only call it after you have seen the evidence.

    Work in small steps: look at the data's shape first (lengths, a few lines), locate with string
    operations or regular expressions, use sub-queries for meaning, aggregate in Python, then
    SUBMIT. Print what you need to see; both printed output and the value of a last-line
    expression are shown, truncated in the middle if long. Never print the whole context."""

    transcript: str = dspy.InputField(
        desc="The task, then each step so far (your reasoning and code, then what the REPL showed); the newest is last."
    )
    reasoning: str = dspy.OutputField(desc="What you learned and what you do next, briefly.")
    code: str = dspy.OutputField(desc="Python code to run next, in a ```python block.")


class RLMExtract(dspy.Signature):
    """A budget ran out before the REPL work called SUBMIT. From the transcript of that work,
    give the best final answer to the query you can support with what the REPL showed. Say
    plainly if the evidence is incomplete."""

    query: str = dspy.InputField()
    transcript: str = dspy.InputField(desc="The task, then each step taken: reasoning, code and output.")
    answer: str = dspy.OutputField()


@dataclass
class Step:
    observation: str
    reasoning: str
    code: str


@dataclass
class NodeResult:
    answer: str | None
    status: str  # succeeded | partial (answer extracted after a budget stop) | failed
    stop_reason: str | None
    iterations: int
    steps: list[Step] = field(default_factory=list)


STEP_HEADER = "\n\n=== Step "  # opens each step in the transcript; core.lm marks prompt-cache breaks at it


def render_step(number: int, step: Step, shown: str) -> str:
    """One step as the transcript shows it: what was written, then what the REPL showed."""
    return f"{STEP_HEADER}{number} ===\nReasoning: {step.reasoning}\nCode:\n{step.code}\nOutput:\n{shown}"


def render_transcript(steps: list[Step], observation: str) -> str:
    """The whole transcript: the first observation (the task), each step, and ``observation``,
    what the REPL showed after the last step (the same text the loop builds step by step)."""
    if not steps:
        return observation
    shown = [s.observation for s in steps[1:]] + [observation]
    turns = (render_step(i, s, out) for i, (s, out) in enumerate(zip(steps, shown, strict=True), start=1))
    return steps[0].observation + "".join(turns)


class TranscriptAdapter(dspy.ChatAdapter):
    """The chat adapter with the system message built once per signature (about 0.3 ms a step
    otherwise), reading every unambiguous form of a reply (``core.replies``: JSON, prose and one
    code block, tags), so no JSON fallback: that is a second, unbudgeted call per reply a model
    writes in JSON; a reply in no form is refused and the loop asks again."""

    def __init__(self) -> None:
        super().__init__(use_json_adapter_fallback=False)
        self._system: dict[tuple[Any, ...], str] = {}

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        shape = (signature, signature.instructions, tuple(signature.fields))
        if shape not in self._system:
            self._system[shape] = super().format_system_message(signature)
        return self._system[shape]

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
        try:  # the form asked for first: the common path costs what it always did
            fields: dict[str, Any] = super().parse(signature, completion)
        except AdapterParseError:
            other = replies.read_other_forms(signature, completion)
            if other is None:
                replies.note_form(replies.UNREADABLE)
                raise
            form, fields = other
        else:
            form = replies.header_form(completion)
        replies.note_form(form)
        return fields


FORMAT_HELP = (
    "Error: your last reply could not be read. Reply with the fields [[ ## reasoning ## ]] and "
    "[[ ## code ## ]] (Python in a ```python block), then [[ ## completed ## ]]."
)


def extract_code(text: str) -> str:
    """The code inside the reply's fences (python, py or untagged), or the bare reply."""
    blocks = replies.FENCE.findall(text or "")
    if not blocks:
        return (text or "").strip()
    wrong = {tag for tag, _ in blocks if tag.lower() not in replies.PYTHON_TAGS}
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

    def load_state(self, state: dict[str, Any]) -> RLMProgram:
        """A saved version's state; one made for another prompt layout is refused, not misapplied
        (DSPy would pair the saved field descriptions with the current fields by position)."""
        for name, predictor in self.named_predictors():
            saved = (state.get(name) or {}).get("signature", {}).get("fields")
            if saved is not None and len(saved) != len(predictor.signature.fields):
                raise ValueError(
                    f"this program version was made for an earlier prompt layout ({name} has {len(saved)} "
                    f"fields, now {len(predictor.signature.fields)}); roll back or optimize again"
                )
        super().load_state(state)
        return self

    async def aforward(self, runtime: NodeHost) -> NodeResult:
        steps: list[Step] = []
        observation = runtime.opening_observation()
        transcript = observation
        stop_reason: str | None = None
        # Compaction (core.compaction): each step as the transcript shows it, the steps folded so far
        # into ``summary``, and whether to go on compacting (not after a summary call failed).
        shown_steps: list[str] = []
        folded, summary, compacting = 0, "", True
        for index in range(runtime.max_iters):
            try:
                if compacting and len(shown_steps) - 1 > folded and runtime.over_window(transcript):
                    compacted = await runtime.compact(
                        transcript,
                        step=index + 1,
                        opening=steps[0].observation,
                        shown_steps=shown_steps,
                        folded=folded,
                        summary=summary,
                    )
                    if compacted is None:
                        compacting = False
                    else:
                        summary, transcript = compacted
                        folded = len(shown_steps) - 1
                runtime.budget.reserve(1)
                action = await runtime.predict(self.act, step=index + 1, transcript=transcript)
            except BudgetExhausted as exc:
                stop_reason = exc.reason
                break
            except AdapterParseError as exc:  # a malformed reply costs a step, not the run
                reply = str(exc.lm_response or "")[:2000]
                runtime.warn(f"step {index + 1}: the model's reply did not follow the format")
                steps.append(Step(observation, "(unparseable reply)", reply))
                observation = FORMAT_HELP + "\n\n" + runtime.status_line(index + 2)
                shown_steps.append(render_step(index + 1, steps[-1], observation))
                transcript += shown_steps[-1]
                continue
            outcome = await runtime.execute(action.code, step=index + 1)
            steps.append(Step(observation, action.reasoning, action.code))
            if outcome.final is not None:
                return NodeResult(outcome.final, "succeeded", None, index + 1, steps)
            observation = outcome.shown + "\n\n" + runtime.status_line(index + 2)
            shown_steps.append(render_step(index + 1, steps[-1], observation))
            transcript += shown_steps[-1]
        else:
            stop_reason = f"step limit of {runtime.max_iters} reached"
        answer = await self._extract(runtime, transcript, len(steps), stop_reason or "budget exhausted")
        status = "partial" if answer is not None else "failed"
        return NodeResult(answer, status, stop_reason, len(steps), steps)

    async def _extract(self, runtime: NodeHost, transcript: str, steps: int, reason: str) -> str | None:
        """Best answer from the work so far; one extra model call beyond the budget."""
        runtime.warn(f"{reason}; extracting the best answer from {steps} steps")
        try:
            result = await runtime.predict(
                self.extract, step=steps + 1, final=True, query=runtime.query_preview(), transcript=transcript
            )
        except Exception as exc:  # an unreachable model must not hide the stop reason
            runtime.warn(f"extraction failed: {exc}")
            return None
        return str(result.answer)
