"""The figures: a registry of what ``python -m bench`` measures, each a function of the shared
``Bench`` (the simulated model, the runtimes, a scratch folder) that returns table rows, raw data
and named ratios. A figure that cannot be measured in this version says so instead of a number;
adding one is adding a function to ``FIGURES``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import cli_latency, desktop, load, web
from bench import workloads as wl
from bench.coldstart import cli_help, mcp_first_reply_seconds
from bench.runtimes import FLEET_CONCURRENCY, MODEL, Outcome, Runtime
from bench.simlm import SimLM

STOCK_THREADS = 8  # dspy.RLM's llm_query_batched pool size, fixed in dspy 3.4.1


@dataclass
class Result:
    columns: list[str]
    rows: list[list[str]]
    data: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Bench:
    quick: bool
    sim: SimLM
    runtimes: dict[str, Runtime]
    work: Path
    _contexts: dict[str, Path] = field(default_factory=dict)

    def run(self, name: str, job: wl.Workload, **kwargs: Any) -> Outcome:
        """One run of a workload on one runtime (the server learns its policy first)."""
        self.sim.play(job.tag, job.steps)
        path = self._contexts.get(job.tag)
        if path is None:
            path = self.work / f"{len(self._contexts)}.txt"
            job.write_context(path)
            self._contexts[job.tag] = path
        return self.runtimes[name].run(job, path, self.sim.base_url, **kwargs)

    def usable(self) -> list[str]:
        return [name for name, rt in self.runtimes.items() if rt.unavailable is None]

    def skipped_notes(self) -> list[str]:
        return [f"{name}: {rt.unavailable}" for name, rt in self.runtimes.items() if rt.unavailable]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} ms"


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b not in (None, 0) else None


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def server_check(b: Bench) -> Result:
    """The server answers a kept-alive connection's later requests as fast as its first."""
    check = b.sim.keepalive_check()
    ratio = _ratio(check["later_median_ms"], check["first_ms"])
    rows = [
        ["first request (new connection)", _ms(check["first_ms"])],
        ["later requests, same connection (median)", _ms(check["later_median_ms"])],
    ]
    return Result(["request", "time"], rows, check, {"server.later_over_first": ratio})


