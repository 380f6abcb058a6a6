"""The CLI against the floors it stands on (the `cli` figure): `fleet-rlm run` from spawn to the model
server receiving its first call, against `python -c "import dspy"` (the runtime a run imports before
it can ask anything); each read command from spawn to exit, against `python -c "import sqlite3, json"`
(what any program that reads a SQLite store and prints JSON imports). Each command runs back to back
with its floor, so a busy moment slows both; the minimum of the repeats is kept."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from bench.simlm import SimLM

IMPORT_DSPY = [sys.executable, "-c", "import dspy"]
READ_FLOOR = [sys.executable, "-c", "import sqlite3, json"]
# `last` is the newest run: the figure's own runs put one there.
READ_COMMANDS = {
    "runs": ["runs"],
    "trace": ["trace", "last"],
    "export": ["export", "last"],
    "volumes ls": ["volumes", "ls"],
    "config list": ["config", "list"],
}


def spawn(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``cmd``; raises when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {last[:300]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def first_call_seconds(cmd: list[str], env: dict[str, str], sim: SimLM) -> float:
    """Seconds from spawning a `fleet-rlm run` to the server receiving its first root call. The server
    stamps calls with ``time.monotonic()``, the same clock as here on Linux (CLOCK_MONOTONIC)."""
    sim.reset()
    started = time.monotonic()
    spawn(cmd, env)
    calls = sim.stats()["root"]["started"]
    if not calls:
        raise RuntimeError("the run finished without asking the model")
    return calls[0] - started


@dataclass
class CliTimes:
    """Minimum seconds of each command and of its floor, over interleaved repeats."""

    first_call: float
    import_dspy: float
    samples: dict[str, list[float]]  # every repeat's wall seconds of the run and of import dspy, in order
    reads: dict[str, tuple[float, float]]  # command -> (wall, CPU)
    read_floor: tuple[float, float]  # (wall, CPU)


def measure(run_cmd: list[str], env: dict[str, str], sim: SimLM, repeats: int) -> CliTimes:
    firsts, imports = [], []
    for _ in range(repeats):
        firsts.append(first_call_seconds(run_cmd, env, sim))
        imports.append(spawn(IMPORT_DSPY, env)[0])
    reads: dict[str, list[tuple[float, float]]] = {name: [] for name in READ_COMMANDS}
    floor: list[tuple[float, float]] = []
    exe = run_cmd[0]
    for _ in range(repeats):
        for name, args in READ_COMMANDS.items():
            reads[name].append(spawn([exe, *args], env))
            floor.append(spawn(READ_FLOOR, env))
    return CliTimes(
        min(firsts),
        min(imports),
        {"first_call": [round(x, 3) for x in firsts], "import_dspy": [round(x, 3) for x in imports]},
        {name: _minima(times) for name, times in reads.items()},
        _minima(floor),
    )


def _minima(times: list[tuple[float, float]]) -> tuple[float, float]:
    return min(w for w, _ in times), min(c for _, c in times)
