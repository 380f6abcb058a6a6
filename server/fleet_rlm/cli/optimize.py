"""``dataset``, ``optimize`` and ``programs``: datasets of judged questions, optimizations of the
RLM program over them, and the program versions they yield (docs/optimization.md).

Only ``optimize`` opens the Engine (it replays rows as runs); the others read and write the store.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from fleet_rlm.cli.common import limit_overrides, open_workspace, print_json, settings_for, status_exit
from fleet_rlm.cli.progress import LiveLine
from fleet_rlm.errors import UserError

if TYPE_CHECKING:
    from fleet_rlm.optimize.views import DatasetDetail


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json")


# -- dataset ------------------------------------------------------------------------------------


def cmd_dataset(args: argparse.Namespace) -> int:
    return {"import": _dataset_import, "export": _dataset_export, "ls": _dataset_ls, "show": _dataset_show}[
        args.action
    ](args)


def _dataset_import(args: argparse.Namespace) -> int:
    from fleet_rlm.optimize import datasets

    if bool(args.file) == bool(args.feedback):
        raise UserError("give a JSONL file (or - for stdin) or --feedback (runs people judged), not both")
    rows: list[dict[str, Any]] = []
    if args.file == "-":
        rows = datasets.parse_jsonl(sys.stdin, Path.cwd())
    elif args.file:
        path = Path(args.file).expanduser()
        if not path.is_file():
            raise UserError(f"'{args.file}' is not a file: give a JSONL file, one JSON object per line")
        with path.open(encoding="utf-8") as lines:
            rows = datasets.parse_jsonl(lines, path.resolve().parent)

    async def save() -> DatasetDetail:
        with open_workspace() as ws:
            if args.feedback:
                return await datasets.create_from_feedback(ws, args.name, holdout=args.holdout, seed=args.seed)
            return await datasets.create(ws, args.name, rows, source="jsonl", holdout=args.holdout, seed=args.seed)

    made = asyncio.run(save())
    if args.json:
        print_json(_dump(made))
    else:
        print(f"dataset {made.name}: {made.train} train and {made.holdout} holdout rows")
        for reason in made.skipped:
            print(f"skipped {reason}", file=sys.stderr)
    return 0


def _dataset_export(args: argparse.Namespace) -> int:
    from fleet_rlm.optimize import datasets

    with open_workspace() as ws:
        for line in datasets.export_lines(ws, args.name):
            sys.stdout.write(line)
    return 0


def _dataset_ls(args: argparse.Namespace) -> int:
    from fleet_rlm.optimize import datasets

    with open_workspace() as ws:
        found = datasets.list_datasets(ws).datasets
    if args.json:
        print_json([_dump(d) for d in found])
        return 0
    if not found:
        print("no datasets yet: `fleet-rlm dataset import FILE --name NAME` (or --feedback)")
    for d in found:
        print(f"{d.name:<24} {d.train:>5} train {d.holdout:>5} holdout  {d.source}")
    return 0


def _dataset_show(args: argparse.Namespace) -> int:
    from fleet_rlm.optimize import datasets

    with open_workspace() as ws:
        detail = datasets.detail(ws, args.name)
    if args.json:
        print_json(_dump(detail))
        return 0
    print(f"dataset {detail.name} ({detail.source}): {detail.train} train, {detail.holdout} holdout")
    for row in detail.rows:
        context = row.context_text if row.context_text is not None else ", ".join(row.context_paths) or "(none)"
        print(f"{row.idx:>4} {row.split:<7} {row.question[:60]!r} -> {row.answer[:40]!r}  context: {context[:40]!r}")
    return 0


# -- optimize -----------------------------------------------------------------------------------


class OptimizeProgress(LiveLine):
    """The progress view on stderr: trial, candidate, evaluations, scores (a live line on a TTY)."""

    redirect = False  # the streams are the optimizer's, routed by runner.show_library_output

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.trial, self.candidate, self.evaluations, self.cached, self.calls = 0, "", 0, 0, 0
        self.best: dict[int, list[float]] = {}

    def __rich__(self) -> Text:
        means = [sum(s) / len(s) for s in self.best.values() if s]
        best = f" · best mean {max(means):.2f}" if means else ""
        return Text(f"trial {self.trial} · candidate {self.candidate or '-'} · {self.evaluations} evaluations "
                    f"({self.cached} cached){best} · {self.calls} model calls · "
                    f"{time.monotonic() - self.started:.0f}s", style="cyan")  # fmt: skip

    def feed(self, event: dict[str, Any]) -> None:
        kind, data = event["kind"], event["data"]
        if kind == "optimize.eval":
            if data["trial"] != self.trial and not self.live:
                self.console.print(f"trial {data['trial']}: candidate {data['candidate']}")
            self.trial, self.candidate = data["trial"], data["candidate"]
            self.evaluations, self.cached, self.calls = data["evaluations"], self.cached + data["cached"], data[
                "llm_calls"]  # fmt: skip
            self.best.setdefault(data["trial"], []).append(data["score"])
        elif kind == "optimize.scored":
            self.console.print(f"{data['program']}: {data['split']} score {data['score']:.3f} ({data['n']} rows)")
        elif kind == "optimize.started":
            est = data["estimate"]
            cost = f", at most {est['cost']:g} USD" if est.get("cost") is not None else ""
            cap = f"; capped at {est['max_llm_calls']} calls" if est.get("max_llm_calls") else ""
            self.console.print(f"optimizing with {data['optimizer']} on {data['dataset']} ({data['train']} train, "
                               f"{data['holdout']} holdout): up to {est['evaluations']} replays, at most "
                               f"{est['llm_calls']:,} model calls{cost}{cap}")  # fmt: skip


def cmd_optimize(args: argparse.Namespace) -> int:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.optimize import runner

    req = runner.OptimizeRequest(
        dataset=args.dataset or "", optimizer=args.optimizer or "", metric=args.metric, base_version=args.base,
        trials=args.trials, max_llm_calls=args.max_calls, max_cost=args.max_total_cost, resume=args.resume,
        limits={k: v for k, v in limit_overrides(args).items() if v is not None},
    )  # fmt: skip
    if not args.resume and not (args.dataset and args.optimizer):
        raise UserError("give --dataset NAME and --optimizer gepa|mipro|bootstrap (or --resume ID)")
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # the terminal wraps long lines, at words
    runner.show_library_output(args.verbose)

    async def go() -> tuple[Any, Any]:
        async with Engine(settings_for(args)) as engine:
            opt_id, guess = await runner.start(engine, req)
            await OptimizeProgress(console).follow(engine, opt_id)
            return runner.state(engine.workspace, opt_id), guess

    final, guess = asyncio.run(go())
    if args.json:
        scores = final.scores
        print_json({
            "optimization_id": final.id, "status": final.status, "version_id": final.version_id,
            "scores": {"before": {"train": scores.train_before, "holdout": scores.holdout_before},
                       "after": {"train": scores.train_after, "holdout": scores.holdout_after}},
            "gate": final.gate, "evaluations": final.evaluations, "cached": final.cached,
            "estimate": _dump(guess), "error": final.error,
        })  # fmt: skip
    else:
        if final.version_id:
            print(final.version_id)
        s = final.scores
        console.print(f"[{final.status} · optimization {final.id} · train {_f(s.train_before)} -> {_f(s.train_after)}"
                      f" · holdout {_f(s.holdout_before)} -> {_f(s.holdout_after)} · {final.evaluations} evaluations "
                      f"({final.cached} cached)]")  # fmt: skip
        if final.version_id:
            passed = final.gate.get("passed")
            console.print(f"promotion gate: {'passes' if passed else 'fails'} ({final.gate.get('reason')}); "
                          f"`fleet-rlm programs promote {final.version_id}`")  # fmt: skip
        if final.error:
            console.print(f"error: {final.error}")
    return status_exit(final.status)


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


# -- programs -----------------------------------------------------------------------------------


def cmd_programs(args: argparse.Namespace) -> int:
    from fleet_rlm.optimize import versions

    with open_workspace() as ws:
        if args.action == "ls":
            listing = versions.list_versions(ws)
            if args.json:
                print_json(_dump(listing))
                return 0
            print(f"active: {listing.active}")
            for v in listing.versions:
                s = v.scores
                print(f"{'*' if v.active else ' '} {v.id}  {v.optimizer:<9} {v.metric:<10} train {_f(s.train_before)}"
                      f" -> {_f(s.train_after)}  holdout {_f(s.holdout_before)} -> {_f(s.holdout_after)}")  # fmt: skip
            return 0
        if args.action in ("show", "compare"):
            view = versions.show(ws, args.version) if args.action == "show" else versions.compare(
                ws, args.a, args.b)  # fmt: skip
            if args.json:
                print_json(_dump(view))
            else:
                print("\n".join(_version_lines(ws, view) if args.action == "show" else _comparison_lines(view)))
            return 0
        if args.action == "promote":
            try:
                shown = asyncio.run(
                    versions.promote(ws, args.version, override=args.override, tolerance=args.tolerance)
                )
            except versions.GateRefused as exc:
                raise versions.GateRefused(f"{exc.message} (--override REASON)") from None
            result = {"active": shown.id, "override": bool(args.override)}
        else:
            result = {"active": asyncio.run(versions.rollback(ws))}
    if args.json:
        print_json(result)
    else:
        print(f"active program: {result['active']}")
    return 0


DIFF_LINES = 20  # of each predictor's instruction diff, in the human view


def _version_lines(ws: Any, v: Any) -> list[str]:
    """A version for people: where it came from, its scores, what it changed (summarized)."""
    from fleet_rlm.optimize import datasets

    dataset = datasets.name_of(ws, v.dataset_id) if v.dataset_id else None
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.created_at))
    s = v.scores
    lines = [
        f"version {v.id}" + (" (active)" if v.active else ""),
        f"{v.optimizer} · metric {v.metric} · dataset {dataset} · base {v.base_id or 'builtin'} · {when}",
        f"train {_f(s.train_before)} -> {_f(s.train_after)} ({s.n_train} rows)",
        f"holdout {_f(s.holdout_before)} -> {_f(s.holdout_after)} ({s.n_holdout} rows)",
        f"promotion gate: {'passes' if v.gate.passed else 'fails'} ({v.gate.reason})",
    ]
    for name, change in v.changes.items():
        if "instructions" in change:
            lines.append(f"{name}: instructions now {_summary(change['instructions']['after'])}")
        if "demos" in change:
            lines.append(f"{name}: demos {len(change['demos']['before'])} -> {len(change['demos']['after'])}")
    if not v.changes:
        lines.append("no instruction or demo changed from its base")
    lines.append(f"(everything: fleet-rlm programs show {v.id} --json)")
    return lines


def _summary(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    cut = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    return f"{cut!r} ({len(text):,} characters)"


def _comparison_lines(c: Any) -> list[str]:
    """Two versions for people: scores after optimizing, instruction diffs (cut), demo counts."""
    width = max(len(c.a), len(c.b), 7)
    lines = [f"{c.a} vs {c.b}", f"{'':<8} {c.a:<{width}} {c.b}"]
    for split in ("train", "holdout"):
        a, b = (getattr(c.scores[v], f"{split}_after") for v in (c.a, c.b))
        lines.append(f"{split:<8} {_f(a):<{width}} {_f(b)}")
    for name, diff in c.instructions.items():
        if not diff:
            lines.append(f"{name}: instructions the same")
            continue
        body = diff.splitlines()[2:]  # without the ---/+++ header
        lines += [f"{name}: instructions differ:", *("  " + line for line in body[:DIFF_LINES])]
        if len(body) > DIFF_LINES:
            lines.append(f"  … {len(body) - DIFF_LINES} more lines (--json for all)")
    for name, demos in c.demos.items():
        lines.append(f"{name}: demos only in {c.a}: {len(demos['only_a'])}, only in {c.b}: {len(demos['only_b'])}, "
                     f"shared: {demos['shared']}")  # fmt: skip
    return lines
