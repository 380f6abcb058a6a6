"""``fleet-rlm run --tool module:function`` and ``--mcp NAME`` as real subprocesses, against the scripted
model server and the real local sandbox: the user's function is imported on the host, shown to the model
with its signature and docstring, called from the REPL through the host-call bridge, recorded as a
``tool.called`` event, and answered from the record by a replay once its module is gone; an MCP server
that is not configured is refused before a run exists, naming the configured ones (docs/tools.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import cli
from tests.support.oracle_lm import OracleLM, Scenario

STEPS = [
    "n = word_count('one two three')\nprint(n, type(n).__name__, HOSTNAME_SEEN())",
    "SUBMIT(f'{n} words')",
]
MODULE = '''
import socket


def word_count(text: str) -> int:
    """How many words the text has."""
    return len(text.split())


def host_name() -> str:
    """The machine the function runs on."""
    return socket.gethostname()
'''


@pytest.mark.slow
def test_a_registered_python_function_is_called_from_the_repl_and_replayed_without_its_module(
    fleet_env: dict, tmp_path: Path
) -> None:
    folder = tmp_path / "usertools"
    folder.mkdir()
    (folder / "mytools.py").write_text(MODULE)
    steps = [STEPS[0].replace("HOSTNAME_SEEN()", "host_name()"), STEPS[1]]
    env = fleet_env | {"PYTHONPATH": str(folder), "FLEET_SANDBOX": "local"}
    with OracleLM(Scenario("count the words", steps)) as oracle:
        env["FLEET_LM_API_BASE"] = oracle.base_url
        args = ["run", "count the words", "--tool", "mytools:word_count", "--tool", "mytools:host_name", "--json"]
        proc = cli(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        first = json.dumps(oracle.requests("root")[0].messages)
    assert result["answer"] == "3 words"
    assert "word_count(text: str) -> int - How many words the text has." in first
    exported = cli("export", result["run_id"], env=env)
    events = [json.loads(line) for line in exported.stdout.splitlines()]
    called = [e["data"] for e in events if e["kind"] == "tool.called"]
    assert [(c["server"], c["tool"], c["error"]) for c in called] == [
        ("python", "mytools:word_count", None), ("python", "mytools:host_name", None)
    ]  # fmt: skip
    import socket

    output = next(e["data"]["output"] for e in events if e["kind"] == "code.executed")
    assert output == f"3 int {socket.gethostname()}"  # the function ran on the host, not in the sandbox

    shown = cli("trace", result["run_id"], env=env)  # the trace shows the step's tool calls
    assert shown.returncode == 0 and "2 tool calls" in shown.stdout, shown.stdout + shown.stderr
    assert "python.mytools:word_count → 1 chars" in shown.stdout

    (folder / "mytools.py").unlink()  # a replay imports nothing: the record answers
    replay = cli("replay", result["run_id"], "--json", env={k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["diverged"] is False


def test_an_unknown_mcp_server_is_refused_naming_the_configured_ones(fleet_env: dict) -> None:
    servers = {"files": {"command": "true"}, "github": {"type": "http", "url": "http://127.0.0.1:9/mcp"}}
    env = fleet_env | {"FLEET_MCP_SERVERS": json.dumps(servers)}
    proc = cli("run", "anything", "--mcp", "gitlab", env=env)
    assert proc.returncode != 0
    assert "MCP server 'gitlab' is not configured; the configured servers: files, github" in proc.stderr
    bad = cli("run", "anything", "--tool", "no_such_module_xyz:f", env=env)
    assert bad.returncode != 0 and "cannot import 'no_such_module_xyz'" in bad.stderr