def step_overhead(b: Bench) -> Result:
    """Wall time per step through the CLI at zero model latency: the 10th percentile of the intervals
    between one step's root request and the next, as the server sees them, over steps 10-60 of one run
    (steps 2-12 at 100 MB), the lowest of three runs. It is the time each step adds to the run (model
    client, prompt building, sandbox, events, progress output); start-up is left out by construction.
    A low percentile, not the median: a busy machine delays some steps of the three processes a step
    crosses here (one in stock), while work added to every step moves every interval."""
    sizes = {"1KB": (1_000, 60), "1MB": (1_000_000, 60), "10MB": (10_000_000, 60), "100MB": (100_000_000, 12)}
    if b.quick:
        sizes = {"1KB": (1_000, 60), "10MB": (10_000_000, 25)}
    names = b.usable()
    b.sim.configure(0.0)
    rows, data, ratios, notes = [], {}, {}, []
    for label, (size, steps) in sizes.items():
        job = wl.overhead(size, label, steps)
        skip = 10 if steps >= 60 else 2 if steps <= 12 else 5
        lows: dict[str, list[float]] = {name: [] for name in names}
        walls: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(3):  # interleaved, so drift in the machine's load hits every runtime alike
            for name in names:
                b.sim.reset()
                out = b.run(name, job, timeout=900)
                started = b.sim.stats()["root"]["started"]
                if out.answer != job.expected or len(started) < steps:
                    notes.append(f"{name} {label}: {out.error or out.answer!r}")
                    continue
                gaps = [later - earlier for earlier, later in itertools.pairwise(started[skip:])]
                lows[name].append(_percentile(gaps, 0.1) * 1000)
                walls[name].append(out.seconds)
        per_step = {name: min(m) if m else None for name, m in lows.items()}
        data[label] = {"ms_per_step": per_step, "p10_ms": lows, "run_seconds": walls}
        ratios[f"step.{label}.stock_over_fleet"] = _ratio(per_step.get("stock"), per_step.get("fleet"))
        if "rlms" in per_step:
            ratios[f"step.{label}.rlms_over_fleet"] = _ratio(per_step.get("rlms"), per_step.get("fleet"))
        rows.append(
            [label, f"{skip}-{steps}"]
            + [_ms(per_step.get(n)) for n in names]
            + [_x(ratios[f"step.{label}.stock_over_fleet"])]
        )
    return Result(["context", "steps", *names, "stock / fleet"], rows, data, ratios, notes)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fanout(b: Bench) -> Result:
    """One batch of n sub-calls at 100 ms: wall time in the REPL against ceil(n / concurrency) x latency."""
    latency = 0.1
    sizes = [256] if b.quick else [64, 256, 1024]
    b.sim.configure(latency)
    rows, data, ratios, notes = [], {}, {}, []
    for n in sizes:
        job = wl.fanout(n)
        for name in b.usable():
            best: tuple[float, int] | None = None
            for _ in range(2):  # the faster of two: a moment of shared cores slows one, a regression both
                b.sim.reset()
                out = b.run(name, job, timeout=600)
                count, seconds = wl.timed_answer(out.answer)
                peak = b.sim.stats()["max_in_flight"]
                if count != str(n) or seconds is None:
                    notes.append(f"{name} fan-out {n}: {out.error or out.answer!r}")
                elif best is None or seconds < best[0]:
                    best = (seconds, peak)
            if best is None:
                continue
            concurrency = {"fleet": FLEET_CONCURRENCY, "stock": STOCK_THREADS}.get(name, best[1])
            limit = math.ceil(n / concurrency) * latency
            data[f"{n}.{name}"] = {
                "seconds": best[0],
                "max_in_flight": best[1],
                "concurrency": concurrency,
                "limit": limit,
            }
            ratios[f"fanout.{n}.{name}_over_limit"] = _ratio(best[0], limit)
            # How many sub-calls were in flight at once, against the concurrency asked for: the
            # server counts it, so no load on the machine moves it; halved concurrency halves it.
            ratios[f"fanout.{n}.{name}_in_flight_over_concurrency"] = _ratio(best[1], concurrency)
            rows.append(
                [
                    str(n),
                    name,
                    f"{concurrency}",
                    f"{best[1]}",
                    f"{best[0]:.3f} s",
                    f"{limit:.2f} s",
                    _x(ratios[f"fanout.{n}.{name}_over_limit"]),
                ]
            )
        fleet, stock = data.get(f"{n}.fleet"), data.get(f"{n}.stock")
        ratios[f"fanout.{n}.stock_over_fleet"] = _ratio(stock and stock["seconds"], fleet and fleet["seconds"])
    b.sim.configure(0.0)
    columns = ["sub-calls", "runtime", "concurrency", "max in flight", "batch wall", "physical limit", "wall / limit"]
    return Result(columns, rows, data, ratios, notes)


def child_overhead(b: Bench) -> Result:
    """Cost of one child RLM beyond a plain sub-call: k sequential rlm_query vs k llm_query, timed in the REPL."""
    k = 3 if b.quick else 6
    b.sim.configure(0.0)
    rows, data, ratios, notes = [], {}, {}, []
    for name in b.usable():
        if name == "stock":
            notes.append("stock: dspy.RLM has no rlm_query (nested programs go through its dspy facade instead)")
            continue
        secs = {}
        for function in ("rlm_query", "llm_query"):
            job = wl.children(k, function)
            best = None
            for _ in range(2):
                count, seconds = wl.timed_answer(b.run(name, job, timeout=300).answer)
                if count == str(k) and seconds is not None:
                    best = seconds if best is None else min(best, seconds)
            secs[function] = best
        if secs["rlm_query"] is None or secs["llm_query"] is None:
            notes.append(f"{name}: the child workload did not complete")
            continue
        per_child = (secs["rlm_query"] - secs["llm_query"]) / k * 1000
        data[name] = {"per_child_ms": per_child, **secs}
        ratios[f"children.{name}_rlm_over_llm"] = _ratio(secs["rlm_query"], secs["llm_query"])
        rows.append([name, str(k), f"{secs['rlm_query']:.3f} s", f"{secs['llm_query']:.3f} s", _ms(per_child)])
    if "fleet" in data and "rlms" in data:
        ratios["children.rlms_over_fleet"] = _ratio(data["rlms"]["per_child_ms"], data["fleet"]["per_child_ms"])
    return Result(
        ["runtime", "children", "k x rlm_query", "k x llm_query", "overhead per child"], rows, data, ratios, notes
    )


