"""One RLM instance (the root or a child) inside a run: its sandbox, its host functions and
the events it emits. The loop itself lives in ``program.RLMProgram``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

import dspy
from dspy.utils.exceptions import (
    ContextWindowExceededError,
    LMAuthError,
    LMRateLimitError,
    LMTimeoutError,
    LMTransportError,
)

from fleet_rlm.core import compaction, tape
from fleet_rlm.core import images as images_of
from fleet_rlm.core.budget import BudgetExhausted
from fleet_rlm.core.context import StagedContext, preview
from fleet_rlm.core.lm import CallUsage, NoVision, explain_lm_error, metered
from fleet_rlm.core.program import extract_code
from fleet_rlm.core.replies import noting_reply_forms
from fleet_rlm.core.tools import reraise
from fleet_rlm.redaction import redact_text
from fleet_rlm.sandbox.base import Sandbox, cap_middle
from fleet_rlm.volumes import Volumes


class RunHost(Protocol):
    """What a node needs from its run (core.run.RunContext implements it); typed here, so node
    and run do not import each other."""

    settings: Any  # fleet_rlm.config.Settings
    limits: Any  # core.budget.Limits
    budget: Any  # core.budget.Budget, shared by every node of the run
    root_lm: Any
    sub_lm: Any
    adapter: Any
    subcall_gate: asyncio.Semaphore
    volume_store: Volumes | None  # volumes for quota trimming
    tape: tape.Tape | None  # the run's record (core.tape)

    def emit(self, kind: str, data: dict[str, Any], *, node: str, parent: str | None, depth: int) -> Any: ...

    def record_usage(self, usage: CallUsage) -> None: ...

    def count_reply_forms(self, forms: list[str]) -> None: ...

    def next_batch_id(self) -> int: ...

    def named_lm(self, name: Any) -> Any: ...

    async def child(
        self, parent: NodeRuntime, prompt: str, context: str | None, *, model: str | None = None
    ) -> str: ...


PREVIEW = 200
QUERY_PREVIEW = 2000


@dataclass
class Outcome:
    shown: str
    final: str | None


def _answer_text(final: dict[str, Any]) -> str:
    value = final.get("answer", final)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


class NodeRuntime:
    """What ``RLMProgram`` needs from its surroundings, for one node of a run."""

    def __init__(
        self,
        run: RunHost,
        *,
        node: str,
        parent: str | None,
        depth: int,
        query: str,
        sandbox: Sandbox,
        staged: StagedContext | None,
        origin: str = "",
        root_lm: Any = None,
    ) -> None:
        self.run = run
        self.root_lm = root_lm if root_lm is not None else run.root_lm  # rlm_query(model=NAME): a named one
        self.node = node
        self.parent = parent
        self.depth = depth
        self.query = query
        self.sandbox = sandbox
        self.staged = staged
        self.budget = run.budget
        self.max_iters = run.limits.max_iters
        # Where in the run each call is made, for its record (core.tape): the path of the parent's
        # step that started this node ("root#2>"), this node's step in progress, and the step's
        # sub-queries and host calls so far.
        self.origin = origin
        self.step = 0
        self._subs = 0
        self._calls = 0
        # Runs longer than a window (core.compaction): every step as {step, code, output}, also the REPL's
        # `history`; the models' windows (tokens; None: unknown, no compaction and no cap); the prompt's
        # tokens beyond its transcript, from the provider's count of the last step.
        self.history: list[dict[str, Any]] = []
        settings = run.settings
        own = compaction.context_window(getattr(self.root_lm, "model", None))  # a named model's, or the root's
        self.window: int | None = (settings.lm_context_window or own) if self.root_lm is run.root_lm else own
        self.sub_window: int | None = settings.sub_lm_context_window or compaction.context_window(
            getattr(run.sub_lm, "model", None)
        )
        self._overhead: int | None = None

    def step_path(self, step: int) -> str:
        return f"{self.origin}{self.node}#{step}"

    # -- host functions the sandbox code calls ------------------------------------------------

    def host_functions(self) -> dict[str, Any]:
        functions = {
            "llm_query": self.llm_query,
            "llm_query_batched": self.llm_query_batched,
            "rlm_query": self.rlm_query,
            "rlm_query_batched": self.rlm_query_batched,
        }
        kept = {name: self._kept(name, fn) for name, fn in functions.items()}
        box = getattr(self.run, "tools", None)  # MCP servers' tools and Python functions (core.tools)
        tools = box.functions(self.emit) if box is not None else {}
        return kept | {name: self._kept(name, fn, answered=True) for name, fn in tools.items()}

    def _kept(self, name: str, fn: Any, *, answered: bool = False) -> Any:
        """``fn`` with its result (or error, as the code sees it) kept in the run's record; ``answered``
        (a tool's): a replay, or a fork before its step, answers it from the record without calling it."""
        record = self.run.tape
        if record is None:
            return fn

        async def call(*args: Any, **kwargs: Any) -> Any:
            slot = f"{self.step_path(self.step)}/call{self._calls}"
            self._calls += 1
            recorded = record.host_answer(slot, name) if answered else None
            if recorded is not None:
                record.keep_host(slot, name, [args, kwargs], recorded)
                fn.replayed(recorded, args, kwargs)
                if "error" in recorded:
                    raise reraise(str(recorded["error"]))
                return recorded.get("value")
            try:
                value = await fn(*args, **kwargs)
            except Exception as exc:
                record.keep_host(slot, name, [args, kwargs], {"error": redact_text(f"{type(exc).__name__}: {exc}")})
                raise
            record.keep_host(slot, name, [args, kwargs], {"value": value})
            return value

        return call

    async def llm_query(self, prompt: str, images: list[Any] | None = None, model: str | None = None) -> str:
        """One sub-model call, with ``images`` (source names or bytes, ``core.images``) as image parts, by
        the sub model or the named model ``model`` (settings.models); a refused prompt, image list or model
        name raises ValueError/TypeError, a failed call RuntimeError."""
        lm = self._sub_lm(model)
        refusal = self._prompt_refusal(prompt, lm)
        if refusal:
            raise ValueError(refusal)
        refs = images_of.resolve(images, self.staged)
        result = await self._subcall(prompt, batch=None, images=refs, lm=lm)
        if result.startswith("[ERROR]"):
            raise RuntimeError(result[8:])
        return result

    async def llm_query_batched(
        self, prompts: list[str], images: list[Any] | None = None, model: str | None = None
    ) -> list[str]:
        """Concurrent sub-calls (bounded run-wide); a failure fills only its own slot. ``images`` holds one
        list of images per prompt (``[]`` for none); a slot whose images are refused gets its reason.
        ``model``: a named model answers them all (an unknown name raises ValueError)."""
        if not isinstance(prompts, list):
            raise TypeError("llm_query_batched takes a list of prompt strings")
        lm = self._sub_lm(model)
        per_prompt = images_of.resolve_batch(images, len(prompts), self.staged)
        batch = self.run.next_batch_id()
        return list(
            await asyncio.gather(
                *(
                    self._subcall(p, batch=(batch, i, len(prompts)), images=per_prompt[i], lm=lm)
                    for i, p in enumerate(prompts)
                )
            )
        )

    async def rlm_query(self, prompt: str, context: str | None = None, model: str | None = None) -> str:
        """A child RLM; ``model`` names the model of its root steps (its own sub-calls stay the run's sub model)."""
        if model is not None:
            self._sub_lm(model)  # an unknown name raises here, before the child starts
        return await self.run.child(self, _require_text(prompt), context, model=model)

    async def rlm_query_batched(
        self, prompts: list[str], contexts: list[str] | None = None, model: str | None = None
    ) -> list[str]:
        if not isinstance(prompts, list):
            raise TypeError("rlm_query_batched takes a list of prompt strings")
        if model is not None:
            self._sub_lm(model)
        if contexts is not None and len(contexts) != len(prompts):
            raise ValueError("rlm_query_batched: contexts must be as long as prompts")
        gate = asyncio.Semaphore(self.run.settings.child_concurrency)

        async def one(i: int) -> str:
            async with gate:
                try:
                    return await self.run.child(self, prompts[i], contexts[i] if contexts else None, model=model)
                except Exception as exc:  # a child's model error may quote the key: mask it
                    return f"[ERROR] {redact_text(str(exc))}"

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    def _sub_lm(self, model: Any) -> Any:
        """The LM a sub-call asks: the run's sub model, or the named one (unknown: ValueError with the names)."""
        return self.run.sub_lm if model is None else self.run.named_lm(model)

    def _window_of(self, lm: Any) -> int | None:
        """The input window of the model that answers a sub-call: the sub model's (its setting, else
        LiteLLM's figure), or a named model's own."""
        if lm is None or lm is self.run.sub_lm:
            return self.sub_window
        return compaction.context_window(getattr(lm, "model", None))

    def _prompt_refusal(self, prompt: Any, lm: Any = None) -> str | None:
        """Why a prompt is never sent to the sub-model, or None. The host checks it: the sandbox's
        code could forge the call past any check made inside."""
        if not isinstance(prompt, str) or not prompt.strip():
            return "the prompt must be a non-empty string"
        limit = self.run.settings.subcall_max_chars
        if len(prompt) > limit:
            return (
                f"the prompt is {len(prompt):,} characters, over the {limit:,}-character limit of one sub-call "
                "(FLEET_SUBCALL_MAX_CHARS); split it into pieces (llm_query_batched over chunks) and combine "
                "the answers"
            )
        tokens, window = compaction.estimate_tokens(len(prompt)), self._window_of(lm)
        if window is not None and tokens > window:
            whose = "the sub model's" if lm is None or lm is self.run.sub_lm else f"{getattr(lm, 'model', 'its')}'s"
            return (
                f"this prompt is ~{tokens:,} tokens; {whose} window is {window:,} tokens: split it "
                "(llm_query_batched over chunks) and combine the answers"
            )
        return None

    async def _subcall(
        self,
        prompt: Any,
        *,
        batch: tuple[int, int, int] | None,
        images: list[images_of.ImageRef] | str | None = None,
        lm: Any = None,
    ) -> str:
        """One sub-call; ``images`` are sent as image parts (a str: why this slot's images were refused)."""
        slot = f"{self.step_path(self.step)}/sub{self._subs}"  # numbered before any wait: in the order asked
        self._subs += 1
        refusal = self._prompt_refusal(prompt, lm) or (images if isinstance(images, str) else None)
        if refusal:
            return f"[ERROR] {refusal}"
        images = images if isinstance(images, list) else []
        run = self.run
        lm = run.sub_lm if lm is None else lm
        data: dict[str, Any] = {"prompt_preview": prompt[:PREVIEW], "prompt_chars": len(prompt)}
        data["model_name"] = getattr(lm, "name", "sub")
        if batch:
            data["batch"] = {"id": batch[0], "index": batch[1], "size": batch[2]}
        if images:  # counted, never shown: the pixels stay out of events
            data.update(images=len(images), image_bytes=sum(i.size for i in images))
        try:
            self.budget.reserve(1)
            async with run.subcall_gate:  # images are read inside it: at most FLEET_CONCURRENCY calls' worth held
                with tape.at(run.tape, slot):
                    answer, usage = await metered(lambda: self._ask(lm, prompt, images), run.record_usage)
            text = str(answer[0]) if answer else ""
            data.update(response_preview=text[:PREVIEW], response_chars=len(text), error=None)
            data.update(usage_fields(usage))
        except BudgetExhausted as exc:
            text = f"[ERROR] {exc.reason}"
            data["error"] = exc.reason
        except Exception as exc:
            reason = explain_lm_error(exc, lm) + (_vision_hint(exc, lm, len(images)) if images else "")
            text = f"[ERROR] {reason}"
            data["error"] = reason
        self.emit("subcall.finished", data)
        return text

    async def _ask(self, sub_lm: Any, prompt: str, images: list[images_of.ImageRef]) -> Any:
        if not images:
            return await sub_lm.acall(prompt=prompt)
        messages = await asyncio.to_thread(images_of.messages, prompt, images)
        return await sub_lm.acall(messages=messages)

    # -- what RLMProgram calls ---------------------------------------------------------------

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.run.emit(kind, data, node=self.node, parent=self.parent, depth=self.depth)

    def warn(self, message: str) -> None:
        self.emit("warning", {"message": message})

    def query_preview(self) -> str:
        return cap_middle(self.query, QUERY_PREVIEW)

    def opening_observation(self) -> str:
        lines = [f"query (str, {len(self.query):,} chars): {self.query_preview()}"]
        staged = self.staged
        if staged is not None and (staged.length or staged.images):
            lines.append(
                f"context (str, {staged.length:,} chars, {len(staged.sources)} source(s)); preview:\n"
                + preview(staged.path, staged.length)
            )
            shown = [s.brief() for s in staged.sources[:20]]
            more = f" ... and {len(staged.sources) - 20} more in `sources`" if len(staged.sources) > 20 else ""
            lines.append(f"sources: {json.dumps(shown)}{more}")
            if staged.images:
                lines.append(
                    f'images: {len(staged.images)} in `sources` (kind "image"; not in `context`); a sub-model sees '
                    "them through llm_query(prompt, images=[name, ...])"
                )
        elif staged is not None:
            lines.append("context: empty (no input given; work from the query)")
        else:
            lines.append("context: unchanged from the previous run in this session")
        models = getattr(self.run.settings, "models", None)
        if models:  # only when some are configured: the prompt of a run without named models stays as it was
            named = ", ".join(f"{name} ({spec.model})" for name, spec in models.items())
            lines.append(
                f"models for sub-calls: {named}; pick one with llm_query(prompt, model=NAME), "
                "llm_query_batched(prompts, model=NAME) or rlm_query(prompt, context, model=NAME) (the child's own "
                "steps); without model=, the default sub model answers"
            )
        if self.sandbox.volume_paths:
            mounts = ", ".join(f"{n} at {p}" for n, p in self.sandbox.volume_paths.items())
            lines.append(f"volumes (persistent folders: memory/ artifacts/ buffers/ meta/): {mounts}")
        box = getattr(self.run, "tools", None)
        if box is not None and box.specs:
            lines.append(box.describe())
        lines.append(self.status_line(1))
        return "\n".join(lines)

    def status_line(self, step: int) -> str:
        # ASCII only, like everything this runtime adds to a prompt: one non-ASCII character moves
        # the whole request off the ASCII fast paths of encoding (~1 ms a call at 30K characters).
        limits = self.run.limits
        line = (
            f"[step {step} of {self.max_iters} | {self.budget.calls_left} model calls left | "
            f"depth {self.depth} of {limits.max_depth} | {self.budget.seconds_left:.0f} s left]"
        )
        note = self.run.tape.instruction(self.step_path(step)) if self.run.tape else None
        return f"{line}\nInstruction for step {step}: {note}" if note else line

    async def predict(
        self, predictor: dspy.Predict, *, step: int, final: bool = False, **inputs: Any
    ) -> dspy.Prediction:
        """One root-model call through the chat adapter, metered and traced, with the form its
        reply came in (an unreadable one is counted too, then its parse error propagates).

        ``final`` is the extraction after a budget ran out: it must run regardless."""
        run = self.run
        if not final:
            self.budget.check()
        slot = f"{self.step_path(step)}/{'extract' if final else 'act'}"
        with dspy.context(lm=self.root_lm, adapter=run.adapter), noting_reply_forms() as forms, tape.at(run.tape, slot):
            try:
                prediction, usage = await metered(lambda: predictor.acall(**inputs), run.record_usage)
            finally:
                run.count_reply_forms(forms)
        data: dict[str, Any] = {
            "step": step,
            "predictor": "extract" if final else "act",
            "reasoning": str(getattr(prediction, "reasoning", "") or ""),
            "reply_form": forms[-1] if forms else None,
        }
        data.update(usage_fields(usage))
        if not final and usage is not None and usage.prompt_tokens and isinstance(inputs.get("transcript"), str):
            self._overhead = usage.prompt_tokens - compaction.estimate_tokens(len(inputs["transcript"]))
        self.emit("lm.call", data)
        return prediction

    async def execute(self, reply: str, *, step: int) -> Outcome:
        """Run the model's code; whatever happens, the model gets to see it."""
        try:
            code = extract_code(reply)
        except SyntaxError as exc:
            shown = f"Error: {exc}"
            self.emit("code.executed", {"step": step, "code": reply, "output": shown, "error": str(exc)})
            await self._remember(step, reply, shown)
            return Outcome(shown, None)
        self.step, self._subs, self._calls = step, 0, 0
        # A step never outlives the run's wall-time budget.
        timeout = min(self.run.settings.exec_timeout, max(1.0, self.budget.seconds_left))
        started = time.time()  # what this step writes is what a volume quota may remove
        result = await self.sandbox.execute(code, timeout=timeout)
        parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
        if result.value is not None:
            parts.append(f"Out: {result.value}")
        if result.error:
            parts.append(f"Error: {result.error}")
        parts += [f"Warning: {m}" for m in await self.enforce_volume_quotas(started)]
        raw = "\n".join(parts)
        final = _answer_text(result.final) if result.final is not None else None
        shown = cap_middle(raw, self.run.settings.output_chars) if raw else "(no output: print what you need to see)"
        self.emit(
            "code.executed",
            {
                "step": step,
                "code": code,
                "output": shown,
                "output_chars": len(raw),
                "error": result.error,
                "error_kind": result.error_kind,
                "duration": round(result.duration, 4),
                "submitted": final is not None,
            },
        )
        await self._remember(step, code, shown)
        return Outcome(shown, final)

    async def _remember(self, step: int, code: str, output: str) -> None:
        """Add the step to ``history``, in the REPL too (as data): appended, so a step sends only itself; the
        whole list again where the code rebound or replaced its copy."""
        entry = {"step": step, "code": code, "output": output}
        self.history.append(entry)
        try:
            if len(self.history) == 1:
                await self.sandbox.set_var("history", self.history)
            else:
                try:
                    await self.sandbox.append_var("history", entry)
                except ValueError:  # the code rebound `history`: bind it whole again
                    await self.sandbox.set_var("history", self.history)
        except Exception as exc:  # a sandbox gone bad says so at its next step
            self.warn(f"step {step}: `history` could not be updated in the REPL: {exc}")

    def over_window(self, transcript: str) -> bool:
        """Whether the next root call's prompt, with ``transcript``, reaches the compaction threshold."""
        if self.window is None:
            return False
        tokens = compaction.estimate_tokens(len(transcript)) + (self._overhead or 0)
        threshold: float = self.run.settings.compact_at * self.window
        return tokens >= threshold

    async def compact(
        self, transcript: str, *, step: int, opening: str, shown_steps: list[str], folded: int, summary: str
    ) -> tuple[str, str] | None:
        """Fold steps ``folded``+1 .. all but the last into ``summary`` by one budgeted root-model call,
        recorded at ``<step>/compact``; (summary, compacted transcript), or None when the call failed (a
        warning says why; the transcript goes on as it is). A budget that ran out propagates."""
        run, through = self.run, len(shown_steps) - 1
        assert self.window is not None and through > folded
        prompt = compaction.summary_prompt(
            self.query_preview(), summary, "".join(shown_steps[folded:through]), folded + 1, through
        )
        self.budget.reserve(1)
        try:
            with tape.at(run.tape, f"{self.step_path(step)}/compact"):
                answer, usage = await metered(lambda: self.root_lm.acall(prompt=prompt), run.record_usage)
        except Exception as exc:  # the node's own model summarises: a child on a named model too
            why = explain_lm_error(exc, self.root_lm)
            self.warn(f"compacting the transcript failed: {why}; it goes on uncompacted")
            return None
        text = cap_middle(str(answer[0]).strip() if answer else "", compaction.summary_chars(self.window))
        if not text:
            self.warn("compacting the transcript failed: the summary came back empty; it goes on uncompacted")
            return None
        compacted = compaction.compacted_transcript(opening, text, through, shown_steps[-1])
        data: dict[str, Any] = {
            "step": step, "steps_folded": through - folded, "through": through, "chars_before": len(transcript),
            "chars_after": len(compacted), "summary_chars": len(text), "window": self.window,
        }  # fmt: skip
        data.update(usage_fields(usage))
        self.emit("history.compacted", data)
        return text, compacted

    async def enforce_volume_quotas(self, since: float) -> list[str]:
        """Trim each volume this sandbox mounts back under its quota; the messages are also warnings."""
        store = self.run.volume_store
        if store is None:
            return []
        messages = []
        for name in self.sandbox.volume_paths:
            message = await asyncio.to_thread(store.enforce_quota, name, since)
            if message:
                self.warn(message)
                messages.append(message)
        return messages


def usage_fields(usage: CallUsage | None) -> dict[str, Any]:
    """The per-call usage an event carries."""
    if usage is None:
        return {}
    return (
        {
            "model": usage.model,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cost": usage.cost,
            "latency": round(usage.latency, 4),
        }
        | ({"replayed": True} if usage.replayed else {})
        | _cache_fields(usage)
    )


def _cache_fields(usage: CallUsage) -> dict[str, Any]:
    """The prompt-cache figures of a call, only when the provider reported some (most local servers never do)."""
    if not (usage.cached_tokens or usage.cache_write_tokens):
        return {}
    written = {"cache_write_tokens": usage.cache_write_tokens} if usage.cache_write_tokens else {}
    return {"cached_tokens": usage.cached_tokens, **written, "saved": round(usage.saved, 8)}


def _vision_hint(exc: BaseException, lm: Any, count: int) -> str:
    """What to try when a call with images failed at a provider that did not say it cannot reach, wait or
    authenticate: it may not take images (LiteLLM's map did not know the model, so it was asked)."""
    settled = (
        NoVision,
        images_of.ImageUnreadable,
        LMTransportError,
        LMTimeoutError,
        LMRateLimitError,
        LMAuthError,
        ContextWindowExceededError,
    )
    if isinstance(exc, settled):
        return ""
    model = getattr(lm, "model", "the sub model")
    return (
        f" (the request carried {count} image(s): if {model} does not take images, set FLEET_SUB_LM_MODEL to a "
        "vision model)"
    )


def _require_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("the prompt must be a non-empty string")
    return value
