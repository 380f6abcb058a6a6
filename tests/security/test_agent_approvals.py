"""Attacks on the workspace agent's approvals, each checked where it lands (the store, the volume on disk,
the model server's request count):

* a card that hides what will run: key-shaped text in a command or argument masked to ``***`` on the
  card, while the real program ran with the real arguments;
* a card that cannot show an argument exactly (a configured secret, control characters, too long) but
  still offers Approve, on the card or through the decision API;
* a card that names another file than the tool writes;
* a terminal prompt that approves on the first letter of an unrelated line, and the web and MCP
  decisions that take anything truthy for yes;
* a cost cap on a model without a known price, auto-approved and then never enforced;
* a card checked when shown, not when run: two cards both said "new file", both were approved, the
  second write replaced the first and the audit still said "new file".
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.config import load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import Conflict
from fleet_rlm.mcp.server import build_server
from fleet_rlm.web.app import create_app
from mcp import Client
from tests.agent.conftest import agent_env, agent_lm, engine, memory_file, subprocess_env  # noqa: F401 - fixtures
from tests.agent.test_cli import agent_chat
from tests.cli.terminal import Terminal
from tests.support.agent_lm import AgentLM, Call, Calls, Policy, Say
from tests.support.asgi_server import serve_asgi
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

BIN = Path(sys.executable).parent
TOKEN = "agent-approvals-token-5d1c"
CONFIGURED_SECRET = "sk-test-oracle-0000"  # FLEET_LM_API_KEY of the test settings
LOOKALIKE = {"name": "helper", "command": "/tmp/x/sk-helper", "args": ["--read-only", "sk-dash_delete-all-files"]}
EXACT = "start the MCP server 'helper' by running: /tmp/x/sk-helper --read-only sk-dash_delete-all-files"
PRICES = ("FLEET_LM_PRICE_PER_MTOK_IN", "FLEET_LM_PRICE_PER_MTOK_OUT")


def add_server(agent_lm: AgentLM, trigger: str, arguments: dict[str, Any]) -> None:  # noqa: F811
    agent_lm.add(Policy(trigger, [Call("add_mcp_server", arguments), Say(lambda r: f"Add result: {r.result}")]))


@asynccontextmanager
async def web_api() -> AsyncIterator[httpx.AsyncClient]:
    """The web app (its own Engine, on the test settings) under uvicorn on loopback, and a signed-in client."""
    with serve_asgi(lambda port: create_app(token=TOKEN, port=port)) as base:
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        ) as client:
            yield client


async def paused_turn(web: httpx.AsyncClient, message: str) -> dict[str, Any]:
    conv = (await web.post("/api/conversations", json={})).json()
    paused = await web.post(f"/api/conversations/{conv['id']}/turns", json={"message": message})
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
    return dict(paused.json())


def approvals_on_disk(home: str) -> list[dict[str, Any]]:
    """The approvals as the store file holds them (read-only, beside whoever has it open)."""
    with sqlite3.connect(f"file:{Path(home) / 'fleet.db'}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM agent_approvals ORDER BY created_at")]


# -- 3. the card shows exactly what will run ----------------------------------------------------------


@pytest.mark.slow
async def test_card_shows_key_shaped_command_and_arguments_exactly(
    agent_env: dict[str, str],  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
) -> None:
    add_server(agent_lm, "add the helper", LOOKALIKE)
    async with web_api() as web:
        paused = await paused_turn(web, "add the helper")
        [card] = paused["pending"]
        assert card["summary"] == EXACT and card["arguments"] == LOOKALIKE
        assert card["blocked"] is None  # nothing in it is a configured secret: Approve is offered
        listed = (await web.get("/api/approvals")).json()["approvals"]
        assert [a["summary"] for a in listed] == [EXACT]
    [row] = approvals_on_disk(agent_env["FLEET_HOME"])
    assert row["summary"] == EXACT and json.loads(row["arguments_json"]) == LOOKALIKE
    # The terminal asks about the same waiting card, word for word.
    shown = agent_chat("s\n/quit\n", agent_env)
    assert f"The agent asks to {EXACT}\n" in shown.stderr, shown.stderr


@pytest.mark.slow
async def test_card_with_a_configured_secret_offers_no_approve_and_the_api_refuses_it(
    agent_env: dict[str, str],  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
) -> None:
    keyed = {"name": "keyed", "command": "/usr/bin/env", "args": ["--key", CONFIGURED_SECRET]}
    add_server(agent_lm, "add the keyed helper", keyed)
    async with web_api() as web:
        paused = await paused_turn(web, "add the keyed helper")
        [card] = paused["pending"]
        assert CONFIGURED_SECRET not in json.dumps(card)  # masked, since it is a configured secret ...
        assert "configured secret" in card["blocked"]  # ... so the card cannot show it, and says so
        refused = await web.post(f"/api/approvals/{card['id']}", json={"approve": True})
        assert refused.status_code == 409 and "cannot be approved" in refused.json()["message"], refused.text
        always = await web.post(f"/api/approvals/{card['id']}", json={"approve": True, "always": True})
        assert always.status_code == 409
        conv = (await web.get(f"/api/conversations/{paused['conversation_id']}")).json()
        assert conv["mcp_servers"] == [] and conv["grants"] == []
    # The terminal offers no yes either: "y" is asked again, a rejection is taken.
    terminal = agent_chat("y\nn\nno keys in argv\n/quit\n", agent_env)
    assert "It cannot be approved: argument 2 contains a configured secret." in terminal.stderr, terminal.stderr
    assert "approve ([n]o / [s]kip)?" in terminal.stdout and "not an answer" in terminal.stderr
    assert "rejected: start the MCP server 'keyed'" in terminal.stderr
    [row] = approvals_on_disk(agent_env["FLEET_HOME"])
    assert row["status"] == "rejected" and row["decided_by"] == "cli" and row["executed_at"] is None
    assert CONFIGURED_SECRET not in json.dumps(row)


@pytest.mark.parametrize(
    ("argument", "why"),
    [
        ("--x\nrm -rf ~", "control or invisible characters"),
        ("--name=\u202etxt.exe", "control or invisible characters"),
        ("--pad=" + "x" * 5000, "too long to show whole"),
    ],
)
async def test_an_argument_the_card_cannot_show_blocks_approval_on_every_path(
    engine: Engine,  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    argument: str,
    why: str,
) -> None:
    add_server(agent_lm, "add odd", {"name": "odd", "command": "/bin/true", "args": [argument]})
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "add odd")
    [card] = paused.pending
    assert card.blocked is not None and why in card.blocked
    with pytest.raises(Conflict, match="cannot be approved"):
        await host.answer(card.id, True, always=True, actor="test")
    view = host.conversation(conv.id)
    assert view.approvals[0].status == "pending" and view.mcp_servers == [] and view.grants == []


async def test_an_always_grant_does_not_let_a_call_through_that_no_card_could_show(
    engine: Engine,  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    agent_env: dict[str, str],  # noqa: F811
) -> None:
    keep = {"path": "keys.md", "text": f"the key is {CONFIGURED_SECRET}"}
    agent_lm.add(Policy("keep the key", [Call("write_memory", keep), Say(lambda r: f"Result: {r.result}")]))
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    first = await host.chat(conv.id, "remember my bird")
    _, feed = await host.answer(first.pending[0].id, True, always=True, actor="test")
    assert (await feed.outcome()).status == "done"
    held = await host.chat(conv.id, "keep the key")
    assert held.status == "paused" and "configured secret" in (held.pending[0].blocked or ""), held
    memory = Path(agent_env["FLEET_HOME"]) / "volumes" / "workspace" / "memory"
    assert not (memory / "keys.md").exists()


# -- 4. the card names the file the tool writes -------------------------------------------------------


async def test_memory_card_names_the_file_the_tool_writes_and_says_overwrite(
    engine: Engine,  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    agent_env: dict[str, str],  # noqa: F811
) -> None:
    engine.volumes.write("workspace", "memory/a1.md", "old note\n")
    agent_lm.add(
        Policy("note a1", [Call("write_memory", {"path": "memory/a1.md", "text": "new note"}), Say(lambda r: r.result)])
    )
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "note a1")
    [card] = paused.pending
    sha = hashlib.sha256(b"old note\n").hexdigest()[:16]
    assert card.summary == f"overwrite vol:workspace/memory/a1.md (9 bytes now, sha256 {sha}) with 8 bytes: 'new note'"
    _, feed = await host.answer(card.id, True, actor="test")
    done = await feed.outcome()
    assert done.reply == "wrote 8 bytes to vol:workspace/memory/a1.md", done
    memory = Path(agent_env["FLEET_HOME"]) / "volumes" / "workspace" / "memory"
    assert (memory / "a1.md").read_text() == "new note"
    assert not (memory / "memory").exists()


# -- 4b. the card is checked again when the call runs ------------------------------------------------


def note(trigger: str, text: str, path: str = "a1.md") -> Policy:
    return Policy(trigger, [Call("write_memory", {"path": path, "text": text}), Say(lambda r: f"Result: {r.result}")])


def refusals(host: AgentHost, conversation_id: str) -> list[Any]:
    return [e for e in host.audit(conversation_id).entries if e.action == "refused"]


async def test_two_new_file_cards_for_one_path_the_second_is_refused_when_it_runs(
    engine: Engine,  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    agent_env: dict[str, str],  # noqa: F811
) -> None:
    agent_lm.add(note("note a1 first", "first note"))
    agent_lm.add(note("note a1 second", "second note"))
    host = AgentHost.of(engine)
    one, two = await host.create_conversation(volume="xv"), await host.create_conversation(volume="xv")
    [first] = (await host.chat(one.id, "note a1 first")).pending
    [second] = (await host.chat(two.id, "note a1 second")).pending
    assert first.summary == "write 10 bytes to new file vol:xv/memory/a1.md: 'first note'"
    assert second.summary == "write 11 bytes to new file vol:xv/memory/a1.md: 'second note'"
    _, feed = await host.answer(first.id, True, actor="test")
    assert (await feed.outcome()).reply == "Result: wrote 10 bytes to vol:xv/memory/a1.md"
    _, feed = await host.answer(second.id, True, actor="test")
    refused = (await feed.outcome()).reply
    assert "vol:xv/memory/a1.md changed since the approval card was shown" in refused, refused
    assert "a new card is needed" in refused, refused
    note_file = Path(agent_env["FLEET_HOME"]) / "volumes" / "xv" / "memory" / "a1.md"
    assert note_file.read_text() == "first note"
    [entry] = refusals(host, two.id)
    assert entry.approval_id == second.id and "changed since the approval card was shown" in (entry.reason or "")
    assert refusals(host, one.id) == []
    # Asked again, the new card says what the write now does.
    [again] = (await host.chat(two.id, "note a1 second")).pending
    sha = hashlib.sha256(b"first note").hexdigest()[:16]
    assert again.summary.startswith(f"overwrite vol:xv/memory/a1.md (10 bytes now, sha256 {sha}) with 11 bytes")


async def test_two_new_file_calls_of_one_turn_run_together_and_only_the_first_writes(
    engine: Engine,  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    agent_env: dict[str, str],  # noqa: F811
) -> None:
    both = [Call("write_memory", {"path": "a1.md", "text": t}) for t in ("left note", "right note")]
    agent_lm.add(Policy("note a1 twice", [Calls(both), Say("done")]))
    host = AgentHost.of(engine)
    conv = await host.create_conversation(volume="xv")
    cards = (await host.chat(conv.id, "note a1 twice")).pending
    assert [c.summary.split(":")[0] for c in cards] == [
        "write 9 bytes to new file vol",
        "write 10 bytes to new file vol",
    ]
    await host.answer(cards[0].id, True, actor="test")
    _, feed = await host.answer(cards[1].id, True, actor="test")  # the last one: both run now, concurrently
    assert (await feed.outcome()).status == "done"
    note_file = Path(agent_env["FLEET_HOME"]) / "volumes" / "xv" / "memory" / "a1.md"
    written = note_file.read_text()
    assert written in ("left note", "right note")
    [entry] = refusals(host, conv.id)
    loser = next(c for c in cards if c.summary.endswith(repr("right note" if written == "left note" else "left note")))
    assert entry.approval_id == loser.id and "changed since the approval card was shown" in (entry.reason or "")


async def test_an_overwrite_card_refuses_when_the_file_changed_even_at_the_same_size(
    engine: Engine,  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    agent_env: dict[str, str],  # noqa: F811
) -> None:
    engine.volumes.write("workspace", "memory/a1.md", "old note\n")
    agent_lm.add(note("note a1", "new note"))
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    [card] = (await host.chat(conv.id, "note a1")).pending
    assert card.summary.startswith("overwrite vol:workspace/memory/a1.md (9 bytes now, sha256 ")
    engine.volumes.write("workspace", "memory/a1.md", "OLD NOTE\n")  # the sandbox, say: same size
    _, feed = await host.answer(card.id, True, actor="test")
    refused = (await feed.outcome()).reply
    assert "changed since the approval card was shown" in refused and "a new card is needed" in refused, refused
    memory = Path(agent_env["FLEET_HOME"]) / "volumes" / "workspace" / "memory"
    assert (memory / "a1.md").read_text() == "OLD NOTE\n"
    [entry] = refusals(host, conv.id)
    assert entry.approval_id == card.id


# -- 5. answers are whole words, on every face --------------------------------------------------------


@pytest.mark.slow
def test_terminal_prompt_does_not_approve_on_a_first_letter(
    agent_env: dict[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLEET_SANDBOX")  # the terminal inherits this process's environment too
    term = Terminal("fleet", "--agent", env=subprocess_env(agent_env))
    try:
        term.type("remember my favourite bird")
        term.expect("approve (")
        mark = len(term.seen)
        term.type("AGENT-CALL list_runs {}")  # a new message, not an answer
        term.expect("approve (", after=mark, timeout=60)  # asked again
        assert [a["status"] for a in approvals_on_disk(agent_env["FLEET_HOME"])] == ["pending"]
        mark = len(term.seen)
        term.type(" No ")
        term.expect("reason", after=mark)
        term.type("not now")
        term.expect("rejected", after=mark)
        term.type("/quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
    [row] = approvals_on_disk(agent_env["FLEET_HOME"])
    assert row["status"] == "rejected" and not row["always"] and row["executed_at"] is None
    assert not memory_file(agent_env["FLEET_HOME"]).exists()


@pytest.mark.slow
async def test_web_and_mcp_decisions_take_only_true_false_or_whole_words(
    agent_env: dict[str, str],  # noqa: F811
) -> None:
    async with web_api() as web:
        paused = await paused_turn(web, "remember my favourite bird")
        approval = f"/api/approvals/{paused['pending'][0]['id']}"
        for loose in ("a", "AGENT-CALL list_runs", "on", "1", 1, "t"):
            answer = await web.post(approval, json={"approve": loose})
            assert answer.status_code == 400, (loose, answer.text)
    async with Client(build_server(), mode="auto") as mcp:
        for loose in ("on", "1", "agree"):
            answer = await mcp.call_tool("approve", {"approval_id": paused["pending"][0]["id"], "approve": loose})
            assert answer.is_error, (loose, answer)
    assert [a["status"] for a in approvals_on_disk(agent_env["FLEET_HOME"])] == ["pending"]
    assert not memory_file(agent_env["FLEET_HOME"]).exists()
    async with Client(build_server(), mode="auto") as mcp:
        done = await mcp.call_tool("approve", {"approval_id": paused["pending"][0]["id"], "approve": " YES "})
        assert not done.is_error and done.structured_content["status"] == "approved", done
    assert memory_file(agent_env["FLEET_HOME"]).exists()


# -- 6. a cost cap is enforced, or refused up front ---------------------------------------------------


async def test_agent_run_with_a_cap_on_an_unpriced_model_is_not_auto_approved(
    agent_env: dict[str, str],  # noqa: F811
    agent_lm: AgentLM,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in PRICES:
        monkeypatch.delenv(name, raising=False)  # the oracle model: LiteLLM has no price for it
    agent_lm.add(Policy("cheap run", [Call("rlm_run", {"question": "q", "context_text": "x", "max_cost": 0.01})]))
    async with Engine(load_settings()) as unpriced:
        host = AgentHost.of(unpriced)
        conv = await host.create_conversation()
        paused = await host.chat(conv.id, "cheap run")
        assert paused.status == "paused", paused
        [card] = paused.pending
        assert card.status == "pending" and "cannot be enforced" in card.summary, card.summary
        assert unpriced.workspace.list_runs().runs == []


def fleet_rlm(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "fleet-rlm"), *argv], capture_output=True, text=True, env={**os.environ, **env}, timeout=180
    )


@pytest.mark.slow
def test_run_with_a_cap_on_an_unpriced_model_fails_before_any_model_call(
    fleet_env: dict[str, str], oracle: OracleLM
) -> None:
    oracle.add(Scenario("cheap", ["SUBMIT('done')"]))
    refused = fleet_rlm("run", "cheap question", "--text", "x", "--max-cost", "0.01", env=fleet_env)
    assert refused.returncode == 2, refused.stderr
    first = refused.stderr.splitlines()[0]
    assert first.startswith("error: ") and "no known price" in first, refused.stderr
    assert "lm_price_per_mtok_in" in first and "max_llm_calls" in first, first
    assert oracle.requests() == []  # no model call was made
    listed = json.loads(fleet_rlm("runs", "--json", env=fleet_env).stdout)
    assert listed == []  # nor a run recorded


@pytest.mark.slow
def test_with_a_per_token_price_the_cap_is_enforced(fleet_env: dict[str, str], oracle: OracleLM) -> None:
    # Four sub-calls of ~25k prompt tokens each at $1 per million: about $0.10, past a $0.01 cap.
    oracle.add(Scenario("pricey", ["r = llm_query_batched(['word ' * 20000] * 4)\nprint(len(r))", "SUBMIT('x')"]))
    env = {**fleet_env, PRICES[0]: "1", PRICES[1]: "2"}
    proc = fleet_rlm("run", "pricey question", "--text", "x", "--max-cost", "0.01", "--json", env=env)
    result = json.loads(proc.stdout)
    assert result["stop_reason"] == "cost limit of $0.01 reached", proc.stdout + proc.stderr
    [usage] = result["usage"]["by_model"].values()
    priced = usage["prompt_tokens"] * 1 / 1e6 + usage["completion_tokens"] * 2 / 1e6
    assert usage["cost"] == pytest.approx(priced) and usage["cost"] > 0.01
    assert result["iterations"] == 1  # the step after the cap ran out never ran