def cold_start(b: Bench) -> Result:
    """Spawn to first useful output: `fleet-rlm --help` against bare Python; `fleet-mcp` against an empty MCP server."""
    repeats = 3 if b.quick else 7
    cli = cli_help(repeats)
    mcp_s, empty_s = mcp_first_reply_seconds(repeats)
    data = {"help_s": cli.wall, "python_s": cli.floor_wall, "help_cpu_s": cli.cpu, "python_cpu_s": cli.floor_cpu,
            "mcp_s": mcp_s, "empty_mcp_s": empty_s}  # fmt: skip
    ratios = {
        "cold.help_over_python": _ratio(cli.wall, cli.floor_wall),
        "cold.help_cpu_over_python": _ratio(cli.cpu, cli.floor_cpu),
        "cold.mcp_over_empty": _ratio(mcp_s, empty_s),
    }
    rows = [
        ["`fleet-rlm --help`", f"{cli.wall:.3f} s", f"{cli.floor_wall:.3f} s (`python -c pass`)",
         _x(ratios["cold.help_over_python"])],
        ["`fleet-rlm --help`, CPU time", f"{cli.cpu:.3f} s", f"{cli.floor_cpu:.3f} s (`python -c pass`)",
         _x(ratios["cold.help_cpu_over_python"])],
        ["`fleet-mcp` initialize + tools/list", f"{mcp_s:.3f} s", f"{empty_s:.3f} s (empty `MCPServer`)",
         _x(ratios["cold.mcp_over_empty"])],
    ]  # fmt: skip
    return Result(
        ["what", "fleet-rlm", "floor", "ratio"],
        rows,
        data,
        ratios,
        [
            "minimum over repeats, each command back to back with its floor; stock dspy.RLM and rlms are "
            "libraries with no command to start",
            "the guard (--quick) bounds CPU time: another process on the cores stretches wall time in "
            "proportion to a command's length, so a 20 ms floor against a 100 ms command drifts under load",
        ],
    )


def cli_start(b: Bench) -> Result:
    """`fleet-rlm run` from spawn to the model server receiving its first call, against `python -c "import
    dspy"`; each read command (runs, trace, export, volumes ls, config list) from spawn to exit, against
    `python -c "import sqlite3, json"`; the minimum of repeats, each command back to back with its floor."""
    job = wl.overhead(1_000, "1KB", 2)  # one cheap step, then SUBMIT
    b.sim.play(job.tag, job.steps)
    b.sim.configure(0.0)
    fleet = b.runtimes["fleet"]
    context = b.work / "cli.txt"
    job.write_context(context)
    run_cmd = fleet.command(job, context, b.sim.base_url)
    t = cli_latency.measure(run_cmd, fleet.env(b.sim.base_url), b.sim, 3 if b.quick else 9)
    slowest = max(t.reads, key=lambda name: t.reads[name][0])
    heaviest = max(t.reads, key=lambda name: t.reads[name][1])
    floor_wall, floor_cpu = t.read_floor
    ratios = {
        "cli.first_request_over_import_dspy": _ratio(t.first_call, t.import_dspy),
        "cli.read_over_python": _ratio(t.reads[slowest][0], floor_wall),
        "cli.read_cpu_over_python": _ratio(t.reads[heaviest][1], floor_cpu),
    }
    rows = [["`fleet-rlm run`, spawn to first model call", f"{t.first_call:.3f} s",
             f"{t.import_dspy:.3f} s (`import dspy`)", _x(ratios["cli.first_request_over_import_dspy"])]]  # fmt: skip
    rows += [[f"`fleet-rlm {name}` (wall / CPU)", f"{wall:.3f} s / {cpu:.3f} s",
              f"{floor_wall:.3f} s / {floor_cpu:.3f} s (`import sqlite3, json`)", _x(_ratio(wall, floor_wall))]
             for name, (wall, cpu) in t.reads.items()]  # fmt: skip
    data = {"first_call_s": t.first_call, "import_dspy_s": t.import_dspy, "samples": t.samples, "reads": t.reads,
            "read_floor": t.read_floor}  # fmt: skip
    notes = [
        f"the read ratios are the slowest command's: {slowest} (wall), {heaviest} (CPU)",
        "the guard (--quick) bounds the read commands' CPU time: their floor is ~30 ms, so load stretches "
        "their wall-time ratio (see the cold figure)",
    ]
    return Result(["what", "fleet-rlm", "floor", "ratio"], rows, data, ratios, notes)


