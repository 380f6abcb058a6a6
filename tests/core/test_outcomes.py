"""One outcome model on every face: an answer extracted after a budget stop is ``partial``, never a
clean ``succeeded`` (CLI exit 3, ``runs --json``, MCP, the web API)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from fleet_rlm.mcp.server import build_server
from mcp import Client
from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import api_client

BIN = Path(sys.executable).parent
NEVER_DONE = Scenario("never done", ["print('still looking')"])


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "fleet-rlm"), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


@pytest.mark.slow
def test_cli_budget_stop_exits_3_and_lists_partial(fleet_env: dict[str, str], oracle: OracleLM) -> None:
    oracle.add(NEVER_DONE)
    proc = cli("run", "never done", "--text", "x", "--max-iters", "2", "--json", env=fleet_env)
    assert proc.returncode == 3, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "partial" and result["answer"] == "extracted"
    assert result["stop_reason"] == "step limit of 2 reached"
    plain = cli("run", "never done", "--text", "x", "--max-iters", "1", env=fleet_env)
    assert plain.returncode == 3 and "[partial · run " in plain.stderr and "step limit of 1 reached" in plain.stderr
    listed = json.loads(cli("runs", "--json", "--status", "partial", env=fleet_env).stdout)
    assert {r["run_id"] for r in listed} >= {result["run_id"]} and all(r["status"] == "partial" for r in listed)


@pytest.mark.anyio
async def test_mcp_run_reports_partial(fleet_env: dict[str, str], oracle: OracleLM) -> None:
    oracle.add(NEVER_DONE)
    async with Client(build_server()) as client:
        out = await client.call_tool("run", {"question": "never done", "context_text": "x", "max_iters": 2})
        assert not out.is_error, out.content
        assert out.structured_content["status"] == "partial"  # type: ignore[index]
        assert out.structured_content["stop_reason"] == "step limit of 2 reached"  # type: ignore[index]
        runs = (await client.call_tool("list_runs", {})).structured_content["runs"]  # type: ignore[index]
    assert runs[0]["status"] == "partial"


@pytest.mark.anyio
async def test_web_api_reports_partial(fleet_env: dict[str, str], oracle: OracleLM) -> None:
    oracle.add(NEVER_DONE)
    async with api_client() as client:
        started = await client.post("/api/runs", json={"question": "never done", "context_text": ["x"], "max_iters": 2})
        assert started.status_code in (200, 201, 202), started.text
        run_id = started.json()["run_id"]
        for _ in range(600):
            state = (await client.get(f"/api/runs/{run_id}")).json()
            if state["status"] not in ("queued", "running"):
                break
            await anyio.sleep(0.05)
        assert state["status"] == "partial" and state["stop_reason"] == "step limit of 2 reached"
        listed = (await client.get("/api/runs", params={"status": "partial"})).json()
    assert [r["run_id"] for r in listed["runs"]] == [run_id]


@pytest.mark.slow
def test_binary_only_folder_is_an_input_mistake(fleet_env: dict[str, str], oracle: OracleLM, tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in ("a.bin", "b.png"):
        (blobs / name).write_bytes(b"\x89PNG\x00\x01" * 100)
    proc = cli("run", "what is here?", "--context", str(blobs), env=fleet_env)
    assert proc.returncode == 2, proc.stderr
    assert "no text found" in proc.stderr and "a.bin" in proc.stderr
    assert json.loads(cli("runs", "--json", env=fleet_env).stdout) == []  # nothing recorded
    assert oracle.requests() == []
    (blobs / "notes.txt").write_text("a line of text")  # one text file among them is enough
    oracle.add(Scenario("what is here", ["SUBMIT(context)"]))
    ok = cli("run", "what is here?", "--context", str(blobs), env=fleet_env)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("a line of text"), ok.stderr
