"""The Daytona done-when, through the real CLI: ``fleet-rlm run --sandbox daytona`` in subprocesses
against the Daytona API double (real ``daytona`` SDK on the wire) and the scripted LM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS, write_haystack

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
# docs/cli.md's `daytona` commands and flags, walked here against the double (tests/cli/test_docs.py
# checks this covers what the docs list).
DAYTONA_WALK: dict[tuple[tuple[str, ...], str], list[str]] = {
    (("fleet-rlm", "daytona", "setup"), ""): ["daytona", "setup"],
    (("fleet-rlm", "daytona", "smoke"), "--json"): ["daytona", "smoke", "--json"],
    (("fleet-rlm", "daytona", "gc"), "--all"): ["daytona", "gc", "--all", "--dry-run"],
    (("fleet-rlm", "daytona", "gc"), "--dry-run"): ["daytona", "gc", "--dry-run"],
    (("fleet-rlm", "daytona", "gc"), "--json"): ["daytona", "gc", "--json", "--dry-run"],
}


@pytest.fixture
def env(fleet_env: dict, daytona_double: Any, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return {**fleet_env, "FLEET_SANDBOX": "daytona", "DAYTONA_API_URL": daytona_double.api_url,
            "DAYTONA_API_KEY": "test-key"}  # fmt: skip


def cli(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "fleet-rlm"), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout
    )


def run_json(*args: str, env: dict) -> dict:
    proc = cli("run", *args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def fault(double: Any, **spec: Any) -> None:
    httpx.post(f"http://127.0.0.1:{double.port}/_double/faults", json=spec).raise_for_status()


def state(double: Any) -> dict:
    return httpx.get(f"http://127.0.0.1:{double.port}/_double/state").json()


def test_needle_batched_volume_faults(env: dict, oracle: OracleLM, daytona_double: Any, tmp_path: Path) -> None:
    # A 5 MB needle, with a 429 (Retry-After) on the sandbox create and a 502 on the first
    # execution's WebSocket upgrade: both retried, the run succeeds.
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    fault(daytona_double, kind="http", match="^POST /api/sandbox$", status=429, retry_after=0.3)
    fault(daytona_double, kind="http", match="process/interpreter/execute$", status=502)
    before = len(state(daytona_double)["log"])
    hay = write_haystack(tmp_path / "big.log", 5_000_000, "Z9X8")
    result = run_json("What is the secret code?", "--context", str(hay), "--sandbox", "daytona", env=env)
    assert result["answer"] == "Z9X8" and result["status"] == "succeeded"
    assert result["usage"]["sandbox"]["seconds"] > 0  # sandbox time recorded like model usage
    log = state(daytona_double)["log"][before:]
    assert log.count("POST /api/sandbox") == 2  # refused once with 429, then created
    assert not [s for s in state(daytona_double)["sandboxes"] if s["labels"].get("fleet-rlm.kind") == "repl"]

    # 64 batched sub-queries from sandbox code, bridged to the host.
    oracle.add(Scenario("classify", [
        "labels = llm_query_batched(['Label: ' + l for l in context.splitlines()])\nprint(len(labels))",
        "SUBMIT(str(sum(l == 'NONE' for l in labels)))",
    ]))  # fmt: skip
    text = "\n".join(f"record {i}" for i in range(64))
    result = run_json("classify these", "--text", text, env=env)
    assert result["answer"] == "64" and result["llm_calls"] == 66

    # An artifact written to the Daytona volume by one run is read back by a later one.
    oracle.add(Scenario("write the report", [
        "open(volumes['reports'] + '/artifacts/report.txt', 'w').write('quarterly: 42')\nSUBMIT('written')",
    ]))  # fmt: skip
    oracle.add(Scenario("read the report", ["SUBMIT(open(volumes['reports'] + '/artifacts/report.txt').read())"]))
    assert run_json("write the report", "--text", "x", "--volume", "reports", env=env)["answer"] == "written"
    assert run_json("read the report", "--text", "x", "--volume", "reports", env=env)["answer"] == "quarterly: 42"
    # ... and the CLI's volume browsing sees the same file.
    assert cli("volumes", "cat", "reports/artifacts/report.txt", env=env).stdout == "quarterly: 42"
    names = [v["name"] for v in json.loads(cli("volumes", "ls", "--json", env=env).stdout)]
    assert "reports" in names


def test_gc_removes_what_a_killed_run_left(env: dict, oracle: OracleLM, daytona_double: Any) -> None:
    oracle.add(Scenario("hang", ["print('working')", "import time\ntime.sleep(120)"]))
    proc = subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", "hang please", "--text", "x", "--json"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    owner = f"{os.uname().nodename}:{proc.pid}"

    def mine() -> list[dict]:
        return [s for s in state(daytona_double)["sandboxes"] if s["labels"].get("fleet-rlm.owner") == owner]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (mine() and len(oracle.requests("root")) >= 2):
        time.sleep(0.2)
    assert mine(), "the run never created its sandbox"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert mine(), "the killed run's sandbox should still be there before gc"
    dry = json.loads(cli("daytona", "gc", "--dry-run", "--json", env=env).stdout)
    assert [r["id"] for r in dry["removed"]] == [s["id"] for s in mine()]
    done = cli("daytona", "gc", env=env)
    assert done.returncode == 0, done.stderr
    assert not mine()


def test_daytona_commands_walk(env: dict, daytona_double: Any) -> None:
    outputs = {}
    for argv in DAYTONA_WALK.values():
        proc = cli(*argv, env=env)
        assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr}"
        outputs[tuple(argv)] = proc.stdout
    smoke = json.loads(outputs[("daytona", "smoke", "--json")])
    assert [row["check"] for row in smoke] == ["credentials", "snapshot", "volume", "sandbox", "execution",
                                               "host bridge"]  # fmt: skip
    assert all(row["ok"] and row["seconds"] >= 0 for row in smoke)
    broken = cli("daytona", "smoke", env={**env, "DAYTONA_API_KEY": "wrong-key"})
    assert broken.returncode == 1 and "credentials" in broken.stderr and "DAYTONA_API_KEY" in broken.stderr
