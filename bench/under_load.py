"""``python -m bench.under_load [--runs N] [--hogs K] -- COMMAND...``: run a command N times in a row
while K busy loops compete for the cores, and report each run's exit status and time.

This is how the suite is checked to hold on a shared machine (docs/benchmarks.md): e.g.
``python -m bench.under_load --runs 5 -- uv run pytest -q``. The hogs are plain CPU-bound processes,
started before each run and stopped after it, so every run meets the same competition.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def _spin() -> None:
    while True:
        pass


def run_under_load(command: list[str], runs: int, hogs: int) -> list[tuple[int, float]]:
    """(exit status, seconds) of each run of ``command``, each with ``hogs`` busy loops beside it."""
    results = []
    for n in range(1, runs + 1):
        loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(hogs)]
        for loop in loops:
            loop.start()
        started = time.monotonic()
        try:
            status = subprocess.call(command)
        finally:
            for loop in loops:
                loop.kill()
                loop.join()
        seconds = time.monotonic() - started
        results.append((status, seconds))
        print(f"under_load: run {n}/{runs} exit {status} in {seconds:.0f} s", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.under_load", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="how many runs in a row (default 5)")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy loops (default: one a core)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- uv run pytest -q")
    results = run_under_load(command, args.runs, args.hogs)
    failed = sum(1 for status, _ in results if status != 0)
    print(f"under_load: {len(results) - failed} of {len(results)} runs passed under {args.hogs} busy loops")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
