"""Per-step runtime overhead against context size, fleet-rlm vs stock dspy.RLM + LocalInterpreter.

Both run against the same scripted OpenAI-compatible server on loopback (zero latency). The
time spent inside ``dspy.LM`` calls (LiteLLM, HTTP, the server) is the same client for both and
is subtracted, so what remains is the runtime's own cost per step: building the prompt, parsing
the reply, executing the code, and whatever the runtime re-sends to its sandbox. Per-step cost
is the slope between a short and a long run, which cancels fixed start-up costs.

    uv run python bench/overhead.py            # writes bench/results/overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["FLEET_NO_KEYRING"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspy
from dspy.primitives.local_interpreter import LocalInterpreter
from tests.support.oracle_lm import OracleLM, Scenario

from fleet_rlm.config import load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.run import RunRequest

TRIGGER = "overhead probe"
LM_SECONDS = [0.0]  # time spent inside dspy.LM calls, both runtimes


def _timed(fn):
    if asyncio.iscoroutinefunction(fn):
        async def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                LM_SECONDS[0] += time.perf_counter() - started
    else:
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                LM_SECONDS[0] += time.perf_counter() - started
    return wrapper


# Instrument the one LM client both runtimes share (measurement only; behaviour unchanged).
dspy.LM.__call__ = _timed(dspy.LM.__call__)
dspy.LM.acall = _timed(dspy.LM.acall)
SIZES = {"1KB": 1_000, "1MB": 1_000_000, "10MB": 10_000_000}


def steps(n: int) -> list[str]:
    return ["x = len(context)"] * (n - 1) + ["SUBMIT('done')"]


def make_context(size: int) -> str:
    line = "2026-11-29T10:00:00 service=api level=info msg=request served in 12ms\n"
    return (line * (size // len(line) + 1))[:size]


def time_fleet(base_url: str, context_file: Path, n: int, home: Path) -> float:
    os.environ.update(FLEET_HOME=str(home), FLEET_LM_MODEL="openai/oracle", FLEET_LM_API_BASE=base_url,
                      FLEET_LM_API_KEY="sk-bench", FLEET_LM_RETRIES="0", FLEET_MAX_ITERS=str(n + 1))

    async def go() -> float:
        async with Engine(load_settings()) as engine:
            started = time.perf_counter()
            result = await engine.run(RunRequest(f"{TRIGGER} <{n}>", context_paths=[str(context_file)]))
            elapsed = time.perf_counter() - started
            assert result.answer == "done" and result.iterations == n, result
            return elapsed

    return asyncio.run(go())


def time_stock(base_url: str, context: str, n: int) -> float:
    lm = dspy.LM("openai/oracle", api_base=base_url, api_key="sk-bench", cache=False, num_retries=0)
    rlm = dspy.RLM("context, query -> answer", max_iters=n + 1, interpreter_factory=LocalInterpreter)
    with dspy.context(lm=lm):
        started = time.perf_counter()
        out = rlm(context=context, query=f"{TRIGGER} <{n}>")
        elapsed = time.perf_counter() - started
    assert out.answer == "done", out
    return elapsed


def runtime_seconds(timer, n: int) -> float:
    """Wall time of an n-step run minus the time spent inside LM calls."""
    LM_SECONDS[0] = 0.0
    return timer(n) - LM_SECONDS[0]


def per_step(timer, short: int, long: int, repeats: int) -> float:
    """Median over repeats of the slope between a short and a long run, in milliseconds."""
    slopes = []
    for _ in range(repeats):
        t_short, t_long = runtime_seconds(timer, short), runtime_seconds(timer, long)
        slopes.append((t_long - t_short) / (long - short) * 1000)
    return statistics.median(slopes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=3)
    parser.add_argument("--long", type=int, default=13)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "overhead.json"))
    args = parser.parse_args()
    rows = {}
    with OracleLM() as oracle, tempfile.TemporaryDirectory() as tmp:
        for n in range(1, args.long + 1):
            oracle.add(Scenario(f"{TRIGGER} <{n}>", steps(n)))
        for label, size in SIZES.items():
            context = make_context(size)
            path = Path(tmp) / f"context-{label}.txt"
            path.write_text(context)
            fleet = per_step(lambda n, path=path: time_fleet(oracle.base_url, path, n, Path(tmp) / "home"),
                             args.short, args.long, args.repeats)
            stock = per_step(lambda n, context=context: time_stock(oracle.base_url, context, n),
                             args.short, args.long, args.repeats)
            rows[label] = {"fleet_ms_per_step": round(fleet, 2), "stock_ms_per_step": round(stock, 2),
                           "stock_over_fleet": round(stock / fleet, 1)}
            print(f"{label:>5}: fleet {fleet:8.2f} ms/step   stock dspy.RLM {stock:8.2f} ms/step   "
                  f"ratio {stock / fleet:6.1f}x", flush=True)
    summary = {
        "fleet_10MB_over_1KB": round(rows["10MB"]["fleet_ms_per_step"] / rows["1KB"]["fleet_ms_per_step"], 2),
        "stock_over_fleet_at_10MB": rows["10MB"]["stock_over_fleet"],
    }
    print(f"fleet per-step cost at 10 MB / at 1 KB: {summary['fleet_10MB_over_1KB']}x (target <= 2x)")
    print(f"stock dspy.RLM / fleet at 10 MB: {summary['stock_over_fleet_at_10MB']}x (target >= 20x)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    params = {k: v for k, v in vars(args).items() if k != "out"}
    Path(args.out).write_text(json.dumps({"sizes": rows, "summary": summary, "args": params}, indent=2) + "\n")


if __name__ == "__main__":
    main()
