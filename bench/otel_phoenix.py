"""The OpenTelemetry export against a real Arize Phoenix, by hand (docs/observability.md).

    uv run python -m bench.otel_phoenix                      # installs Phoenix once, in its own venv
    uv run python -m bench.otel_phoenix --phoenix PATH/bin/phoenix

Phoenix (about 600 MB) is not in the project's lock: it is installed with ``uv`` into
``~/.cache/fleet-rlm-phoenix``. The script starts ``phoenix serve`` on free loopback ports, runs the
needle task against the scripted model (tests/support/oracle_lm.py) with the export pointed at it,
reads the trace back through Phoenix's REST API and checks the span tree, the OpenInference kinds
and the token counts. Exits 0 only when Phoenix holds the expected trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

VENV = Path.home() / ".cache" / "fleet-rlm-phoenix"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def phoenix_executable(given: str | None) -> Path:
    if given:
        return Path(given)
    exe = VENV / "bin" / "phoenix"
    if not exe.exists():
        subprocess.run(["uv", "venv", "-q", "--python", "3.11", str(VENV)], check=True)
        subprocess.run(
            ["uv", "pip", "install", "-q", "--python", str(VENV / "bin" / "python"), "arize-phoenix"], check=True
        )
    return exe


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def wait_healthy(base: str, process: subprocess.Popen[bytes], seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"phoenix serve exited with {process.returncode}")
        try:
            urllib.request.urlopen(base + "/healthz", timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"Phoenix did not answer at {base} within {seconds:.0f} s")


async def run_needle(home: Path) -> str:
    from tests.support.oracle_lm import OracleLM, Scenario
    from tests.support.workloads import NEEDLE_STEPS, write_haystack

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.types import RunRequest

    with OracleLM() as oracle:
        oracle.add(Scenario("secret code", NEEDLE_STEPS))
        os.environ.update(
            FLEET_HOME=str(home),
            FLEET_LM_MODEL="openai/oracle",
            FLEET_LM_API_BASE=oracle.base_url,
            FLEET_LM_API_KEY="sk-phoenix-check-0000",
            FLEET_LM_RETRIES="0",
            FLEET_NO_KEYRING="1",
        )
        hay = write_haystack(home.parent / "hay.txt", 300_000, "K7Q2")
        async with Engine() as engine:  # closing it sends the spans
            result = await engine.run(RunRequest("What is the secret code?", context_paths=[str(hay)]))
    if result.answer != "K7Q2":
        raise SystemExit(f"the needle run did not answer: {result.status} {result.error}")
    return result.run_id


def read_trace(base: str, run_id: str, seconds: float = 30) -> list[dict[str, Any]]:
    """The run's spans as Phoenix stores them (ingestion is asynchronous: wait until the run span is in)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        spans = get_json(base + "/v1/projects/default/spans?limit=1000")["data"]
        mine = [s for s in spans if s.get("attributes", {}).get("fleet.run_id") == run_id]
        if any(not s.get("parent_id") for s in mine):
            return mine
        time.sleep(0.5)
    raise SystemExit(f"Phoenix holds no root span for run {run_id}")


def check(spans: list[dict[str, Any]]) -> list[str]:
    ids = {s["context"]["span_id"] for s in spans}
    kinds = Counter(s["span_kind"] for s in spans)
    problems = []
    if [s["span_kind"] for s in spans if not s.get("parent_id")] != ["CHAIN"]:
        problems.append("not one CHAIN root span")
    if any(s.get("parent_id") and s["parent_id"] not in ids for s in spans):
        problems.append("a span's parent is missing")
    if not {"CHAIN", "AGENT", "LLM", "TOOL"} <= set(kinds):
        problems.append(f"span kinds {dict(kinds)}")
    if not all(s["attributes"].get("llm.token_count.prompt") for s in spans if s["span_kind"] == "LLM"):
        problems.append("an LLM span without its prompt token count")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otel_phoenix", description=__doc__.splitlines()[0])
    parser.add_argument("--phoenix", help="a `phoenix` executable; default: installed into " + str(VENV))
    args = parser.parse_args()
    exe = phoenix_executable(args.phoenix)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fleet-phoenix-") as tmp:
        env = {
            **os.environ,
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_WORKING_DIR": tmp,
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        started = time.monotonic()
        with open(Path(tmp) / "phoenix.log", "wb") as log:
            process = subprocess.Popen([str(exe), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(base, process)
            print(f"Phoenix up in {time.monotonic() - started:.1f} s at {base}")
            os.environ.update(FLEET_OTEL_ENDPOINT=base, FLEET_SANDBOX=os.environ.get("FLEET_SANDBOX", "local"))
            run_id = asyncio.run(run_needle(Path(tmp) / "home"))
            spans = read_trace(base, run_id)
        finally:
            process.terminate()
            process.wait(30)
    for span in sorted(spans, key=lambda s: s["start_time"]):
        print(f"{span['span_kind']:<6} {span['name']:<14} tokens={span['attributes'].get('llm.token_count.prompt')}")
    problems = check(spans)
    print("\n".join(problems) or f"ok: {len(spans)} spans of run {run_id} in Phoenix")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
