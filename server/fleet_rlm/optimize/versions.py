"""Program versions: DSPy's saved state of the RLM program, with where it came from and how it
scored; which one is active (new runs use it); promotion behind a gate; rollback; comparison.

The active version is the top of a stack replayed from the activation history: a promotion pushes
a version, a rollback pops one (the bottom is the built-in program). Versions are never edited or
deleted, so every run's recorded version stays explainable.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import secrets
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from fleet_rlm.errors import Conflict, NotFound, UserError
from fleet_rlm.optimize.views import BUILTIN, Comparison, Gate, Scores, VersionDetail, VersionInfo, VersionList

if TYPE_CHECKING:
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.store import ProgramVersion

PREDICTORS = ("act", "extract")


class GateRefused(Conflict):
    """A promotion the gate refused. The message names no face's way to override: each face adds it
    (the CLI its ``--override`` flag)."""


def fingerprint(state: dict[str, Any]) -> str:
    """A program's identity: its instructions and demos, hashed (what the eval cache keys on)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def program_state(program: Any) -> dict[str, Any]:
    """What a version keeps of an RLMProgram: per predictor, DSPy's saved state (signature with
    its instructions, demos) without run-time leftovers."""
    state = program.dump_state()
    return {name: {k: v for k, v in pred.items() if k not in ("traces", "train")} for name, pred in state.items()}


def builtin_state() -> dict[str, Any]:
    from fleet_rlm.core.program import RLMProgram

    return program_state(RLMProgram())


def _instructions(state: dict[str, Any], name: str) -> str:
    return str(((state.get(name) or {}).get("signature") or {}).get("instructions") or "")


def _demos(state: dict[str, Any], name: str) -> list[Any]:
    return list((state.get(name) or {}).get("demos") or [])


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per predictor, the instructions and demos that differ: {"instructions": {before, after}, "demos": ...}."""
    out: dict[str, Any] = {}
    for name in PREDICTORS:
        diff: dict[str, Any] = {}
        if _instructions(before, name) != _instructions(after, name):
            diff["instructions"] = {"before": _instructions(before, name), "after": _instructions(after, name)}
        if _demos(before, name) != _demos(after, name):
            diff["demos"] = {"before": _demos(before, name), "after": _demos(after, name)}
        if diff:
            out[name] = diff
    return out


def new_version_id() -> str:
    return f"v{int(time.time() * 1000):x}{secrets.token_hex(3)}"


def state_of(workspace: Workspace, version: str | None) -> dict[str, Any]:
    if version in (None, BUILTIN):
        return builtin_state()
    state = require(workspace, version).state
    assert state is not None  # only listings leave a version's state out
    return state


def require(workspace: Workspace, version_id: str) -> ProgramVersion:
    row = workspace.store.optimize.get_program_version(version_id)
    if row is None:
        raise NotFound(f"no program version '{version_id}': list them with `fleet-rlm programs ls`")
    return row


def active(workspace: Workspace) -> str | None:
    """The version new runs use (None: the built-in program)."""
    stack = _stack(workspace)
    return stack[-1] if stack else None


def _stack(workspace: Workspace) -> list[str]:
    stack: list[str] = []
    for act in reversed(workspace.store.optimize.activations()):
        if act.action == "promote" and act.version_id:
            stack.append(act.version_id)
        elif act.action == "rollback" and stack:
            stack.pop()
    return stack


def _info(row: ProgramVersion, active_id: str | None) -> dict[str, Any]:
    scores = Scores(**(row.scores or {}))
    passed, why = gate(scores)
    return {
        "id": row.id, "base_id": row.base_id, "optimization_id": row.optimization_id,
        "dataset_id": row.dataset_id, "optimizer": row.optimizer, "metric": row.metric, "scores": scores,
        "gate": Gate(passed=passed, reason=why), "created_at": row.created_at, "active": row.id == active_id,
    }  # fmt: skip


def list_versions(workspace: Workspace) -> VersionList:
    current = active(workspace)
    store = workspace.store
    return VersionList(
        active=current or BUILTIN,
        versions=[VersionInfo(**_info(r, current)) for r in store.optimize.list_program_versions()],
        history=[asdict(a) for a in store.optimize.activations()],
    )


def show(workspace: Workspace, version_id: str) -> VersionDetail:
    row = require(workspace, version_id)
    return VersionDetail(**_info(row, active(workspace)), changes=row.changes or {})


def gate(scores: Scores, tolerance: float = 0.0) -> tuple[bool, str]:
    """A candidate passes if it improves the train score and does not lower the holdout score by
    more than ``tolerance`` (default: not at all)."""
    if scores.train_before is None or scores.train_after is None:
        return False, "no train scores recorded"
    if scores.train_after <= scores.train_before:
        return False, f"train score did not improve ({scores.train_before:.3f} -> {scores.train_after:.3f})"
    before, after = scores.holdout_before, scores.holdout_after
    if scores.n_holdout and before is not None and after is not None and after < before - tolerance:
        return False, f"holdout score dropped ({before:.3f} -> {after:.3f}, tolerance {tolerance:g})"
    return True, (f"train {scores.train_before:.3f} -> {scores.train_after:.3f}, holdout "
                  f"{_fmt(scores.holdout_before)} -> {_fmt(scores.holdout_after)}")  # fmt: skip


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


async def promote(
    workspace: Workspace, version_id: str, *, override: str | None = None, tolerance: float = 0.0
) -> VersionDetail:
    """Make the version active if it passes the gate, or with ``override`` (the reason, recorded)."""
    if tolerance < 0:
        raise UserError(f"tolerance must be 0 or more, not {tolerance}")
    row = require(workspace, version_id)
    if active(workspace) == version_id:
        raise Conflict(f"version '{version_id}' is already active")
    passed, why = gate(Scores(**(row.scores or {})), tolerance)
    reason = override.strip() if override else ""
    if not passed and not reason:
        raise GateRefused(f"version '{version_id}' does not pass the promotion gate: {why}; promote it anyway only "
                          "with a reason for the override, which is kept in the history")  # fmt: skip
    store = workspace.store
    await store.write(store.optimize.activate_program, version_id, "promote", f"override: {reason}" if reason else why)
    return show(workspace, version_id)


async def rollback(workspace: Workspace) -> str:
    """Make the version that was active before the current one active again; returns its id."""
    stack = _stack(workspace)
    if not stack:
        raise Conflict("nothing to roll back: the built-in program is active")
    previous = stack[-2] if len(stack) > 1 else None
    store = workspace.store
    await store.write(store.optimize.activate_program, previous, "rollback", f"rolled back {stack[-1]}")
    return previous or BUILTIN


def compare(workspace: Workspace, a: str, b: str) -> Comparison:
    """Scores side by side, a diff of each predictor's instructions, and which demos each has."""
    states = {v: state_of(workspace, v) for v in (a, b)}
    scores = {v: Scores() if v == BUILTIN else Scores(**(require(workspace, v).scores or {})) for v in (a, b)}
    instructions, demos = {}, {}
    for name in PREDICTORS:
        left, right = _instructions(states[a], name), _instructions(states[b], name)
        instructions[name] = "".join(difflib.unified_diff(left.splitlines(True), right.splitlines(True), a, b))
        da = {fingerprint(d): d for d in _demos(states[a], name)}
        db = {fingerprint(d): d for d in _demos(states[b], name)}
        demos[name] = {
            "only_a": [da[k] for k in da if k not in db],
            "only_b": [db[k] for k in db if k not in da],
            "shared": len(set(da) & set(db)),
        }
    return Comparison(a=a, b=b, scores=scores, instructions=instructions, demos=demos)
