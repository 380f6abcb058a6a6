"""64 batched sub-queries at 100 ms simulated latency: concurrency reached at the LM server and
wall time of the batch, fleet-rlm vs stock dspy.RLM + LocalInterpreter on the same server.

    uv run python bench/concurrency.py         # writes bench/results/concurrency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
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

BATCH = [
    "import time\nt = time.perf_counter()\n"
    "answers = llm_query_batched([f'record {i}: The secret code is C{i}' for i in range(64)])\n"
    "print(round(time.perf_counter() - t, 3))",
    "SUBMIT(str(sum(a.startswith('C') for a in answers)))",
]


def _first_number(content: str) -> float:
    for token in content.replace("\n", " ").split():
        try:
            return float(token)
        except ValueError:
            continue
    raise ValueError("no timing printed")


def run_fleet(oracle: OracleLM, concurrency: int, home: Path) -> dict:
    os.environ.update(FLEET_HOME=str(home), FLEET_LM_MODEL="openai/oracle", FLEET_LM_API_BASE=oracle.base_url,
                      FLEET_LM_API_KEY="sk-bench", FLEET_LM_RETRIES="0", FLEET_CONCURRENCY=str(concurrency))
    oracle.state.max_in_flight = 0

    async def go() -> str:
        async with Engine(load_settings()) as engine:
            return (await engine.run(RunRequest("fan out 64", context_text=["x"]))).answer

    answer = asyncio.run(go())
    assert answer == "64", answer
    return {"max_in_flight": oracle.max_in_flight, "batch_seconds": _first_number(
        oracle.requests("root")[-1].messages[-1]["content"].split("]]", 1)[-1])}


def run_stock(oracle: OracleLM) -> dict:
    oracle.state.max_in_flight = 0
    lm = dspy.LM("openai/oracle", api_base=oracle.base_url, api_key="sk-bench", cache=False, num_retries=0)
    rlm = dspy.RLM("context, query -> answer", max_iters=4, max_llm_calls=100, interpreter_factory=LocalInterpreter)
    with dspy.context(lm=lm):
        out = rlm(context="x", query="fan out 64")
    assert out.answer == "64", out
    return {"max_in_flight": oracle.max_in_flight, "batch_seconds": _first_number(out.trajectory[0]["output"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "concurrency.json"))
    args = parser.parse_args()
    results = {}
    with OracleLM(Scenario("fan out 64", BATCH), latency=args.latency) as oracle, \
            tempfile.TemporaryDirectory() as tmp:
        for concurrency in (8, 16, 32):
            results[f"fleet_concurrency_{concurrency}"] = run_fleet(oracle, concurrency, Path(tmp) / "home")
        results["stock_dspy_rlm"] = run_stock(oracle)
    for name, row in results.items():
        print(f"{name:>24}: max in flight {row['max_in_flight']:>3}   batch of 64 in {row['batch_seconds']:.2f}s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"latency": args.latency, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
