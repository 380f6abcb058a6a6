"""A run's record, kept and answered: what every model call and host call of a run returned, under
its position in the run, so the run can be replayed (every call answered from the record, none
made) or forked (calls before the fork step answered from it, the rest live). docs/replay.md.

A position ("slot") names where a call was made as a path of (node, step)::

    root#3/act              the root's model call of step 3
    root#5/extract          the extraction after 4 steps
    root#9/compact          the summary written before step 9 (core/compaction.py)
    root#2/sub0             the first sub-query step 2's code made
    root#2/call1            the second host call step 2's code made (its result)
    root#2>root.1#1/act     step 1 of the child RLM that root's step 2 started
    root#0/inputs           the run's inputs (texts, volumes, the context's hash)

Each record also keeps the hash of its request (``request_key``): a replay tells a request that is
the same from one that changed. Every run keeps its record (``Tape`` in ``keep`` mode) from
``MeteredLM`` (the one place model calls go through, ``call``/``acall`` here) and the node's host
functions; the store queues the rows like events, so keeping them never waits for SQLite.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from fleet_rlm.errors import FleetError

Mode = Literal["keep", "replay", "fork"]
INPUTS_SLOT = "root#0/inputs"
TOOLS_SLOT = "root#0/tools"  # the tools a run's REPL had (core.tools): a replay shows the model the same
MODEL_CALLS = ("act", "extract", "compact")  # and "sub<i>": the kinds of slot a model call is kept at
# The wall-clock figure of a step's status line ("| 1795 s left]") differs between any two runs; it
# is left out of the hash so a replay's requests match the recorded ones (core/node.py status_line).
_VOLATILE = re.compile(r"\| \d+ s left\]")


class Unrecorded(FleetError):
    """A replay made a call the record has no reply for."""


class RecordedFailure(FleetError):
    """A call that failed in the recorded run fails again, with the recorded error."""


def request_key(prompt: Any, messages: Any) -> tuple[str, int]:
    """(hash, size) of a request as sent: its messages' roles and contents, or the prompt of a plain call.

    Hashed part by part, not as one JSON text: a long run's transcript is 100 KB and more, and this
    runs on every model call (about 0.15 ms per 100 KB; serializing it first took twice that)."""
    parts = [prompt] if messages is None else [p for m in messages for p in (m.get("role"), m.get("content"))]
    digest, size = hashlib.sha256(), 0
    for part in parts:
        text = _VOLATILE.sub("| s left]", part if isinstance(part, str) else _canonical(part))
        size += len(text)
        digest.update(text.encode("utf-8", "surrogatepass") + b"\x00")
    return digest.hexdigest()[:32], size


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def is_model_call(slot: str) -> bool:
    kind = slot.rpartition("/")[2]
    return kind in MODEL_CALLS or kind.startswith("sub")


def parse_slot(slot: str) -> tuple[list[tuple[str, int]], str]:
    """``"root#2>root.1#1/act"`` -> ([("root", 2), ("root.1", 1)], "act")."""
    path, _, kind = slot.rpartition("/")
    chain = []
    for part in path.split(">"):
        node, _, step = part.partition("#")
        chain.append((node, int(step)))
    return chain, kind


@dataclass(frozen=True)
class ForkPoint:
    """Where a fork branches: the chain of (node, step) down to the forked step, and what it does there."""

    path: tuple[tuple[str, int], ...]
    code: str | None = None  # run this as the step's code instead of asking the model
    instruction: str | None = None  # appended to the transcript before the step's live model call

    @property
    def at(self) -> str:
        node, step = self.path[-1]
        return f"{node}:{step}"

    @property
    def step_path(self) -> str:
        return ">".join(f"{n}#{s}" for n, s in self.path)


Where = Literal["before", "at", "after", "near"]


def relation(slot: str, fork: ForkPoint) -> Where:
    """Whether a call at ``slot`` came before the fork point (answered from the record), is the forked
    step's model call, came after it (live), or sits beside the path to it (a sibling child, a
    sub-query of the step that leads there: answered when its request is the recorded one)."""
    chain, kind = parse_slot(slot)
    for i, (node, step) in enumerate(chain):
        if i >= len(fork.path) or node != fork.path[i][0]:
            return "near"
        fork_step = fork.path[i][1]
        if step != fork_step:
            return "before" if step < fork_step else "after"
        last_call, last_fork = i == len(chain) - 1, i == len(fork.path) - 1
        if last_fork:
            return "at" if last_call and kind == "act" else "after"
        if last_call:
            return "before" if kind == "act" else "near"
    return "after"


@dataclass(frozen=True)
class Recorded:
    """What a call returned in the recorded run (or, for a fork, the code given for its step)."""

    body: dict[str, Any]
    usage: dict[str, Any]


Keep = Callable[[int, str, str, int, dict[str, Any], dict[str, Any]], None]  # store.records.keep without run_id
Emit = Callable[..., Any]  # RunContext.emit


class Tape:
    """One run's record: kept as its calls return; in a replay or fork, the source run's record answers."""

    def __init__(
        self,
        keep: Keep,
        emit: Emit,
        *,
        mode: Mode = "keep",
        source: list[Any] | None = None,  # store.records.Record of the source run
        source_id: str | None = None,
        fork: ForkPoint | None = None,
    ) -> None:
        self.mode = mode
        self.source_id = source_id
        self.fork = fork
        self._keep = keep
        self._emit = emit
        self._count = itertools.count(1)
        self._lock = threading.Lock()  # root calls answer and keep on worker threads
        self._used: set[int] = set()
        self._by_slot = {r.slot: r for r in source or []}
        self._by_request: dict[str, list[Any]] = {}
        for r in source or []:
            if is_model_call(r.slot):
                self._by_request.setdefault(r.request_hash, []).append(r)

    # -- what the record says -------------------------------------------------------------------

    def source_inputs(self) -> dict[str, Any] | None:
        found = self._by_slot.get(INPUTS_SLOT)
        return found.body if found else None

    def source_body(self, slot: str) -> dict[str, Any] | None:
        """What the source run kept at ``slot`` (its tool catalog, ``TOOLS_SLOT``), or None."""
        found = self._by_slot.get(slot)
        return found.body if found else None

    def host_answer(self, slot: str, name: str) -> dict[str, Any] | None:
        """The recorded result of the host call at ``slot`` (a tool's: ``{"value"}`` or ``{"error"}``), or
        None: make the call live. A replay answers every call from the record (``Unrecorded`` for one the
        recorded run did not make); a fork, the calls before its step."""
        if self.mode == "keep":
            return None
        if self.mode == "fork":
            assert self.fork is not None
            if relation(slot, self.fork) != "before":
                return None
        found = self._by_slot.get(slot)
        if found is not None and self._take(found) is not None:
            body: dict[str, Any] = found.body
            return body
        if self.mode == "fork":
            self.diverge(slot, "missing", f"the recorded run made no such call: {name}() was called live")
            return None
        self.diverge(slot, "missing", f"the recorded run made no such call: {name}() has no result to answer it")
        raise Unrecorded(f"replay: no recorded result for {name}() at {describe(slot)}; the recorded run made none")

    def instruction(self, step_path: str) -> str | None:
        """The fork's extra instruction, for the forked step only."""
        fork = self.fork
        return fork.instruction if fork and fork.instruction and step_path == fork.step_path else None

    def answer(self, slot: str, key: str, chars: int) -> Recorded | None:
        """The recorded reply for a call at ``slot`` (None: make the call live). A replay raises
        ``Unrecorded`` for a call the record has no reply for."""
        if self.mode == "keep":
            return None
        if self.mode == "replay":
            return self._replayed(slot, key, chars)
        assert self.fork is not None
        where = relation(slot, self.fork)
        if where == "at" and self.fork.code is not None:
            reply = _given_code_reply(self.fork.code, self.source_id)
            return Recorded({"outputs": [reply]}, {})
        if where == "before":
            found = self._take(self._by_slot.get(slot)) or self._matching(key)
            if found is None:  # the replayed steps did not do what they did (non-determinism): said, not hidden
                self.diverge(slot, "missing", "the recorded run made no such call: the model was asked live")
            return found
        return self._matching(key) if where == "near" else None

    def _replayed(self, slot: str, key: str, chars: int) -> Recorded:
        same = self._by_slot.get(slot)
        found = self._take(same if same and same.request_hash == key else None) or self._matching(key)
        if found is not None:
            return found
        if same is not None and same.n not in self._used:
            self.diverge(
                slot,
                "prompt",
                f"the request ({chars:,} characters) differs from the recorded one "
                f"({same.request_chars:,}); answered with the reply recorded at this position",
            )
            found = self._take(same)
            assert found is not None
            return found
        self.diverge(slot, "missing", "the recorded run made no such call: there is no reply to answer it with")
        raise Unrecorded(f"replay: no recorded reply for {describe(slot)}; the recorded run made no such call")

    def _take(self, record: Any) -> Recorded | None:
        with self._lock:
            if record is None or record.n in self._used:
                return None
            self._used.add(record.n)
        return Recorded(record.body, record.usage)

    def _matching(self, key: str) -> Recorded | None:
        """An unused record of the same request anywhere (concurrent calls may come in another order)."""
        for record in self._by_request.get(key, ()):
            found = self._take(record)
            if found is not None:
                return found
        return None

    # -- keeping --------------------------------------------------------------------------------

    def keep(self, slot: str, key: str, chars: int, body: dict[str, Any], usage: dict[str, Any]) -> None:
        self._keep(next(self._count), slot, key, chars, body, usage)

    def keep_host(self, slot: str, name: str, args: Any, body: dict[str, Any]) -> None:
        """A host call's result (``{"value": ...}`` or ``{"error": ...}``); a replay checks it against the record."""
        key, chars = request_key(_canonical([name, args]), None)
        self.keep(slot, key, chars, body, {})
        if self.mode != "replay":
            return
        recorded = self._by_slot.get(slot)
        if recorded is not None and _canonical(recorded.body) != _canonical(body):
            self.diverge(slot, "host", f"{name}() returned something other than in the recorded run")

    def diverge(self, slot: str, reason: Literal["prompt", "missing", "host", "inputs"], detail: str) -> None:
        chain, _ = parse_slot(slot)
        node, step = chain[-1]
        parent = chain[-2][0] if len(chain) > 1 else None
        data = {"slot": slot, "step": step, "reason": reason, "detail": detail}
        self._emit("replay.diverged", data, node=node, parent=parent, depth=len(chain) - 1)


def describe(slot: str) -> str:
    """A slot for a person: "root step 4's model call", "sub-query 2 of root.1 step 3"."""
    chain, kind = parse_slot(slot)
    node, step = chain[-1]
    if kind == "act":
        return f"{node} step {step}'s model call"
    if kind == "extract":
        return f"{node}'s extraction after step {step - 1}"
    if kind == "compact":
        return f"{node}'s summary of its transcript before step {step}"
    what = "sub-query" if kind.startswith("sub") else "host call"
    index = int(kind.removeprefix("sub").removeprefix("call") or 0)
    return f"{what} {index + 1} of {node} step {step}"


def _given_code_reply(code: str, source_id: str | None) -> str:
    """The forked step's reply, as if the model had written the given code (no model is asked)."""
    reasoning = f"(code given for this step of a fork of run {source_id})"
    return f"[[ ## reasoning ## ]]\n{reasoning}\n\n[[ ## code ## ]]\n```python\n{code}\n```\n\n[[ ## completed ## ]]"


# -- where the model calls meet the tape ---------------------------------------------------------

_at: ContextVar[tuple[Tape, str] | None] = ContextVar("fleet_tape_at", default=None)


@contextmanager
def at(tape: Tape | None, slot: str) -> Iterator[None]:
    """Model calls made inside are kept (and, replaying, answered) as the call at ``slot``."""
    if tape is None:
        yield
        return
    token = _at.set((tape, slot))
    try:
        yield
    finally:
        _at.reset(token)


class _Call:
    """One model call at a slot of a run's tape: answered from the record, or made and kept."""

    def __init__(self, tape: Tape, slot: str, prompt: Any, messages: Any, records: Records) -> None:
        self.tape, self.slot = tape, slot
        self.key, self.chars = request_key(prompt, messages)
        self.records = records  # where MeteredLM hands this call's usage (core.lm.metered)
        self.mark = len(self.records) if self.records is not None else 0
        self.recorded = tape.answer(slot, self.key, self.chars)

    def answer(self) -> Any:
        """The recorded outputs (its usage marked replayed: no model was called), or its error again."""
        assert self.recorded is not None
        body, usage = self.recorded.body, self.recorded.usage
        self.tape.keep(self.slot, self.key, self.chars, body, usage)
        if usage and self.records is not None:
            self.records.append(
                {"model": usage.get("model"), "usage": usage, "cost": usage.get("cost"), "replayed": True}
            )
        if "error" in body:
            raise RecordedFailure(str(body["error"]))
        return body.get("outputs") or []

    def kept(self, outputs: Any) -> Any:
        self.tape.keep(self.slot, self.key, self.chars, {"outputs": outputs}, self._usage())
        return outputs

    def failed(self, error: str) -> None:
        self.tape.keep(self.slot, self.key, self.chars, {"error": error}, self._usage())

    def _usage(self) -> dict[str, Any]:
        entries = self.records[self.mark :] if self.records is not None else []
        if not entries:
            return {}
        tokens = [e.get("usage") or {} for e in entries]
        return {
            "model": str(entries[-1].get("model") or ""),
            "prompt_tokens": sum(int(t.get("prompt_tokens") or 0) for t in tokens),
            "completion_tokens": sum(int(t.get("completion_tokens") or 0) for t in tokens),
            "cost": sum(float(e.get("cost") or 0.0) for e in entries) or None,
        }


# What the model call brings along (core.lm imports this module, so it hands these over rather than
# this module importing it back): the list its usage lands in, and its failure as the user's sentence.
Records = list[dict[str, Any]] | None
Explain = Callable[[Exception], str]


def call(prompt: Any, messages: Any, live: Callable[[], Any], records: Records, explain: Explain) -> Any:
    """``MeteredLM.__call__`` through the run's tape (outside a run: just the call)."""
    where = _at.get()
    if where is None:
        return live()
    step = _Call(*where, prompt, messages, records)
    if step.recorded is not None:
        return step.answer()
    try:
        outputs = live()
    except Exception as exc:
        step.failed(explain(exc))
        raise
    return step.kept(outputs)


async def acall(
    prompt: Any, messages: Any, live: Callable[[], Awaitable[Any]], records: Records, explain: Explain
) -> Any:
    """``MeteredLM.acall`` through the run's tape; the same as ``call``, awaited."""
    where = _at.get()
    if where is None:
        return await live()
    step = _Call(*where, prompt, messages, records)
    if step.recorded is not None:
        return step.answer()
    try:
        outputs = await live()
    except Exception as exc:
        step.failed(explain(exc))
        raise
    return step.kept(outputs)