def prompt_growth(b: Bench) -> Result:
    """Root prompt after 50 steps that each print a little (characters the model reads on step 51)."""
    job = wl.long_loop(50)
    b.sim.configure(0.0)
    rows, data, ratios, notes = [], {}, {}, []
    for name in b.usable():
        b.sim.reset()
        out = b.run(name, job, timeout=300)
        root = b.sim.stats()["root"]["prompt_chars"]
        if out.answer != job.expected or len(root) < 51:
            notes.append(f"{name}: {out.error or out.answer!r} after {len(root)} root calls")
            continue
        data[name] = {"after_50_steps": root[50], "first": root[0], "total": sum(root[:51])}
        rows.append([name, f"{root[0]:,}", f"{root[50]:,}", f"{sum(root[:51]):,}"])
    fleet, stock = data.get("fleet"), data.get("stock")
    ratios["prompt.fleet_over_stock"] = _ratio(fleet and fleet["after_50_steps"], stock and stock["after_50_steps"])
    return Result(
        ["runtime", "first root prompt (chars)", "after 50 steps", "all 51 root prompts"], rows, data, ratios, notes
    )


def documents(b: Bench) -> Result:
    """A 500-page PDF staged as a run stages it (isolated parser, cache), against PDFium in-process."""
    import pypdfium2
    from tests.support.documents import pdf

    from fleet_rlm.core.context import stage_context
    from fleet_rlm.core.inputs.documents import Converter

    pages = 500
    path = b.work / "docs" / "report.pdf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pdf([f"Page {n}: " + "quarterly figures and notes " * 40 for n in range(1, pages + 1)]))
    started = time.perf_counter()
    document = pypdfium2.PdfDocument(path.read_bytes())
    floor_chars = sum(len(document[i].get_textpage().get_text_range()) for i in range(len(document)))
    floor = time.perf_counter() - started
    document.close()
    timings, staged = [], None
    for attempt in ("cold", "warm"):  # the same cache: the second staging converts nothing
        started = time.perf_counter()
        with Converter(b.work / "docs-cache") as converter:
            staged = stage_context(b.work / f"docs-{attempt}" / "context.txt", paths=[str(path)], converter=converter)
        timings.append(time.perf_counter() - started)
    assert staged is not None and staged.cache_hits == 1 and staged.sources[0].note == f"{pages} pages"
    cold, warm = timings
    rows = [
        ["PDFium in this process (the floor, no isolation)", f"{floor:.2f} s", f"{pages / floor:,.0f}"],
        ["staged, isolated parser, first run", f"{cold:.2f} s", f"{pages / cold:,.0f}"],
        ["staged again (conversion cache)", f"{warm * 1000:.1f} ms", f"{pages / warm:,.0f}"],
    ]
    data = {"pages": pages, "floor_s": floor, "cold_s": cold, "warm_s": warm, "chars": floor_chars}
    ratios = {"documents.cold_over_inprocess": _ratio(cold, floor), "documents.warm_over_cold": _ratio(warm, cold)}
    return Result(["conversion of a 500-page PDF", "wall time", "pages/s"], rows, data, ratios)


