"""Replays and forks of recorded runs (docs/replay.md): what to run again, from where, and how a
replay compares with its record. No DSPy here: the read side uses the comparison too.

``plan_replay`` and ``plan_fork`` turn a recorded run into the request of a new run and a ``Rerun``
(the source's record, the fork point); the Engine starts it like any run, with a tape
(``core.tape``) that answers its calls from the record. ``replay_report`` compares a replay with its
source, step by step, from both runs' events and the divergences the replay's tape noticed.
(Not to be confused with ``engine.Replay``: an optimization's candidate answering a dataset row.)
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from fleet_rlm.core.tape import INPUTS_SLOT, ForkPoint, Tape, parse_slot
from fleet_rlm.core.trace import build_trace
from fleet_rlm.errors import Conflict, NotFound, UserError
from fleet_rlm.limits import LIMITS, MAX_ITERS
from fleet_rlm.types import ACTIVE_STATUSES, Event, RunRequest

if TYPE_CHECKING:
    from fleet_rlm.core.context import StagedContext
    from fleet_rlm.store import RunRecord, Store
    from fleet_rlm.store.records import Record

AT = re.compile(r"(?:(root(?:\.\d+)*):)?(\d+)")


@dataclass
class Rerun:
    """A new run made from a recorded one: a replay (every call answered from the record) or a fork."""

    kind: Literal["replay", "fork"]
    source: RunRecord
    records: list[Record]
    fork: ForkPoint | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def lineage(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source.id, "at": self.fork.at if self.fork else None}

    @property
    def inputs(self) -> dict[str, Any]:
        return next((r.body for r in self.records if r.slot == INPUTS_SLOT), {})

    @property
    def volumes(self) -> list[str]:
        """The volumes the source mounted."""
        return list(self.inputs.get("volumes") or [])

    def tape(self, keep: Any, emit: Any) -> Tape:
        return Tape(keep, emit, mode=self.kind, source=self.records, source_id=self.source.id, fork=self.fork)


def plan_replay(store: Store, run_id: str) -> tuple[RunRequest, Rerun]:
    """The request and record of a replay of ``run_id``; UserError when it cannot be replayed."""
    source, records = _recorded(store, run_id)
    rerun = Rerun("replay", source, records)
    return _request(store, rerun, {}), _noting(rerun)


def plan_fork(
    store: Store,
    run_id: str,
    at: str,
    *,
    code: str | None = None,
    instruction: str | None = None,
    max_iters: int | None = None,
) -> tuple[RunRequest, Rerun]:
    """The request and record of a fork of ``run_id`` at ``at`` ("3", "root:3" or "root.1:2")."""
    if code is not None and instruction is not None:
        raise UserError("give the forked step's code or an instruction for the model, not both")
    if code is not None and not code.strip():
        raise UserError("the forked step's code is empty: give the Python to run at that step")
    if max_iters is not None:
        MAX_ITERS.check(max_iters)  # first, so a bad value gets the message every face gives
    source, records = _recorded(store, run_id)
    point = fork_point(run_id, records, at, code=code, instruction=(instruction or "").strip() or None)
    step = point.path[-1][1]
    if max_iters is not None and step > max_iters:
        raise UserError(f"the fork is at step {step}, past --max-iters {max_iters}: allow at least {step} steps")
    rerun = Rerun("fork", source, records, point)
    return _request(store, rerun, {"max_iters": max_iters} if max_iters else {}), _noting(rerun)


def parse_at(text: str) -> tuple[str, int]:
    """``"3"`` -> ("root", 3); ``"root.1:2"`` -> ("root.1", 2)."""
    found = AT.fullmatch(str(text).strip())
    if found is None or int(found.group(2)) < 1:
        raise UserError(f"fork point {text!r}: give a step number (3) or NODE:STEP (root.1:2), steps from 1")
    return found.group(1) or "root", int(found.group(2))


def fork_point(run_id: str, records: list[Record], at: str, *, code: str | None, instruction: str | None) -> ForkPoint:
    """The path to ``at`` in the source's record: a step of that node, or the one after its last when it
    stopped on a budget (its extraction is recorded there: a fork with a higher --max-iters goes on)."""
    node, step = parse_at(at)
    steps: dict[int, tuple[tuple[str, int], ...]] = {}
    nodes: dict[str, None] = {}  # in the order they first acted
    for record in records:
        chain, kind = parse_slot(record.slot)
        here, number = chain[-1]
        if kind in ("act", "extract"):
            nodes.setdefault(here)
            if here == node:
                steps.setdefault(number, tuple(chain))
    if not steps:
        raise NotFound(f"run '{run_id}' has no node '{node}': its nodes are {', '.join(nodes) or 'none'}")
    if step not in steps:
        raise UserError(f"node '{node}' of run '{run_id}' has steps 1..{max(steps)}: fork at one of them")
    return ForkPoint(steps[step], code=code, instruction=instruction)


def _recorded(store: Store, run_id: str) -> tuple[RunRecord, list[Record]]:
    source = store.runs.get(run_id)
    if source is None:
        raise NotFound(f"no run '{run_id}': list recent runs with `fleet-rlm runs`")
    if source.kind == "optimize":
        raise UserError(f"'{run_id}' is an optimization, not a run: replay or fork one of its runs instead")
    if source.status in ACTIVE_STATUSES:
        raise Conflict(f"run '{run_id}' is still {source.status}: replay or fork it once it has finished")
    records = store.records.list(run_id)
    if not any(r.slot != INPUTS_SLOT for r in records):
        raise UserError(
            f"run '{run_id}' has no record of its model calls to answer from (it ran before fleet-rlm kept "
            "records, or stopped before its first call): start it again with `fleet-rlm run`"
        )
    return source, records


TOOL_FIELDS = ("mcp_servers", "tools", "allow_tools")


def _request(store: Store, rerun: Rerun, overrides: dict[str, Any]) -> RunRequest:
    """The source's request, with its texts from the record and the limits it ran with (not today's
    settings: a different step limit changes every status line the model saw)."""
    asked = rerun.source.request or {}
    ran = next((e["data"].get("limits") or {} for e in store.runs.events(rerun.source.id, limit=1)), {})
    limits = {k: ran.get(k, asked.get(k)) for k in LIMITS} | {k: v for k, v in overrides.items() if v is not None}
    inputs = rerun.inputs
    # A fork's later steps call the tools live; a replay's record answers every call (core.tools).
    tools: dict[str, list[str]] = {k: list(asked.get(k) or []) for k in TOOL_FIELDS} if rerun.kind == "fork" else {}
    return RunRequest(
        question=rerun.source.question,
        context_paths=list(asked.get("context_paths") or []),
        context_text=list(inputs.get("texts") or []),
        volume=asked.get("volume"),
        include_hidden=bool(asked.get("include_hidden")),
        context_urls=list(asked.get("context_urls") or []),  # fetched again: a changed page is noted
        repo_url=asked.get("repo_url"),
        repo_ref=asked.get("repo_ref"),
        mcp_servers=tools.get("mcp_servers", []),
        tools=tools.get("tools", []),
        allow_tools=tools.get("allow_tools", []),
        **{k: v for k, v in limits.items() if v is not None},
    )


def _noting(rerun: Rerun) -> Rerun:
    """What a person must know about this rerun before reading its outcome."""
    what = "replay" if rerun.kind == "replay" else "fork"
    if rerun.source.session_id:
        rerun.warnings.append(
            f"run {rerun.source.id} ran in session {rerun.source.session_id}: what its REPL held from earlier "
            f"runs is not in this {what}'s fresh REPL, so steps that used it will differ"
        )
    return rerun


async def record_inputs(tape: Tape, texts: list[str], volumes: list[str], staged: StagedContext | None) -> None:
    """Keep what the run read (its texts, the volumes it mounted, the context's hash); a replay notes
    a context that differs from the recorded one."""
    context = None
    if staged is not None:
        context = {"sha256": await asyncio.to_thread(_file_hash, staged.path), "chars": staged.length}
    tape.keep(INPUTS_SLOT, "", 0, {"texts": texts, "volumes": volumes, "context": context}, {})
    recorded = tape.source_inputs()
    if tape.mode == "replay" and recorded is not None and recorded.get("context") != context:
        tape.diverge(INPUTS_SLOT, "inputs", "the context differs from the recorded run's: its files changed since")


def _file_hash(path: Any) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- comparing a replay with its record -----------------------------------------------------------

Reason = Literal["prompt", "missing", "host", "inputs", "code", "output", "ended", "answer"]


class StepMatch(BaseModel):
    """One step of one node, recorded and replayed."""

    node: str
    step: int
    recorded: bool = Field(description="The source run took this step.")
    replayed: bool = Field(description="The replay took this step.")
    code_same: bool
    output_same: bool
    prompt_same: bool = Field(description="The model was asked exactly what the record answered.")


class FirstDivergence(BaseModel):
    node: str
    step: int
    reason: Reason = Field(
        description="prompt: the model's request changed; missing: a call with no recorded reply; host: a host "
        "call returned something else; inputs: the context changed; code/output: the step ran other code or "
        "printed something else; ended: the replay stopped before a recorded step; answer: only the answer differs."
    )
    detail: str


class ReplayReport(BaseModel):
    """How a replay compares with the run it replays."""

    run_id: str
    source_run_id: str
    status: str
    source_status: str
    answer: str | None
    source_answer: str | None
    same_answer: bool
    diverged: bool = Field(description="Anything differed: exit 0 of `fleet-rlm replay` only when false.")
    first_divergence: FirstDivergence | None
    divergences: int = Field(description="Steps that differ, and calls the record could not answer as asked.")
    steps: list[StepMatch]


def replay_report(
    replay: RunRecord, events: list[Event], source: RunRecord, source_events: list[Event]
) -> ReplayReport:
    """Compare the replay's events with its source's: per step, then the first place they part."""
    ours, theirs = build_trace(events)["nodes"], build_trace(source_events)["nodes"]
    diverged = [e for e in events if e["kind"] == "replay.diverged"]
    prompts = {(e["node"], e["data"]["step"]) for e in diverged if e["data"]["reason"] == "prompt"}
    steps = [_match(node, step, ours, theirs, prompts) for node, step in _all_steps(ours, theirs)]
    first = _first(events, theirs, steps)
    same_answer = replay.answer == source.answer
    if first is None and not same_answer and replay.status not in ACTIVE_STATUSES:
        first = FirstDivergence(node="root", step=0, reason="answer", detail="every step matched; the answers differ")
    different = sum(not (s.recorded and s.replayed and s.code_same and s.output_same and s.prompt_same) for s in steps)
    return ReplayReport(
        run_id=replay.id, source_run_id=source.id, status=replay.status, source_status=source.status,
        answer=replay.answer, source_answer=source.answer, same_answer=same_answer, diverged=first is not None,
        first_divergence=first, divergences=different + sum(e["data"]["reason"] != "prompt" for e in diverged),
        steps=steps,
    )  # fmt: skip


def _all_steps(ours: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, int]]:
    found = {(name, s["step"]) for nodes in (ours, theirs) for name, n in nodes.items() for s in n["steps"]}
    return sorted(found, key=lambda key: (key[0].count("."), key[0], key[1]))


def _step(nodes: dict[str, Any], node: str, step: int) -> dict[str, Any] | None:
    return next((s for s in (nodes.get(node) or {}).get("steps", []) if s["step"] == step), None)


def _match(node: str, step: int, ours: dict[str, Any], theirs: dict[str, Any], prompts: set[Any]) -> StepMatch:
    mine, recorded = _step(ours, node, step), _step(theirs, node, step)
    both = mine is not None and recorded is not None
    return StepMatch(
        node=node, step=step, recorded=recorded is not None, replayed=mine is not None,
        code_same=both and mine["code"] == recorded["code"],  # type: ignore[index]
        output_same=both and mine["output"] == recorded["output"],  # type: ignore[index]
        prompt_same=(node, step) not in prompts,
    )  # fmt: skip


def _first(events: list[Event], theirs: dict[str, Any], steps: list[StepMatch]) -> FirstDivergence | None:
    """The earliest difference in the replay's own order: a divergence its tape noticed, or a step
    whose code or output differs from the record's; failing those, a recorded step it never took."""
    for event in events:
        node = event["node"]
        if event["kind"] == "replay.diverged":
            data = event["data"]
            return FirstDivergence(node=node, step=data["step"], reason=data["reason"], detail=data["detail"])
        if event["kind"] != "code.executed":
            continue
        step = event["data"].get("step", 0)
        recorded = _step(theirs, node, step)
        if recorded is None:
            return FirstDivergence(node=node, step=step, reason="code", detail="the recorded run has no such step")
        if event["data"].get("code") != recorded["code"]:
            return FirstDivergence(node=node, step=step, reason="code", detail="the step ran other code")
        if event["data"].get("output") != recorded["output"]:
            detail = _difference(str(recorded["output"] or ""), event["data"])
            return FirstDivergence(node=node, step=step, reason="output", detail=detail)
    missing = next((s for s in steps if s.recorded and not s.replayed), None)
    if missing is not None and any(e["kind"] == "run.finished" for e in events):
        return FirstDivergence(node=missing.node, step=missing.step, reason="ended",
                               detail="the replay stopped before this recorded step")  # fmt: skip
    return None


def _difference(recorded: str, step: dict[str, Any]) -> str:
    """Why a step's output differs: the error it raised now, else where the two texts part."""
    error = (step.get("error") or "").strip()
    if error:
        return f"the step failed: {error.splitlines()[-1][:300]}"
    now = str(step.get("output") or "")
    at = next((i for i, (a, b) in enumerate(zip(recorded, now, strict=False)) if a != b), min(len(recorded), len(now)))
    start = max(0, at - 20)
    return f"the output differs from character {at}: recorded {_clip(recorded[start:])}, now {_clip(now[start:])}"


def _clip(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")
