"""The runtimes under comparison, each run as its users run it: one process per question, timed
from spawn to exit (wall time, as a user sees it).

* ``fleet``: this project's CLI, ``fleet-rlm run ... --json``.
* ``stock``: ``dspy.RLM`` with ``LocalInterpreter`` (``bench/drivers/stock_rlm.py``).
* ``rlms``: the reference package, installed at bench time into its own virtual environment under
  ``~/.cache/fleet-rlm-bench`` (never into this project's lock); when that fails, its rows say why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import tree_rss_kb
from bench.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ROOT / "bench" / "drivers"
RLMS_VERSION = "0.1.3"
RLMS_HOME = Path(os.environ.get("FLEET_BENCH_CACHE", Path.home() / ".cache" / "fleet-rlm-bench")) / "rlms"
FLEET_CONCURRENCY = 16  # the default FLEET_CONCURRENCY, stated so the physical limit is known
# A model the price table knows, as a hosted model's name would be (the server ignores it). An
# unknown name makes dspy 3.4.1 scan its whole model catalogue twice per call (~1-2 ms each).
MODEL = "openai/gpt-4o-mini"


@dataclass
class Outcome:
    answer: str | None
    seconds: float
    peak_rss_mb: float | None = None
    error: str | None = None


def measure(cmd: list[str], env: dict[str, str], timeout: float, track_memory: bool = False) -> Outcome:
    """Run one process; the answer is the ``answer`` field of the JSON on its stdout."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def poll() -> None:  # only when asked: polling /proc costs CPU the runtime would otherwise have
        while not done.wait(0.05):
            peak[0] = max(peak[0], tree_rss_kb(proc.pid))

    watcher = threading.Thread(target=poll, daemon=True) if track_memory else None
    if watcher:
        watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Outcome(None, time.perf_counter() - started, error=f"timed out after {timeout:.0f} s")
    finally:
        done.set()
    seconds = time.perf_counter() - started
    peak_mb = peak[0] / 1024 if watcher else None
    try:
        result = json.loads(out.strip().splitlines()[-1])
        answer = result["answer"]
    except (IndexError, ValueError, KeyError, TypeError):
        tail = (err or out).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return Outcome(None, seconds, peak_mb, error=tail[0][:300])
    if answer is None:  # the runtime's own account of why (fleet-rlm's --json has error and stop_reason)
        why = result.get("error") or result.get("stop_reason") or f"no answer, exit code {proc.returncode}"
        return Outcome(None, seconds, peak_mb, error=str(why)[:300])
    return Outcome(str(answer), seconds, peak_mb)


class Runtime:
    name = ""
    unavailable: str | None = None  # why this runtime cannot run here, if it cannot

    def command(self, job: Workload, context: Path, base_url: str) -> list[str]:
        raise NotImplementedError

    def env(self, base_url: str) -> dict[str, str]:
        return {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def run(
        self, job: Workload, context: Path, base_url: str, *, timeout: float = 600, track_memory: bool = False
    ) -> Outcome:
        if self.unavailable:
            return Outcome(None, 0.0, error=self.unavailable)
        return measure(self.command(job, context, base_url), self.env(base_url), timeout, track_memory)


class Fleet(Runtime):
    name = "fleet"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.exe = shutil.which("fleet-rlm", path=str(Path(sys.executable).parent)) or "fleet-rlm"

    def env(self, base_url: str) -> dict[str, str]:
        return {
            **super().env(base_url),
            "FLEET_HOME": str(self.home),
            "FLEET_LM_MODEL": MODEL,
            "FLEET_LM_API_BASE": base_url,
            "FLEET_LM_API_KEY": "sk-bench",
            "FLEET_LM_RETRIES": "0",
            "FLEET_NO_KEYRING": "1",
            "FLEET_CONCURRENCY": str(FLEET_CONCURRENCY),
        }

    def command(self, job: Workload, context: Path, base_url: str) -> list[str]:
        return [
            self.exe,
            "run",
            job.question,
            "-c",
            str(context),
            "--json",
            "--max-iters",
            str(job.max_iters),
            "--max-llm-calls",
            str(job.max_iters + job.subcalls * 2 + 10),
        ]


class Stock(Runtime):
    name = "stock"

    def command(self, job: Workload, context: Path, base_url: str) -> list[str]:
        return [
            sys.executable,
            str(DRIVERS / "stock_rlm.py"),
            MODEL,
            base_url,
            job.question,
            str(context),
            str(job.max_iters),
            str(job.subcalls + 10),
        ]


class Rlms(Runtime):
    name = "rlms"

    def __init__(self, install: bool) -> None:
        self.python = RLMS_HOME / "bin" / "python"
        self.unavailable = None if install else "skipped in --quick mode (run without --quick, or pass --rlms)"
        if install:
            self.unavailable = ensure_rlms(self.python)

    def command(self, job: Workload, context: Path, base_url: str) -> list[str]:
        depth = "2" if "rlm_query" in "".join(job.steps) else "1"
        return [
            str(self.python),
            str(DRIVERS / "rlms_run.py"),
            base_url,
            job.question,
            str(context),
            str(job.max_iters),
            depth,
        ]


def ensure_rlms(python: Path) -> str | None:
    """Install ``rlms`` into its own venv once; None when ready, else the reason it is not."""
    probe = [str(python), "-c", f"import importlib.metadata as m; assert m.version('rlms') == '{RLMS_VERSION}'"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return None
    uv = shutil.which("uv")
    if uv is None:
        return "not installed: uv is needed to create its virtual environment"
    steps = [
        [uv, "venv", "--quiet", "--python", sys.executable, str(RLMS_HOME)],
        [uv, "pip", "install", "--quiet", "--python", str(python), f"rlms=={RLMS_VERSION}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
            return f"not installed ({' '.join(step[:3])} failed: {last[:200]})"
    return None