def tool_calls(b: Bench) -> Result:
    """An MCP tool called from the REPL against the same call from a client on the host (bench/tool_overhead.py)."""
    from bench.tool_overhead import measure

    calls = 100 if b.quick else 300
    (b.work / "tools").mkdir(exist_ok=True)
    got = asyncio.run(measure(calls, b.work / "tools"))
    rows = [
        ["direct: mcp.Client.call_tool on the host", f"{got['direct_ms']:.2f} ms"],
        [f"from the REPL ({got['isolation']} sandbox, through the host-call bridge)", f"{got['from_repl_ms']:.2f} ms"],
    ]
    ratios = {"tools.repl_over_direct": _ratio(got["from_repl_ms"], got["direct_ms"])}
    return Result([f"one tool call (median of {calls})", "time"], rows, got, ratios)


def tasks(b: Bench) -> Result:
    """Accuracy, tokens and wall time per task, at 20 ms ± 10 ms model latency."""
    if b.quick:
        jobs = [wl.needle(2**13), wl.needle(2**20), wl.oolong(64), wl.pairs(64), wl.multihop(40)]
    else:
        jobs = [wl.needle(2**n) for n in (13, 17, 20, 24, 27)] + [wl.oolong(256), wl.pairs(256), wl.multihop(400)]
    b.sim.configure(0.02, 0.01)
    names = b.usable()
    rows, data, notes = [], {}, []
    totals = {name: {"right": 0, "tokens": 0, "seconds": 0.0} for name in names}
    for job in jobs:
        cells = [job.tag.strip("[]").removeprefix("bench:")]
        for name in names:
            b.sim.reset()
            out = b.run(name, job, timeout=1800)
            stats = b.sim.stats()
            tokens = (
                sum(stats["root"]["prompt_chars"])
                + sum(stats["sub"]["prompt_chars"])
                + stats["root"]["reply_chars"]
                + stats["sub"]["reply_chars"]
            ) // 4
            right = out.answer is not None and out.answer.strip() == job.expected
            if out.error:
                notes.append(f"{name} {cells[0]}: {out.error}")
            data[f"{cells[0]}.{name}"] = {"right": right, "tokens": tokens, "seconds": out.seconds}
            totals[name]["right"] += right
            totals[name]["tokens"] += tokens
            totals[name]["seconds"] += out.seconds
            cells.append(f"{'✓' if right else '✗'} · {tokens:,} tok · {out.seconds:.2f} s")
        rows.append(cells)
    rows.append(
        ["**total**"]
        + [f"{t['right']}/{len(jobs)} · {t['tokens']:,} tok · {t['seconds']:.1f} s" for t in totals.values()]
    )
    b.sim.configure(0.0)
    fleet, stock = totals.get("fleet"), totals.get("stock")
    ratios = {
        "tasks.fleet_accuracy": round(fleet["right"] / len(jobs), 2) if fleet else None,
        "tasks.fleet_over_stock_tokens": _ratio(fleet and fleet["tokens"], stock and stock["tokens"]),
        "tasks.stock_over_fleet_seconds": _ratio(stock and stock["seconds"], fleet and fleet["seconds"]),
    }
    notes.append("tokens: characters / 4 of every prompt and reply the server saw (the same count for every runtime)")
    return Result(["task", *names], rows, {"per_task": data, "totals": totals}, ratios, notes)


def peak_memory(b: Bench) -> Result:
    """Peak resident memory of the whole process tree (runtime, sandbox, workers) over a 100 MB context."""
    job = wl.overhead(100_000_000, "100MB", 2)
    rows, data, notes = [], {}, []
    for name in b.usable():
        out = b.run(name, job, timeout=900, track_memory=True)
        if out.answer != job.expected or out.peak_rss_mb is None:
            notes.append(f"{name}: {out.error or out.answer!r}")
            continue
        data[name] = out.peak_rss_mb
        rows.append([name, f"{out.peak_rss_mb:,.0f} MB"])
    return Result(
        ["runtime", "peak RSS (process tree)"],
        rows,
        data,
        {"memory.100MB.fleet_over_stock": _ratio(data.get("fleet"), data.get("stock"))},
        notes,
    )


