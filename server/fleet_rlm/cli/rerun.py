"""``replay`` and ``fork``: run a recorded run again from its record (docs/replay.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from fleet_rlm.cli.common import print_json, settings_for, status_exit
from fleet_rlm.cli.progress import Progress
from fleet_rlm.errors import UserError

DIVERGED = 1  # `replay`'s exit status when anything differed (0: nothing did)


def cmd_replay(args: argparse.Namespace) -> int:
    if bool(args.run_ids) == args.all:
        raise UserError("name the runs to replay, or give --all (with --since DATE) for every finished run")
    if args.since is not None and not args.all:
        raise UserError("--since chooses runs for --all: give --all too, or name the runs")
    reports, skipped = asyncio.run(_replay(args))
    if args.json:
        print_json({"replays": [r.model_dump(mode="json") for r in reports], "skipped": skipped}
                   if args.all or len(args.run_ids) > 1 else reports[0].model_dump(mode="json"))  # fmt: skip
    elif len(reports) == 1 and not args.all:
        _print_report(reports[0])
    else:
        _print_summary(reports, skipped)
    return DIVERGED if any(r.diverged for r in reports) else 0


async def _replay(args: argparse.Namespace) -> tuple[list[Any], list[dict[str, str]]]:
    """Replay each run in turn; with --all, a run that cannot be replayed is skipped with its reason."""
    from fleet_rlm.core.engine import Engine

    reports, skipped = [], []
    async with Engine(settings_for(args)) as engine:
        run_ids = args.run_ids or engine.workspace.finished_runs_since(args.since or 0.0)
        for run_id in run_ids:
            try:
                replay_id = await engine.replay(run_id)
            except UserError as exc:
                if not args.all:
                    raise
                skipped.append({"run_id": run_id, "reason": exc.message})
                continue
            await Progress("off" if args.all else "compact").follow(engine, replay_id)
            await engine.wait(replay_id)
            reports.append(engine.workspace.replay_report(replay_id))
    return reports, skipped


def _print_report(report: Any) -> None:
    verdict = "nothing diverged" if not report.diverged else "DIVERGED"
    answer = "same answer" if report.same_answer else "a different answer"
    print(f"replay {report.run_id} of {report.source_run_id}: {report.status}, {answer}, {verdict}")
    for s in report.steps:
        marks = [f"{name} {'ok' if same else 'DIFFERS'}" for name, same in
                 (("code", s.code_same), ("output", s.output_same), ("prompt", s.prompt_same))]  # fmt: skip
        if not s.replayed:
            marks = ["not reached in the replay"]
        elif not s.recorded:
            marks = ["not in the record"]
        print(f"  {s.node} step {s.step}: {', '.join(marks)}")
    first = report.first_divergence
    if first is not None:
        print(f"first divergence: {_where(first)}: {first.detail}")
    if not report.same_answer:
        print(f"answer: recorded {report.source_answer!r}, now {report.answer!r}")


def _print_summary(reports: list[Any], skipped: list[dict[str, str]]) -> None:
    for r in reports:
        first = r.first_divergence
        outcome = "same" if first is None else f"diverged at {_where(first)}"
        print(f"{r.source_run_id} -> {r.run_id}  {outcome}")
    for s in skipped:
        print(f"{s['run_id']} skipped: {s['reason']}")
    diverged = sum(r.diverged for r in reports)
    print(f"{len(reports)} replayed, {diverged} diverged, {len(skipped)} skipped", file=sys.stderr)


def _where(first: Any) -> str:
    return "the inputs" if first.reason == "inputs" else f"{first.node} step {first.step} ({first.reason})"


def cmd_fork(args: argparse.Namespace) -> int:
    code = _read_code(args.code) if args.code is not None else None  # a missing file is said before dspy loads
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.views import lineage_line

    async def go() -> Any:
        async with Engine(settings_for(args)) as engine:
            fork_id = await engine.fork(
                args.run_id, args.at, code=code, instruction=args.instruction, max_iters=args.max_iters
            )
            await Progress("compact").follow(engine, fork_id)
            result = await engine.wait(fork_id)
            return result, engine.workspace.run_state(fork_id)

    result, state = asyncio.run(go())
    if args.json:
        print_json(result.to_dict() | {"parent_run_id": state.parent_run_id, "fork_at": state.fork_at})
        return status_exit(result.status)
    if result.answer is not None:
        print(result.answer)
    print(f"[{result.status} · run {result.run_id} · {lineage_line(state.kind, state.parent_run_id, state.fork_at)}"
          f" · {result.llm_calls} model calls, {result.usage.get('total', {}).get('calls', 0)} of them live]",
          file=sys.stderr)  # fmt: skip
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
    return status_exit(result.status)


def _read_code(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise UserError(f"cannot read the code file '{source}': {reason}") from None
