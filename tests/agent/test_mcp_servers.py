"""The user's own MCP servers as the agent's tools: adding one is an approved action that shows the exact
command, its tools reach the model on the next turn, a rejected add changes nothing, and every server
process the agent starts has ended when the turn does.

The server is a real stdio MCP server (tests/support/echo_mcp_server.py) run with this interpreter; it
appends its process id to a file, so the test can check on the host that no process was left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.agent.views import TurnOutcome
from fleet_rlm.core.engine import Engine
from tests.support.agent_lm import AgentLM, Call, Policy, Say

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).resolve().parents[1] / "support" / "echo_mcp_server.py"
ADD = "add my echo server"
SHOUT = "shout hello through it"
TOOL = "echo_shout"  # agent-framework exposes an MCP tool as '<tool_name_prefix>_<tool>', the prefix is the name


def started(pids: Path) -> list[int]:
    """The process ids of the echo servers started so far."""
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def assert_ended(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"the MCP server process {pid} still runs after the turn: the agent must close it")


async def paused_add(host: AgentHost, agent_lm: AgentLM, pids: Path) -> tuple[str, TurnOutcome, list[str]]:
    """A conversation whose turn asked to add the echo server: its id, the paused outcome, the exact argv."""
    args = [str(SERVER), str(pids)]
    agent_lm.add(
        Policy(
            ADD,
            [
                Call("add_mcp_server", {"name": "echo", "command": sys.executable, "args": args}),
                Say(lambda r: f"Add result: {r.result}"),
            ],
        )
    )
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, ADD)
    assert paused.status == "paused" and len(paused.pending) == 1, paused
    return conv.id, paused, [sys.executable, *args]


async def test_adding_a_server_shows_its_command_and_waits_for_approval(
    engine: Engine, agent_lm: AgentLM, tmp_path: Path
) -> None:
    host = AgentHost.of(engine)
    pids = tmp_path / "pids"
    conv_id, paused, argv = await paused_add(host, agent_lm, pids)
    approval = paused.pending[0]
    assert approval.tool == "add_mcp_server"
    assert approval.arguments == {"name": "echo", "command": argv[0], "args": argv[1:]}
    assert approval.summary == f"start the MCP server 'echo' by running: {shlex.join(argv)}"
    # Nothing was added or started before the user said yes.
    assert host.conversation(conv_id).mcp_servers == []
    assert started(pids) == []

    decided, feed = await host.answer(approval.id, True, actor="test")
    assert decided.status == "approved" and feed is not None
    done = await feed.outcome()
    assert done.status == "done" and "added MCP server 'echo'" in done.reply, done
    # The model is told truly when the tools come: not in this turn, whose tool list was fixed at its start.
    assert "from the user's next message on" in done.reply and TOOL not in agent_lm.requests[-1].tools
    [server] = host.conversation(conv_id).mcp_servers
    assert (server["name"], server["command"], server["args"]) == ("echo", argv[0], argv[1:])
    assert {e.action for e in host.audit(conv_id).entries} == {"requested", "approved", "executed"}
    assert_ended(started(pids))


@pytest.mark.slow
async def test_an_added_servers_tool_answers_the_next_turn(engine: Engine, agent_lm: AgentLM, tmp_path: Path) -> None:
    host = AgentHost.of(engine)
    pids = tmp_path / "pids"
    conv_id, paused, _ = await paused_add(host, agent_lm, pids)
    _, feed = await host.answer(paused.pending[0].id, True, actor="test")
    assert (await feed.outcome()).status == "done"
    agent_lm.add(Policy(SHOUT, [Call(TOOL, {"text": "hello"}), Say(lambda r: f"It shouted: {r.result}")]))

    # The server's tool is one the user approves too: it runs a program of theirs.
    asked = await host.chat(conv_id, SHOUT)
    assert asked.status == "paused" and [a.tool for a in asked.pending] == [TOOL], asked
    assert TOOL in agent_lm.requests[-1].tools  # the model was offered the server's tool
    _, feed = await host.answer(asked.pending[0].id, True, actor="test")
    done = await feed.outcome()

    # agent-framework hands the model an MCP result's structured content when there is some, as JSON.
    assert done.status == "done" and done.reply == 'It shouted: {"result": "HELLO"}', done
    last = agent_lm.requests[-1].messages[-1]
    assert last["role"] == "tool" and json.loads(last["content"]) == {"result": "HELLO"}, last
    # Opened per segment of the turn (before and after the pause), and closed with it each time.
    servers = started(pids)
    assert len(servers) == 2, servers
    assert_ended(servers)


async def test_a_rejected_add_changes_nothing(engine: Engine, agent_lm: AgentLM, tmp_path: Path) -> None:
    host = AgentHost.of(engine)
    pids = tmp_path / "pids"
    conv_id, paused, _ = await paused_add(host, agent_lm, pids)
    decided, feed = await host.answer(paused.pending[0].id, False, reason="not that program", actor="test")
    assert decided.status == "rejected" and feed is not None
    done = await feed.outcome()
    assert done.status == "done" and "not that program" in done.reply, done
    assert "not that program" in agent_lm.requests[-1].messages[-1]["content"]  # the model read the reason
    assert host.conversation(conv_id).mcp_servers == []
    assert started(pids) == []  # never run
    # The next turn offers the model no tool of that server.
    agent_lm.add(Policy(SHOUT, [Say("nothing to shout with")]))
    assert (await host.chat(conv_id, SHOUT)).status == "done"
    assert TOOL not in agent_lm.requests[-1].tools and started(pids) == []