def web_health(b: Bench) -> Result:
    """Spawn to the first 200 on `/health`: `fleet web` against a bare Starlette app on uvicorn (the floor)."""
    env = web.web_env(b.work / "web-home", b.sim.base_url, MODEL)
    t = web.health_after_launch(env, 3 if b.quick else 7)
    ratio, cpu_ratio = _ratio(t["fleet_s"], t["bare_s"]), _ratio(t["fleet_cpu"], t["bare_cpu"])
    rows = [
        ["`fleet web` /health", f"{t['fleet_s']:.3f} s", f"{t['bare_s']:.3f} s (bare Starlette app)", _x(ratio)],
        ["CPU time by then", f"{t['fleet_cpu']:.3f} s", f"{t['bare_cpu']:.3f} s", _x(cpu_ratio)],
    ]
    notes = ["minimum over repeats; the issue's target is /health within 1.5 s of launch"]
    return Result(["what", "fleet web", "floor", "ratio"], rows, t,
                  {"web.health_over_bare": ratio, "web.health_cpu_over_bare": cpu_ratio}, notes)  # fmt: skip


def sse_latency(b: Bench) -> Result:
    """A run's events from being stored (their `ts`) to arrival at each SSE subscriber of `fleet web`:
    100 subscribers against 1, the events stored after every subscriber joined, 40 ms model latency."""
    job = wl.long_loop(60 if b.quick else 120)
    b.sim.play(job.tag, job.steps)
    b.sim.configure(0.04)
    env = web.web_env(b.work / "sse-home", b.sim.base_url, MODEL)
    data, notes = {}, []
    with web.web_server(env) as server:
        for n in (1, 100):
            data[n] = asyncio.run(web.sse_latency(server.base, server.token, job.question, job.max_iters, n))
            if not data[n]["all_delivered"]:
                notes.append(f"{n} subscribers: some stream missed events")
    b.sim.configure(0.0)
    rows = [[str(n), str(d["events"]), str(d["measured"]), _ms(d["median_ms"]), _ms(d["p95_ms"]),
             "yes" if d["all_delivered"] else "NO"] for n, d in data.items()]  # fmt: skip
    ratios = {
        "sse.p95_100_over_1": _ratio(data[100]["p95_ms"], data[1]["p95_ms"]),
        "sse.all_delivered": 1.0 if all(d["all_delivered"] for d in data.values()) else 0.0,
    }
    columns = ["subscribers", "events per stream", "deliveries measured", "median", "p95", "all delivered"]
    return Result(columns, rows, {str(k): v for k, v in data.items()}, ratios, notes)


def desktop_launch(b: Bench) -> Result:
    """Spawn to a usable window (UI rendered and signed in, /health answered): `fleet desktop` against a
    bare pywebview window showing a static page (the floor), both Qt offscreen, interleaved in one run."""
    env = web.web_env(b.work / "desktop-home", b.sim.base_url, MODEL)
    fleet_s, bare_s = desktop.launch_to_usable(env, 2 if b.quick else 5)
    gap = round(fleet_s - bare_s, 3)
    rows = [["`fleet desktop` usable window", f"{fleet_s:.3f} s", f"{bare_s:.3f} s (bare pywebview page)",
             f"{gap:+.3f} s", _x(_ratio(fleet_s, bare_s))]]  # fmt: skip
    notes = ["minimum over repeats; the issue's target is a gap under 1.5 s"]
    ratios = {"desktop.gap_seconds": gap, "desktop.usable_over_bare": _ratio(fleet_s, bare_s)}
    return Result(["what", "fleet desktop", "floor", "gap", "ratio"], rows,
                  {"fleet_s": fleet_s, "bare_s": bare_s, "gap_s": gap}, ratios, notes)  # fmt: skip


def _warm_mean(alone: list[float]) -> float:
    """A warm run's CPU: the runs after the first (it warms the runtime up), averaged, since /proc
    counts CPU in 10 ms ticks and one run costs a few of them."""
    warm = alone[1:] or alone
    return sum(warm) / len(warm)


