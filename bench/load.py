"""``fleet web`` under load: many runs started at once over the JSON API, against the simulated
model (50 ms per reply), each run followed over SSE to its ``run.finished``; then a second wave.

Each run looks at its input, makes one batch of 16 sub-queries and SUBMITs the count answered
right (``workloads.load``). Measured, against the real server process:

* outcomes: every run succeeded with the right answer and its subscriber saw every event, seq
  1 to ``run.finished`` without a gap; no request failed and none was answered with a 5xx;
* wall time, first POST to last ``run.finished``, against the model-bound floor: what the scripted
  latencies force on one run, (root steps + ceil(batch / FLEET_CONCURRENCY)) x latency. The runs
  are independent, so a wave of them at once has the same floor;
* the server's resident memory: idle, peak during the first wave (per concurrent run), and after
  each wave (the second must not leave more than the first);
* event-loop lag: ``/health`` latency (``bench.probe``, its own process) during the waves against
  idle, p99;
* SSE delivery: each event from being stored (its ``ts``) to its arrival at its run's subscriber,
  p95, against the same for runs started one at a time;
* what is left once the waves ended: the server's open descriptors against idle, and sandboxes
  (local: processes below the server; Daytona: the double's sandboxes and their processes).

``fault_wave`` is the same wave with faults injected (a sandbox worker killed, the model failing
for a second, a volume filled past its quota); ``tests/bench/test_load_faults.py`` asserts its
outcomes, read back from the store's SQLite file (``stored_runs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import procs, web
from bench import workloads as wl
from bench.runtimes import FLEET_CONCURRENCY, ROOT
from bench.simlm import SimLM

LATENCY = 0.05
SETTLE_SECONDS = 10.0  # how long what a wave leaves may take to go once its last run finished

OnEvent = Callable[["Followed", dict[str, Any]], None]


@dataclass
class Followed:
    """One run as its SSE subscriber saw it."""

    run_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    delays_ms: list[float] = field(default_factory=list)  # events stored after it subscribed
    state: dict[str, Any] = field(default_factory=dict)  # GET /api/runs/{id} once it finished

    @property
    def complete(self) -> bool:
        """Every event, seq 1 to run.finished, each once and in order."""
        seqs = [e["seq"] for e in self.events]
        return bool(seqs) and seqs == list(range(1, len(seqs) + 1)) and self.events[-1]["kind"] == "run.finished"


@dataclass
class Wave:
    attempted: int
    runs: list[Followed]
    seconds: float
    failures: list[str]  # requests that raised or were answered with a 5xx
    peak_rss_kb: int = 0


def floor_seconds(job: wl.Workload, latency: float = LATENCY, concurrency: int = FLEET_CONCURRENCY) -> float:
    """The model-bound floor of one run: one reply per root step, ceil(n / concurrency) per batch."""
    return (len(job.steps) + math.ceil(job.subcalls / concurrency)) * latency


def run_body(job: wl.Workload, index: int, **extra: Any) -> dict[str, Any]:
    question = f"{job.question} (run {index})"
    return {"question": question, "context_text": [f"input of run {index}"], "max_iters": job.max_iters, **extra}


async def follow(client: httpx.AsyncClient, body: dict[str, Any], on_event: OnEvent | None) -> Followed:
    """Start one run and read its events to run.finished; then its final state. A failed request
    raises RuntimeError naming which one."""
    run = Followed("")
    doing = "POST /api/runs"
    try:
        started = await client.post("/api/runs", json=body)
        started.raise_for_status()
        run.run_id = started.json()["run_id"]
        doing = "GET /api/runs/{id}/events"
        await _read_events(client, run, on_event)
        doing = "GET /api/runs/{id}"
        state = await client.get(f"/api/runs/{run.run_id}")
        state.raise_for_status()
    except httpx.HTTPError as exc:
        raise RuntimeError(f"{doing} (run {run.run_id or '-'}, {len(run.events)} events read): {exc!r}") from exc
    run.state = state.json()
    return run


async def _read_events(client: httpx.AsyncClient, run: Followed, on_event: OnEvent | None) -> None:
    async with client.stream("GET", f"/api/runs/{run.run_id}/events") as response:
        response.raise_for_status()
        subscribed = time.time()
        async for arrived, frame in web.sse_frames(response):
            data = next((line[6:] for line in frame.split("\n") if line.startswith("data: ")), None)
            if data is None:
                continue
            event = json.loads(data)
            run.events.append(event)
            if event["ts"] > subscribed:  # a replayed event waited for the subscriber, not the server
                run.delays_ms.append((arrived - event["ts"]) * 1000)
            if on_event is not None:
                on_event(run, event)


async def wave(server: web.WebServer, bodies: list[dict[str, Any]], on_event: OnEvent | None = None) -> Wave:
    """Every run of ``bodies`` at once, each followed by its own subscriber."""
    failures: list[str] = []

    async def count_5xx(response: httpx.Response) -> None:
        if response.status_code >= 500:
            failures.append(f"{response.request.method} {response.request.url.path}: {response.status_code}")

    # Idle connections expire well before the server's 5 s keep-alive (uvicorn's default): a client loop
    # starved past it by a busy machine would otherwise reuse one the server is closing (ReadError).
    limits = httpx.Limits(
        max_connections=2 * len(bodies) + 8, max_keepalive_connections=2 * len(bodies) + 8, keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(
        base_url=server.base, headers={"Authorization": f"Bearer {server.token}"}, timeout=300, limits=limits,
        event_hooks={"response": [count_5xx]},
    ) as client:  # fmt: skip
        began = time.perf_counter()
        results = await asyncio.gather(*(follow(client, b, on_event) for b in bodies), return_exceptions=True)
        seconds = time.perf_counter() - began
    failures += [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return Wave(len(bodies), [r for r in results if isinstance(r, Followed)], seconds, failures)


@contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    """Samples the process's resident memory every 50 ms while in the block; yields [peak KB]."""
    peak = [procs.rss_kb(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], procs.rss_kb(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


class Prober:
    """The ``bench.probe`` process: /health latency, sample by phase."""

    def __init__(self, port: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.probe", str(port)], cwd=ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def phase(self, name: str) -> None:
        assert self._proc.stdin
        self._proc.stdin.write(name + "\n")
        self._proc.stdin.flush()

    def close(self) -> dict[str, list[float]]:
        out, _ = self._proc.communicate(timeout=30)
        return json.loads(out)


def settle(count: Callable[[], int], limit: float = SETTLE_SECONDS) -> int:
    """Wait until ``count()`` is 0 (what a wave left drains away); its last value."""
    deadline = time.monotonic() + limit
    value = count()
    while value > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        value = count()
    return value


def percentile(values: list[float], q: int) -> float | None:
    """The q-th percentile (1-99), or None with too few values to say."""
    if len(values) < 2:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def right(run: Followed, expected: str) -> bool:
    return run.state.get("status") == "succeeded" and (run.state.get("answer") or "").strip() == expected


def measure_load(
    sim: SimLM, env: dict[str, str], runs: int, *, waves: int = 2, alone: int = 3, idle_seconds: float = 1.0,
    leftovers: Callable[[int], int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Start ``fleet web`` with ``env``; ``alone`` runs one at a time (the runtime warms up; the SSE
    baseline), then ``waves`` waves of ``runs`` at once. ``leftovers(server_pid)`` counts the
    sandboxes left after a wave (default: the processes below the server)."""
    job = wl.load()
    sim.play(job.tag, job.steps)
    sim.configure(LATENCY)
    count_left = leftovers or (lambda pid: len(procs.descendants(pid)))
    model_port = int(sim.base_url.split(":")[-1].split("/")[0])
    out: dict[str, Any] = {"runs_at_once": runs, "floor_s": floor_seconds(job)}
    try:
        with web.web_server(env) as server:
            lone, alone_cpu = [], []
            for k in range(1, alone + 1):
                with cpu_spent(server.pid, alone_cpu):
                    lone.append(asyncio.run(wave(server, [run_body(job, -k)])))
            prober = Prober(int(server.base.rsplit(":", 1)[1]))
            time.sleep(idle_seconds)  # the idle window the prober samples
            out["rss_kb"], out["fds"] = [procs.rss_kb(server.pid)], [_fds(server.pid, model_port)]
            done: list[Wave] = []
            wave_cpu: list[float] = []
            for _ in range(waves):
                prober.phase("wave")
                with peak_rss(server.pid) as peak, cpu_spent(server.pid, wave_cpu):
                    done.append(asyncio.run(wave(server, [run_body(job, i) for i in range(runs)])))
                prober.phase("after")
                done[-1].peak_rss_kb = peak[0]
                out.setdefault("left", []).append(settle(lambda: count_left(server.pid)))
                out["rss_kb"].append(procs.rss_kb(server.pid))
                out["fds"].append(_fds(server.pid, model_port))
            lag = prober.close()
    finally:
        sim.configure(0.0)
    out["alone"] = _outcome(lone, job)
    out.update(_outcome(done, job))
    out["seconds"] = [round(w.seconds, 3) for w in done]
    out["alone_seconds"] = [round(w.seconds, 3) for w in lone]
    # CPU per run (server and reaped sandboxes): steady however busy the machine is. The first run
    # alone warms the runtime up, so the later ones are the baseline.
    out["cpu_per_run_s"] = {"alone": [round(c, 3) for c in alone_cpu], "wave": [round(c / runs, 3) for c in wave_cpu]}
    out["peak_rss_kb"] = [w.peak_rss_kb for w in done]
    out["lag_p99_ms"] = {phase: percentile(samples, 99) for phase, samples in lag.items()}
    out["lag_samples"] = {phase: len(samples) for phase, samples in lag.items()}
    out["sse_p95_ms"] = {
        "alone": percentile([d for w in lone for r in w.runs for d in r.delays_ms], 95),
        "load": percentile([d for w in done for r in w.runs for d in r.delays_ms], 95),
    }
    return out


@contextmanager
def cpu_spent(pid: int, into: list[float]) -> Iterator[None]:
    """Append the CPU seconds ``pid`` (with its reaped children) spends inside the block to ``into``."""
    before = procs.cpu_seconds(pid)
    yield
    into.append(procs.cpu_seconds(pid) - before)


def _fds(pid: int, model_port: int) -> dict[str, int]:
    """Open descriptors, the model client's pooled connections apart (the pool is bounded on its
    own and grows with the most calls ever in flight at once)."""
    pooled = procs.connections_to(pid, model_port)
    return {"other": procs.open_fds(pid) - pooled, "model_connections": pooled}


def _outcome(waves: list[Wave], job: wl.Workload) -> dict[str, Any]:
    """How many runs ended right, with every event, and what went wrong with the others."""
    runs = [r for w in waves for r in w.runs]
    failures = [f for w in waves for f in w.failures]
    wrong = [f"{r.run_id}: {r.state.get('status')} {r.state.get('error') or r.state.get('answer')!r}"
             for r in runs if not right(r, job.expected)]  # fmt: skip
    return {
        "attempted": sum(w.attempted for w in waves),
        "succeeded": sum(right(r, job.expected) for r in runs),
        "complete_streams": sum(r.complete for r in runs),
        "failures": failures[:10] + wrong[:10],
    }


@contextmanager
def daytona_double(data: Path) -> Iterator[tuple[str, int]]:
    """The Daytona API double (``tests/support/daytona_api.py``) in its own process, so the
    benchmark's client loop does not slow it; yields its API URL and its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.daytona_api", "--port", "0", "--data", str(data)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        if " on " not in first:
            raise RuntimeError(f"the Daytona API double did not start (exit {proc.poll()})")
        yield first.split(" on ", 1)[1].split()[0], proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def double_leftovers(api_url: str, double_pid: int) -> int:
    """Sandboxes the double still holds, plus the REPL processes below it."""
    state = httpx.get(api_url.removesuffix("/api") + "/_double/state", timeout=30).json()
    return len(state["sandboxes"]) + len(procs.descendants(double_pid))


# -- the fault wave -------------------------------------------------------------------------------

QUOTA_MB = 1
OUTAGE = [429] * 30 + [500] * 30  # the model refuses 60 requests in a row: rate limit, then error


@dataclass
class FaultWave:
    wave: Wave
    victim: str = ""  # the run whose sandbox worker was killed
    killed_pid: int | None = None
    writer: str = ""  # the run that wrote past its volume's quota
    left: int = 0  # processes below the server once the wave ended


def fault_wave(sim: SimLM, env: dict[str, str], runs: int, volume: str = "fill") -> FaultWave:
    """A wave of ``runs`` at once (``env`` must set FLEET_VOLUME_QUOTA_MB to QUOTA_MB) where one run's
    sandbox worker is killed with SIGKILL mid-step, one run writes past its volume's quota, and the
    model fails the next 60 requests (OUTAGE) once the wave is in full flow (as many root calls made
    as there are runs), sparing the two runs that meet the other faults; the rest are load runs. Each
    fault is set off by a count, never a clock, so a busy machine meets the same faults.

    The load runs name a volume of their own: a run that names none mounts every volume, and may
    be the one told that the writer's file was trimmed (docs/benchmarks.md, the fault wave)."""
    job, victim, writer = wl.load(), wl.stuck(), wl.overfill(volume, 2 * QUOTA_MB)
    for w in (job, victim, writer):
        sim.play(w.tag, w.steps)
    sim.configure(LATENCY)
    sim.outage(after=runs, statuses=OUTAGE, spare=(victim.tag, writer.tag))
    bodies = [run_body(victim, 0, volume="work"), run_body(writer, 1, volume=volume)]
    bodies += [run_body(job, i, volume="work") for i in range(2, runs)]
    out = FaultWave(Wave(0, [], 0.0, []))
    try:
        with web.web_server(env) as server:

            def strike(run: Followed, event: dict[str, Any]) -> None:
                if event["kind"] == "run.started":
                    question = event["data"]["question"]
                    out.victim = run.run_id if victim.tag in question else out.victim
                    out.writer = run.run_id if writer.tag in question else out.writer
                if event["kind"] != "lm.call":
                    return
                if run.run_id == out.victim and event["data"]["step"] == 2:  # its step 2 sleeps in the sandbox
                    out.killed_pid = kill_worker(server.pid, run.run_id)

            out.wave = asyncio.run(wave(server, bodies, on_event=strike))
            out.left = settle(lambda: len(procs.descendants(server.pid)))
    finally:
        sim.configure(0.0)
        sim.reset()
    return out


def kill_worker(server_pid: int, run_id: str) -> int | None:
    """SIGKILL the Python worker of ``run_id``'s root sandbox (under bubblewrap or not); its pid."""
    table = procs.table()
    below = procs.descendants(server_pid, table)
    sandbox = next((p for p in below if any(run_id in arg for arg in procs.cmdline(p.pid))), None)
    if sandbox is None:
        return None
    for proc in [sandbox, *procs.descendants(sandbox.pid, table)]:
        args = procs.cmdline(proc.pid)
        if args and not args[0].endswith("bwrap") and any(a.endswith("worker.py") for a in args):
            os.kill(proc.pid, signal.SIGKILL)
            return proc.pid
    return None


def stored_runs(db: Path) -> dict[str, dict[str, Any]]:
    """What the store holds, read straight from its SQLite file: each run's row and event kinds by seq."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT id, status, answer, error, stop_reason FROM runs").fetchall()
        runs = {r[0]: {"status": r[1], "answer": r[2], "error": r[3], "stop_reason": r[4], "events": []}
                for r in rows}  # fmt: skip
        events = conn.execute("SELECT run_id, seq, kind, data_json FROM events ORDER BY run_id, seq")
        for run_id, seq, kind, data in events:
            runs[run_id]["events"].append((seq, kind, json.loads(data)))
    return runs
