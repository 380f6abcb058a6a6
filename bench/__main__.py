"""``python -m bench [--quick] [--json]``: this project against stock ``dspy.RLM`` and the reference
``rlms`` package, on the same workloads, against the same simulated model, in one run.

Writes ``bench/results/{quick,full}.{json,md}``, prints the markdown table (or the JSON with
``--json``), and exits 1 when a ratio crosses its bound in ``bench/bounds.toml``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.figures import FIGURES, Bench, Figure, measure
from bench.report import Bound, check_bounds, load_bounds, machine, render_markdown
from bench.runtimes import Fleet, Rlms, Stock
from bench.simlm import SimLM

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the CI guard: fewer sizes and repeats, rlms skipped")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of markdown")
    p.add_argument("--only", help="comma-separated figure ids: " + ", ".join(f.id for f in FIGURES))
    p.add_argument(
        "--rlms",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="include the rlms package (default: yes, except with --quick)",
    )
    p.add_argument("--bounds", type=Path, default=HERE / "bounds.toml")
    p.add_argument("--out", type=Path, default=HERE / "results", help="folder for the JSON and markdown")
    return p.parse_args(argv)


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    selected = set(args.only.split(",")) if args.only else {f.id for f in FIGURES}
    unknown = selected - {f.id for f in FIGURES}
    if unknown:
        raise SystemExit(
            f"unknown figure(s) {', '.join(sorted(unknown))}: choose from " + ", ".join(f.id for f in FIGURES)
        )
    bounds = load_bounds(args.bounds)
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    report: dict[str, Any] = {
        "mode": mode,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "command": shlex.join(["python", "-m", "bench", *argv]),
    }
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, SimLM() as sim:
        work = Path(tmp)
        runtimes = {
            "fleet": Fleet(work / "fleet-home"),
            "stock": Stock(),
            "rlms": Rlms(install=args.rlms if args.rlms is not None else not args.quick),
        }
        bench = Bench(args.quick, sim, runtimes, work)
        figures = []
        for figure in FIGURES:
            if figure.id in selected:
                print(f"bench: {figure.id} ...", file=sys.stderr, flush=True)
                figures.append(measure(figure, bench))
        report["figures"] = figures
        report["ratios"] = {k: v for fig in figures for k, v in fig["ratios"].items()}
        report["bounds"] = check_bounds(report["ratios"], bounds, mode, selected)
        remeasure(report, bench, bounds, mode, selected)
    report["ok"] = all(v["ok"] for v in report["bounds"])
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def remeasure(
    report: dict[str, Any],
    bench: Bench,
    bounds: list[Bound],
    mode: str,
    selected: set[str],
    figures: list[Figure] = FIGURES,
) -> None:
    """Measure each figure with a failing bound once more, and keep a ratio's second value where it
    passes: a busy moment on shared cores fails one measurement, a regression fails both. Both
    values stay in the report (``first_value``)."""
    failing = {v["figure"] for v in report["bounds"] if not v["ok"]}
    for figure in figures:
        if figure.id not in failing:
            continue
        print(f"bench: {figure.id} crossed a bound; measuring it again", file=sys.stderr, flush=True)
        again = measure(figure, bench)
        verdicts = check_bounds({**report["ratios"], **again["ratios"]}, bounds, mode, {figure.id})
        for ratio, value in again["ratios"].items():
            if all(v["ok"] for v in verdicts if v["ratio"] == ratio):
                report["ratios"][ratio] = value
        figure_entry = next(f for f in report["figures"] if f["id"] == figure.id)
        figure_entry["remeasured"] = again
    verdicts = check_bounds(report["ratios"], bounds, mode, selected)
    first_values = {v["ratio"]: v["value"] for v in report["bounds"]}
    for verdict in verdicts:
        if first_values.get(verdict["ratio"]) != verdict["value"]:
            verdict["first_value"] = first_values.get(verdict["ratio"])
    report["bounds"] = verdicts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report = run(args, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{report['mode']}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{report['mode']}.md").write_text(render_markdown(report))
    print(json.dumps(report, indent=2) if args.json else render_markdown(report))
    for verdict in report["bounds"]:
        if not verdict["ok"]:
            print(
                f"bench: bound failed: {verdict['ratio']} = {verdict['value']} (bound {verdict['bound']}): "
                f"{verdict['why']}",
                file=sys.stderr,
            )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