def _load_result(prefix: str, d: dict[str, Any], sandboxes: str) -> Result:
    """The table and ratios of one load measurement (``bench.load.measure_load``)."""
    mb = [kb / 1024 for kb in d["rss_kb"]]  # idle, after each wave
    peak_mb = d["peak_rss_kb"][0] / 1024
    per_run = (peak_mb - mb[0]) / d["runs_at_once"]
    finished = d["succeeded"] == d["complete_streams"] == d["attempted"] and not d["failures"]
    lag, sse, cpu = d["lag_p99_ms"], d["sse_p95_ms"], d["cpu_per_run_s"]
    fds = d["fds"]
    ratios = {
        f"{prefix}.all_finished": 1.0 if finished else round(d["succeeded"] / max(1, d["attempted"]), 2),
        f"{prefix}.wall_over_floor": _ratio(d["seconds"][0], d["floor_s"]),
        f"{prefix}.wall_over_alone": _ratio(min(d["seconds"]), min(d["alone_seconds"])),
        f"{prefix}.cpu_per_run_over_alone": _ratio(min(cpu["wave"]), _warm_mean(cpu["alone"])),
        f"{prefix}.rss_second_over_first": _ratio(mb[-1], mb[1]),
        f"{prefix}.fds_after_over_idle": _ratio(fds[-1]["other"], fds[0]["other"]),
        f"{prefix}.lag_p99_over_idle": _ratio(lag.get("wave"), lag.get("idle")),
        # The bound's ratio: the idle p99 swings 1-30 ms with the machine's load, the wave's length with it.
        f"{prefix}.lag_p99_over_wall": _ratio(lag.get("wave"), d["seconds"][0] * 1000),
        f"{prefix}.sse_p95_over_alone": _ratio(sse["load"], sse["alone"]),
        f"{prefix}.sandboxes_left": float(max(d["left"])),
        f"{prefix}.peak_rss_over_idle": _ratio(peak_mb, mb[0]),
    }
    rows = [
        ["runs", f"{d['succeeded']}/{d['attempted']} succeeded, {d['complete_streams']} streams complete "
         f"(seq 1 to run.finished), {len(d['failures'])} failed requests or 5xx", "", ""],
        ["wall time, first POST to last run.finished", " / ".join(f"{s:.2f} s" for s in d["seconds"]),
         f"{d['floor_s']:.2f} s (model-bound floor)", _x(ratios[f"{prefix}.wall_over_floor"])],
        ["wall time, fastest wave against the fastest run alone", f"{min(d['seconds']):.2f} s",
         f"{min(d['alone_seconds']):.2f} s (one run alone)", _x(ratios[f"{prefix}.wall_over_alone"])],
        ["CPU per run (server and its sandboxes), fastest wave", _ms(min(cpu["wave"]) * 1000),
         f"{_ms(_warm_mean(cpu['alone']) * 1000)} a warm run alone",
         _x(ratios[f"{prefix}.cpu_per_run_over_alone"])],
        ["server RSS: peak in wave 1, per concurrent run", f"{peak_mb:.0f} MB, {per_run:.2f} MB",
         f"{mb[0]:.0f} MB idle", ""],
        ["server RSS after wave 1 / wave 2", f"{mb[1]:.0f} MB / {mb[2]:.0f} MB" if len(mb) > 2 else "-", "",
         _x(ratios[f"{prefix}.rss_second_over_first"])],
        ["event-loop lag, /health p99 (share of wave 1's wall time)",
         f"{_ms(lag.get('wave'))} ({ratios[f'{prefix}.lag_p99_over_wall']})", f"{_ms(lag.get('idle'))} idle",
         _x(ratios[f"{prefix}.lag_p99_over_idle"])],
        ["SSE delivery p95, one subscriber per run", _ms(sse["load"]), f"{_ms(sse['alone'])} one run alone",
         _x(ratios[f"{prefix}.sse_p95_over_alone"])],
        ["server descriptors after (+ pooled model connections)",
         f"{fds[-1]['other']} (+{fds[-1]['model_connections']})", f"{fds[0]['other']} idle",
         _x(ratios[f"{prefix}.fds_after_over_idle"])],
        [f"{sandboxes} left after each wave", " / ".join(str(n) for n in d["left"]), "0", ""],
    ]  # fmt: skip
    notes = [f"not clean: {f}" for f in d["failures"]]
    return Result(["what", f"{d['runs_at_once']} runs at once", "against", "ratio"], rows, d, ratios, notes)


