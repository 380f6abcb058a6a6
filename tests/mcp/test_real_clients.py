"""Third-party tools against the real `fleet-mcp`: MCP Inspector CLI and the MCPB validator.

They need Node 22 and npm packages, which `.ci/setup` installs (FLEET_INSPECTOR and FLEET_MCPB
point at other copies of the `mcp-inspector` and `mcpb` binaries). The folder of
each binary goes first on PATH, so a portable node installed next to them (npm `node@22`) is used.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.mcp.conftest import ROOT, fleet_mcp_command, server_env
from tests.support import prereqs
from tests.support.oracle_lm import OracleLM
from tests.support.workloads import write_haystack

pytestmark = pytest.mark.slow


tool = prereqs.node_tool


def run_tool(binary: Path, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**env, "PATH": f"{binary.parent}{os.pathsep}{env.get('PATH', '')}", "HOME": str(cwd)}
    return subprocess.run([str(binary), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def inspector(fleet_env: dict[str, str], tmp_path: Path, era: str, *method: str) -> dict:
    binary = tool("FLEET_INSPECTOR")
    env = server_env(fleet_env)
    # The server's environment goes through -e: the Inspector starts stdio servers with a clean one.
    env_args = [
        arg for key, value in env.items() if key.startswith(("FLEET_", "LITELLM_")) for arg in ("-e", f"{key}={value}")
    ]
    args = ["--cli", "--format", "json", "-q", "--protocol-era", era, *env_args, *fleet_mcp_command(), *method]
    out = run_tool(binary, args, env, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_inspector_lists_and_calls_run(fleet_env: dict[str, str], needle: OracleLM, tmp_path: Path, era: str) -> None:
    listed = inspector(fleet_env, tmp_path, era, "--method", "tools/list")
    names = [t["name"] for t in listed["result"]["tools"]]
    assert names[:2] == ["run", "start_run"] and "inspect_trace" in names
    run_schema = listed["result"]["tools"][0]
    assert run_schema["outputSchema"]["title"] == "RunOutput" and run_schema["annotations"]["openWorldHint"] is True

    hay = write_haystack(tmp_path / "hay.txt", 600_000, "LYNX9")
    args = json.dumps({"question": "What is the secret code?", "context_paths": [str(hay)]})
    called = inspector(
        fleet_env, tmp_path, era, "--method", "tools/call", "--tool-name", "run", "--tool-args-json", args
    )
    result = called["result"]
    # Only 2026-07-28 results carry the server's identity in _meta: proof of which era was spoken.
    assert ("io.modelcontextprotocol/serverInfo" in result.get("_meta", {})) == (era == "modern")
    assert result["isError"] is False
    assert result["structuredContent"]["answer"] == "LYNX9" and result["structuredContent"]["status"] == "succeeded"
    assert json.loads(result["content"][0]["text"])["run_id"] == result["structuredContent"]["run_id"]


def test_inspector_reads_prompt_and_resource(fleet_env: dict[str, str], oracle: OracleLM, tmp_path: Path) -> None:
    prompt = inspector(
        fleet_env, tmp_path, "legacy", "--method", "prompts/get", "--prompt-name", "triage_logs",
        "--prompt-args", "path=/var/log/syslog",
    )  # fmt: skip
    assert "/var/log/syslog" in prompt["result"]["messages"][0]["content"]["text"]
    runs = inspector(fleet_env, tmp_path, "legacy", "--method", "resources/read", "--uri", "fleet://runs")
    assert json.loads(runs["result"]["contents"][0]["text"]) == []


def test_mcpb_validates_manifest(tmp_path: Path) -> None:
    binary = tool("FLEET_MCPB")
    out = run_tool(binary, ["validate", str(ROOT / "manifests" / "manifest.json")], dict(os.environ), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "validation passes" in out.stdout


def test_inspector_over_http_does_the_whole_job(
    fleet_env: dict[str, str], needle: OracleLM, slow: OracleLM, tmp_path: Path
) -> None:
    """One long-lived `fleet-mcp --transport http`, driven call by call by the Inspector CLI:
    a needle over 5 MB, the run's trace resource, volume files, and a long run cancelled."""
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # --no-auth: the Inspector CLI is driven here by URL only (the token default is tested in tests/security).
    server = subprocess.Popen([*fleet_mcp_command(), "--transport", "http", "--port", str(port), "--no-auth"],
                              env=server_env(fleet_env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/mcp"

    def call(*method: str) -> dict:
        binary = tool("FLEET_INSPECTOR")
        out = run_tool(binary, ["--cli", "--format", "json", "-q", url, *method], server_env(fleet_env), tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)["result"]

    def tool_call(name: str, **args: object) -> dict:
        result = call("--method", "tools/call", "--tool-name", name, "--tool-args-json", json.dumps(args))
        assert result["isError"] is False, result
        return result["structuredContent"]

    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        hay = write_haystack(tmp_path / "big.txt", 5_000_000, "OTTER5")
        ran = tool_call("run", question="What is the secret code?", context_paths=[str(hay)])
        assert ran["answer"] == "OTTER5"
        trace = call("--method", "resources/read", "--uri", ran["trace_uri"])
        nodes = json.loads(trace["contents"][0]["text"])["nodes"]
        assert len(nodes["root"]["steps"]) == 3 and nodes["root"]["steps"][1]["subcalls"]

        tool_call("write_file", volume="notes", path="memory/finding.md", content="OTTER5 found in big.txt")
        listed = tool_call("list_files", volume="notes", path="memory")
        assert "memory/finding.md" in json.dumps(listed)
        assert "OTTER5 found" in json.dumps(tool_call("read_file", volume="notes", path="memory/finding.md"))

        started = tool_call("start_run", question="take your time", context_text="x")
        time.sleep(1.0)
        tool_call("cancel_run", run_id=started["run_id"])
        assert tool_call("get_run", run_id=started["run_id"])["status"] == "cancelled"
    finally:
        server.terminate()
        server.wait(timeout=30)
