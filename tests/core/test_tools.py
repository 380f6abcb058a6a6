"""Tools in the REPL (core/tools.py, docs/tools.md), through the Engine with the real local sandbox: a
scripted run calls a tool of a stdio MCP server and one of an HTTP MCP server on 127.0.0.1 from its
REPL; the values arrive, each call is a ``tool.called`` event, a destructive tool outside the allow
list is refused with a PermissionError, the server's error arrives as an exception with its message,
the sandbox cannot connect to the HTTP server itself (the server logs no request but the host's), and a
replay answers every tool call from the record with both servers stopped. Also the admission's refusals."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from pydantic import TypeAdapter

from fleet_rlm.config import Settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.tools import check_tools_request
from fleet_rlm.errors import UserError
from fleet_rlm.types import RunRequest, ToolCalledData
from tests.support import tools_mcp_server
from tests.support.asgi_server import serve_asgi
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

SERVER = Path(tools_mcp_server.__file__)
SECRET = "Bearer tool-header-secret-4242"


@contextmanager
def _listener() -> Iterator[tuple[int, list[object]]]:
    """A TCP port on the host's loopback that counts the connections it accepts."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.2)
    accepted: list[object] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(sock.accept()[1])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], accepted
    finally:
        done.set()
        thread.join(5)
        sock.close()


def _steps(port: int, other: int) -> list[str]:
    return [
        "s = stdio_lab.shout(text='hi')\nn = http_lab.add(2, b=3)\nprint(s, n, type(n).__name__)",
        "try:\n    stdio_lab.wipe(path='/data')\n    refused = 'not refused'\nexcept PermissionError as e:\n"
        "    refused = 'PermissionError ' + str(e)\n"
        "try:\n    http_lab.broken()\n    failed = 'no error'\nexcept Exception as e:\n    failed = str(e)\n"
        "import socket\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n    reached = 'reached'\n"
        "except OSError:\n    reached = 'blocked'\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {other}), timeout=3).close()\n    reached += ' reached'\n"
        "except OSError:\n    pass\nprint(refused)\nprint(failed)\nprint(reached)",
        "SUBMIT(f\"{s} {n} {reached} {refused.split()[0]} {'on fire' in failed}\")",
    ]


def _servers(log: Path, url: str) -> str:
    return json.dumps({
        "stdio-lab": {"command": sys.executable, "args": [str(SERVER), "stdio", str(log)]},
        "http-lab": {"type": "http", "url": f"{url}/mcp", "headers": {"Authorization": SECRET}},
    })  # fmt: skip


@pytest.fixture
def real_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "local")