def web_load(b: Bench) -> Result:
    """`fleet web` with many runs at once over the JSON API on the local sandbox (bubblewrap), 50 ms model
    latency, each run one batch of 16 sub-calls, followed over SSE; two waves (`bench/load.py`)."""
    runs = 10 if b.quick else 100
    env = web.web_env(b.work / "load-home", b.sim.base_url, MODEL)
    data = load.measure_load(b.sim, env, runs, alone=3, idle_seconds=0.5 if b.quick else 2.0)
    return _load_result("load", data, "sandbox processes below the server")


def daytona_load(b: Bench) -> Result:
    """The same with 20 runs at once on the Daytona backend against its API double (real `daytona` SDK on
    the wire, each sandbox a local bubblewrap process); FLEET_DAYTONA_MAX_SANDBOXES is raised to 20 so
    that every run has its sandbox at once."""
    runs = 20
    with load.daytona_double(b.work / "daytona-double") as (api_url, double_pid):
        env = {
            **web.web_env(b.work / "daytona-load-home", b.sim.base_url, MODEL),
            "FLEET_SANDBOX": "daytona", "DAYTONA_API_URL": api_url, "DAYTONA_API_KEY": "test-key",
            "FLEET_DAYTONA_MAX_SANDBOXES": str(runs),
        }  # fmt: skip
        data = load.measure_load(
            b.sim, env, runs, idle_seconds=2.0, leftovers=lambda _pid: load.double_leftovers(api_url, double_pid)
        )
    return _load_result("daytona_load", data, "sandboxes and REPL processes in the double")


@dataclass(frozen=True)
class Figure:
    id: str
    title: str
    measure: Callable[[Bench], Result] | None
    quick: bool = True  # part of --quick (the CI guard)
    unavailable: Callable[[], str | None] = lambda: None

    @property
    def meaning(self) -> str:
        return (self.measure.__doc__ or "").strip() if self.measure else ""


FIGURES: list[Figure] = [
    Figure("server", "Simulated model: kept-alive request time", server_check),
    Figure("step", "Per-step runtime overhead against context size", step_overhead),
    Figure("fanout", "Sub-call fan-out against the physical limit", fanout),
    Figure("children", "Child RLM overhead", child_overhead),
    Figure("cold", "Cold start", cold_start),
    Figure("cli", "CLI: first model call and read commands", cli_start),
    Figure("web", "`fleet web` health, cold", web_health),
    Figure("sse", "SSE delivery latency, 100 subscribers", sse_latency),
    Figure("load", "`fleet web` under load: runs at once, local sandbox", web_load),
    Figure("daytona_load", "`fleet web` under load: runs at once, Daytona API double", daytona_load, quick=False),
    Figure("desktop", "`fleet desktop` launch to a usable window", desktop_launch),
    Figure("memory", "Peak memory at 100 MB", peak_memory, quick=False),
    Figure("prompt", "Root prompt size after 50 steps", prompt_growth),
    Figure("documents", "Document conversion: a 500-page PDF, then the cache", documents),
    Figure("tools", "An MCP tool call from the REPL against a direct client call", tool_calls, quick=False),
    Figure("tasks", "Accuracy and token cost per task", tasks),
]


def measure(figure: Figure, bench: Bench) -> dict[str, Any]:
    """One figure's section of the report; never raises for a figure that fails to measure."""
    entry: dict[str, Any] = {"id": figure.id, "title": figure.title, "meaning": figure.meaning}
    reason = figure.unavailable() if figure.measure is None else None
    if figure.measure is None:
        return {**entry, "available": False, "reason": reason, "ratios": {}}
    if bench.quick and not figure.quick:
        return {**entry, "available": False, "reason": "full run only (without --quick)", "ratios": {}}
    started = time.perf_counter()
    try:
        result = figure.measure(bench)
    except Exception as exc:  # a broken figure is reported, and its ratios are missing (bounds fail)
        print(f"bench: figure {figure.id} failed: {exc!r}", file=sys.stderr)
        return {**entry, "available": False, "reason": f"failed: {exc!r}", "ratios": {}}
    return {
        **entry,
        "available": True,
        "columns": result.columns,
        "rows": result.rows,
        "data": result.data,
        "ratios": result.ratios,
        "notes": result.notes + bench.skipped_notes(),
        "seconds": round(time.perf_counter() - started, 1),
    }
