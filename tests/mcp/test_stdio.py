"""`fleet-mcp` as a subprocess over stdio, as Claude Code and Claude Desktop launch it."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import anyio
import pytest

from mcp import Client, StdioServerParameters
from tests.mcp.conftest import fleet_mcp_command, server_env
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import write_haystack

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def params(fleet_env: dict[str, str], cwd: Path) -> StdioServerParameters:
    command, *args = fleet_mcp_command()
    return StdioServerParameters(command=command, args=args, env=server_env(fleet_env), cwd=str(cwd))


async def test_stdio_run_progress_and_cancel(
    fleet_env: dict[str, str], needle: OracleLM, slow: OracleLM, era: str, tmp_path: Path
) -> None:
    hay = write_haystack(tmp_path / "hay.txt", 2_000_000, "MOTH3")
    messages: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    # A clean handshake proves stdout carries nothing but protocol.
    async with Client(params(fleet_env, tmp_path), mode=era) as client:
        assert client.server_info is not None and client.server_info.name == "fleet-rlm"
        result = await client.call_tool(
            "run", {"question": "What is the secret code?", "context_paths": [str(hay)]}, progress_callback=on_progress
        )
        assert not result.is_error, result.content
        assert result.structured_content["answer"] == "MOTH3"  # type: ignore[index]
        assert messages[0].startswith("run r") and messages[-1] == "run succeeded"
        assert any("sub-queries" in m for m in messages) and len(messages) >= 6

        messages.clear()
        with anyio.move_on_after(4) as scope:
            await client.call_tool(
                "run", {"question": "take your time", "context_text": "x"}, progress_callback=on_progress
            )
        assert scope.cancelled_caught and "step 1 · running code" in messages, messages
        run_id = messages[0].split()[1]
        with anyio.fail_after(20):  # the same session still answers, and the run ends up cancelled
            while True:
                state = (await client.call_tool("get_run", {"run_id": run_id})).structured_content
                if state["status"] == "cancelled":  # type: ignore[index]
                    break
                await anyio.sleep(0.1)


def test_http_refuses_remote_bind_without_auth(fleet_env: dict[str, str], tmp_path: Path) -> None:
    out = subprocess.run(
        [*fleet_mcp_command(), "--transport", "http", "--host", "0.0.0.0", "--port", "0", "--no-auth"],
        env=server_env(fleet_env), cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert "refusing to listen on 0.0.0.0" in out.stderr and "FLEET_MCP_TOKEN" in out.stderr
    assert "--allow-remote" in out.stderr and "listening" not in out.stderr  # refused before binding


def test_version_flag() -> None:
    out = subprocess.run([*fleet_mcp_command(), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("fleet-mcp ")


async def test_run_cancelled_early_is_kept(
    fleet_env: dict[str, str], oracle: OracleLM, era: str, tmp_path: Path
) -> None:
    """A second server process on a home that already holds a run: a run cancelled after two model
    replies is in the store with its events through run.finished (read from SQLite directly)."""
    oracle.add(Scenario("quick one", ["SUBMIT('x')"]))
    oracle.add(Scenario("take your time", ["print('looking')"] * 50))
    async with Client(params(fleet_env, tmp_path), mode=era) as client:
        await client.call_tool("run", {"question": "quick one", "context_text": "x"})
    oracle.state.latency = 0.3
    async with Client(params(fleet_env, tmp_path), mode=era) as client:
        answered = len(oracle.requests())
        seen: list[str] = []
        async with anyio.create_task_group() as group:

            async def call() -> None:
                await client.call_tool("run", {"question": "take your time", "context_text": "x"})

            group.start_soon(call)
            with anyio.fail_after(30):
                while sum(r.reply_chars > 0 for r in oracle.requests()) < answered + 2:
                    await anyio.sleep(0.01)
            listed = (await client.call_tool("list_runs", {})).structured_content["runs"]  # type: ignore[index]
            seen = [r["status"] for r in listed if r["question"] == "take your time"]
            group.cancel_scope.cancel()  # the client sends notifications/cancelled
        assert seen == ["running"]  # visible on the face while it runs
        with anyio.fail_after(30):
            while True:
                db = sqlite3.connect(Path(fleet_env["FLEET_HOME"]) / "fleet.db")
                row = db.execute("SELECT id, status FROM runs WHERE question = 'take your time'").fetchone()
                if row and row[1] == "cancelled":
                    break
                db.close()
                await anyio.sleep(0.1)
        kinds = [k for (k,) in db.execute("SELECT kind FROM events WHERE run_id = ? ORDER BY seq", (row[0],))]
        seqs = [s for (s,) in db.execute("SELECT seq FROM events WHERE run_id = ? ORDER BY seq", (row[0],))]
        db.close()
    assert kinds[0] == "run.started" and kinds[-1] == "run.finished" and "lm.call" in kinds
    assert seqs == list(range(1, len(seqs) + 1))


async def test_client_gone_mid_run_leaves_the_run_finished_in_the_store(
    fleet_env: dict[str, str], oracle: OracleLM, tmp_path: Path
) -> None:
    """The MCP client dies mid-call without a word (its end of the pipes closes): the server's exit
    records the run as ended, with its events through run.finished, before any later process reads it."""
    oracle.add(Scenario("never ending", ["print('looking')"] * 50))
    oracle.state.latency = 0.3
    server = subprocess.Popen(
        fleet_mcp_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=server_env(fleet_env), cwd=tmp_path,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    call = {"name": "run", "arguments": {"question": "never ending", "context_text": "x"}}
    for message in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call},
    ):
        server.stdin.write((json.dumps(message) + "\n").encode())
        server.stdin.flush()
    with anyio.fail_after(60):
        while sum(r.reply_chars > 0 for r in oracle.requests()) < 2:
            await anyio.sleep(0.01)
    server.stdin.close()  # the client is gone: no cancel, no goodbye
    server.stdout.close()
    assert await anyio.to_thread.run_sync(lambda: server.wait(timeout=60)) is not None
    db = sqlite3.connect(Path(fleet_env["FLEET_HOME"]) / "fleet.db")
    try:
        row = db.execute("SELECT id, status FROM runs WHERE question = 'never ending'").fetchone()
        kinds = [k for (k,) in db.execute("SELECT kind FROM events WHERE run_id = ? ORDER BY seq", (row[0],))]
    finally:
        db.close()
    assert row[1] in ("cancelled", "interrupted") and kinds[-1] == "run.finished" and "lm.call" in kinds


async def test_no_model_says_the_client_passes_only_its_configured_environment(
    fleet_env: dict[str, str], tmp_path: Path
) -> None:
    # What a client launches with when FLEET_LM_MODEL is exported in the shell but not in its configuration.
    env = {k: v for k, v in server_env(fleet_env).items() if k != "FLEET_LM_MODEL"}
    command, *args = fleet_mcp_command()
    server = StdioServerParameters(command=command, args=args, env=env, cwd=str(tmp_path))
    async with Client(server) as client:
        result = await client.call_tool("run", {"question": "anything", "context_text": "x"})
    assert result.is_error
    [text] = [c.text for c in result.content if c.type == "text"]
    assert "No model configured: set FLEET_LM_MODEL" in text
    assert "only the environment written in their configuration" in text  # why the exported one is not seen
    assert '"env"' in text and "-e FLEET_LM_MODEL=" in text  # where to add it: a client's config, the Inspector
    assert fleet_env["FLEET_LM_API_KEY"] not in text