async def test_a_run_calls_mcp_tools_from_its_repl_and_a_replay_answers_them_with_the_servers_stopped(
    fleet_env: dict, oracle: OracleLM, real_sandbox: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "tools.log"
    log.touch()
    with serve_asgi(lambda port: tools_mcp_server.app(log)) as url, _listener() as (other, accepted):
        port = int(url.rsplit(":", 1)[1])
        oracle.add(Scenario("use the tools", _steps(port, other)))
        monkeypatch.setenv("FLEET_MCP_SERVERS", _servers(log, url))
        async with Engine() as engine:
            result = await engine.run(RunRequest("use the tools", mcp_servers=["stdio-lab", "http-lab"]))
            events = engine.events(result.run_id)
            calls_before_fork = log.read_text()
            # A fork at step 3 answers the tool calls of steps 1 and 2 from the record (its servers are
            # connected, for the steps after the fork), and runs step 3 live.
            fork_id = await engine.fork(result.run_id, "3", code="SUBMIT(f'{s} {n} forked')")
            forked = await engine.wait(fork_id)
            fork_events = engine.events(fork_id)
            assert log.read_text().count("shout") == calls_before_fork.count("shout")  # no tool called again
    assert forked.status == "succeeded", forked.error
    assert forked.answer == "HI 5 forked"
    assert all(e["data"].get("replayed") for e in fork_events if e["kind"] == "tool.called")
    assert len([e for e in fork_events if e["kind"] == "tool.called"]) == 4
    assert result.status == "succeeded", result.error
    assert result.answer == "HI 5 blocked PermissionError True"
    # The servers were called for the read-only tools only, and only from the host.
    calls = calls_before_fork.splitlines()
    assert [c for c in calls if not c.startswith("request")] == ["shout hi", "add 2 3", "broken"]
    assert {c for c in calls if c.startswith("request")} == {"request 127.0.0.1"}  # the host's client
    assert accepted == []  # the sandbox's own connection attempts reached no port of the host
    # Each call is an event: sizes and time, the refusal and the server's error included.
    tool_events = [e["data"] for e in events if e["kind"] == "tool.called"]
    for data in tool_events:  # the payload type says what the event holds (tests/core/test_types.py)
        TypeAdapter(ToolCalledData).validate_python(data)
        assert set(data) <= ToolCalledData.__optional_keys__ | ToolCalledData.__required_keys__
    assert [(d["server"], d["tool"]) for d in tool_events] == [
        ("stdio-lab", "shout"), ("http-lab", "add"), ("stdio-lab", "wipe"), ("http-lab", "broken")
    ]  # fmt: skip
    assert tool_events[0]["error"] is None and tool_events[0]["result_chars"] == len('"HI"')
    assert (
        tool_events[2]["error"].startswith("PermissionError")
        and "--allow-tool stdio-lab.wipe" in tool_events[2]["error"]
    )
    assert "on fire" in tool_events[3]["error"]
    outputs = [e["data"]["output"] for e in events if e["kind"] == "code.executed"]
    assert outputs[0] == "HI 5 int"
    # The model saw the tools in its opening observation, schemas rendered compactly.
    first = json.dumps(oracle.requests("root")[0].messages)
    assert "stdio_lab.shout(text: string)" in first and "http_lab.add(a: integer, b?: integer=1)" in first
    assert "stdio_lab.wipe(path: string) [changes things" in first
    # The header is a secret: in no event.
    assert "tool-header-secret" not in json.dumps(events)

    # Both servers are stopped now (the stdio one ended with its run; the HTTP one above).
    before = log.read_text()
    async with Engine() as engine:
        replay_id = await engine.replay(result.run_id)
        replayed = await engine.wait(replay_id)
        replay_events = engine.events(replay_id)
        report = engine.workspace.replay_report(replay_id)
    assert replayed.status == "succeeded", replayed.error
    assert replayed.answer == result.answer
    assert not report.diverged, report.first_divergence
    again = [e["data"] for e in replay_events if e["kind"] == "tool.called"]
    assert [(d["tool"], d["replayed"]) for d in again] == [
        ("shout", True),
        ("add", True),
        ("wipe", True),
        ("broken", True),
    ]
    assert log.read_text() == before  # no server was asked


async def test_an_allowed_destructive_tool_is_called(
    fleet_env: dict, oracle: OracleLM, real_sandbox: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "tools.log"
    servers = {"stdio-lab": {"command": sys.executable, "args": [str(SERVER), "stdio", str(log)]}}
    monkeypatch.setenv("FLEET_MCP_SERVERS", json.dumps(servers))
    oracle.add(Scenario("wipe it", ["SUBMIT(stdio_lab.wipe('/data'))"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("wipe it", mcp_servers=["stdio-lab"], allow_tools=["stdio-lab.wipe"]))
    assert result.status == "succeeded", result.error
    assert result.answer == "wiped /data"
    assert log.read_text().splitlines() == ["wipe /data"]


def test_a_request_names_only_configured_servers_and_importable_tools() -> None:
    settings = Settings(mcp_servers={"github": {"type": "http", "url": "http://127.0.0.1:1/mcp"}})
    with pytest.raises(UserError, match=r"MCP server 'gitlab' is not configured; the configured servers: github"):
        check_tools_request(settings, RunRequest("q", mcp_servers=["gitlab"]))
    with pytest.raises(UserError, match="none are configured"):
        check_tools_request(Settings(), RunRequest("q", mcp_servers=["github"]))
    with pytest.raises(UserError, match=r"allow_tools entry 'gitlab\.x'"):
        check_tools_request(settings, RunRequest("q", mcp_servers=["github"], allow_tools=["gitlab.x"]))
    with pytest.raises(UserError, match=r"cannot import 'no_such_module_here'"):
        check_tools_request(settings, RunRequest("q", tools=["no_such_module_here:f"]))
    with pytest.raises(UserError, match=r"the REPL's own name"):
        check_tools_request(settings, RunRequest("q", tools=["builtins:print"]))
    check_tools_request(settings, RunRequest("q", mcp_servers=["github"], tools=["textwrap:dedent"]))


async def test_a_registered_function_call_is_a_tool_span_in_its_steps_code_span(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import fake_sandbox
    from tests.support.otlp_collector import attrs, collecting

    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    monkeypatch.setenv("FLEET_TOOLS", json.dumps(["textwrap:dedent"]))  # the settings list: every run gets it
    oracle.add(Scenario("dedent it", ["d = dedent('  x')\nprint(d)", "SUBMIT(d)"]))
    with collecting() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        async with Engine() as engine:
            result = await engine.run(RunRequest("dedent it"))
    assert result.status == "succeeded" and result.answer == "x", result.error
    spans = {s.span_id: s for s in collector.spans}
    (tool,) = [s for s in spans.values() if s.name == "tool python.textwrap:dedent"]
    assert attrs(tool)["openinference.span.kind"] == "TOOL" and attrs(tool)["fleet.tool.result_chars"] == 3
    assert spans[tool.parent_span_id].name == "code step 1"  # nested in its step's code, like a sub-call


async def test_a_server_that_never_answers_fails_the_run_after_the_tool_timeout(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "silent.pid"
    silent = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    monkeypatch.setenv("FLEET_MCP_SERVERS", json.dumps({"silent": {"command": sys.executable, "args": ["-c", silent]}}))
    monkeypatch.setenv("FLEET_TOOL_TIMEOUT", "2")
    oracle.add(Scenario("ask the silent one", ["SUBMIT('never')"]))
    async with Engine() as engine:
        with anyio.fail_after(60):  # bounded against a hang; the timeout under test is 2 s
            result = await engine.run(RunRequest("ask the silent one", mcp_servers=["silent"]))
    assert result.status == "failed"
    assert "MCP server 'silent' did not answer within 2 s (FLEET_TOOL_TIMEOUT)" in (result.error or "")
    assert oracle.requests() == []  # no model call: the run ended before its first step
    pid = int(pid_file.read_text())
    with anyio.fail_after(10):
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]:
            await anyio.sleep(0.05)  # the server's process is ended with the run
