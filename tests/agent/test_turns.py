"""Turns in-process: an RLM run answered from, a memory write paused for approval, rejected, expired."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.agent.tools import TurnContext
from fleet_rlm.agent.turn import run_segment
from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import Conflict
from fleet_rlm.store.agent import workflow_name
from tests.agent.conftest import CODE, MEMORY, memory_file, upload
from tests.support.agent_lm import AgentLM, Call, Policy, Say

pytestmark = pytest.mark.anyio


async def test_turn_runs_an_rlm_and_answers_from_it(engine: Engine, agent_lm: AgentLM, tmp_path: Path) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation("codes")
    feed = await host.send(conv.id, "what is the secret code in my file?", upload_ids=[upload(engine, tmp_path)])
    events = [e async for e in feed.follow()]
    end = events[-1]
    assert end["kind"] == "turn.finished" and end["status"] == "done", end
    assert CODE in end["reply"] and len(end["runs"]) == 1
    kinds = [e["kind"] for e in events]
    assert "tool.call" in kinds and "run.started" in kinds and "run.progress" in kinds and "text" in kinds
    # Within the cost threshold: a policy approved it, and the audit log says so.
    view = host.conversation(conv.id)
    assert [a.status for a in view.approvals] == ["approved"] and view.approvals[0].decided_by.startswith("policy")
    assert {e.action for e in view.audit} == {"requested", "auto_approved", "executed"}
    assert view.runs[0].run_id == end["runs"][0] and view.runs[0].status == "succeeded"
    run = engine.workspace.run(end["runs"][0])
    assert run.session_id == view.session_id and run.answer == CODE
    assert [m.kind for m in view.messages] == ["text", "tool_call", "tool_result", "text"]
    assert all(r.stream for r in agent_lm.requests)  # the client streamed every reply


async def test_memory_write_waits_for_approval(engine: Engine, agent_env: dict[str, str]) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "please remember my favourite bird")
    assert paused.status == "paused" and len(paused.pending) == 1
    approval = paused.pending[0]
    assert approval.tool == "write_memory" and "memory/birds.md" in approval.summary
    assert not memory_file(agent_env["FLEET_HOME"]).exists()
    with pytest.raises(Conflict, match=f"answer approval {approval.id} first"):  # one turn at a time
        await host.send(conv.id, "and another thing")
    decided, feed = await host.answer(approval.id, True, actor="test")
    assert decided.status == "approved" and feed is not None
    done = await feed.outcome()
    assert done.status == "done" and "wrote" in done.reply
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY


async def test_rejection_reaches_the_agent_with_its_reason(
    engine: Engine, agent_lm: AgentLM, agent_env: dict[str, str]
) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "remember this bird")
    decided, feed = await host.answer(paused.pending[0].id, False, reason="not this bird, please", actor="test")
    assert decided.status == "rejected" and feed is not None
    done = await feed.outcome()
    assert done.status == "done" and "rejected" in done.reply and "not this bird, please" in done.reply
    assert not memory_file(agent_env["FLEET_HOME"]).exists()
    assert "not this bird, please" in agent_lm.requests[-1].messages[-1]["content"]  # the model read the reason
    audit = host.audit(conv.id).entries
    assert [(e.action, e.actor) for e in reversed(audit)] == [("requested", "agent"), ("rejected", "test")]
    with pytest.raises(Conflict, match="rejected already"):  # decided once, by one face
        await host.answer(paused.pending[0].id, True, actor="someone else")


async def test_an_approved_call_runs_once_even_if_resumed_twice(engine: Engine, agent_env: dict[str, str]) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "remember the bird")
    approval = paused.pending[0]
    checkpoints = engine.workspace.store.agent.workflow_checkpoints(workflow_name(paused.turn_id))
    _, feed = await host.answer(approval.id, True, actor="test")
    assert (await feed.outcome()).status == "done"
    memory_file(agent_env["FLEET_HOME"]).unlink()
    # Replay the paused checkpoint (as a crashed resume might): the gate refuses to run the call again.
    store = engine.workspace.store
    for checkpoint in checkpoints:
        await store.write(store.agent.save_checkpoint, checkpoint.id, checkpoint.workflow_name, checkpoint.data)
    tc = TurnContext(engine, engine.workspace.store.agent.get_conversation(conv.id), paused.turn_id, lambda _e: None)
    replay = await run_segment(tc, new_messages=None)
    assert "ran already" in replay.reply
    assert not memory_file(agent_env["FLEET_HOME"]).exists()
    assert [e.action for e in host.audit(conv.id).entries].count("executed") == 1


async def test_pending_approval_expires(engine: Engine, agent_env: dict[str, str]) -> None:
    engine.settings.agent_approval_ttl_seconds = 0.2
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "remember my bird")
    await anyio.sleep(0.3)
    with pytest.raises(Conflict, match="expired"):
        await host.answer(paused.pending[0].id, True, actor="test")
    view = host.conversation(conv.id)
    assert view.status == "idle" and view.approvals[0].status == "expired"
    assert view.messages[-1].kind == "tool_result" and "expired" in (view.messages[-1].text or "")
    assert "expired" in [e.action for e in view.audit]
    assert not memory_file(agent_env["FLEET_HOME"]).exists()
    # The conversation goes on, and its history stays whole for the model.
    again = await host.chat(conv.id, "what is the secret code? (no files)")
    assert again.status == "done"


async def test_always_for_this_conversation(engine: Engine, agent_env: dict[str, str]) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "remember one")
    _, feed = await host.answer(paused.pending[0].id, True, always=True, actor="test")
    await feed.outcome()
    second = await host.chat(conv.id, "remember two")
    assert second.status == "done"
    view = host.conversation(conv.id)
    assert view.grants == ["write_memory"] and view.approvals[-1].decided_by.startswith("policy: always")
    other = await host.create_conversation()
    assert (await host.chat(other.id, "remember three")).status == "paused"  # the grant is per conversation


async def test_a_model_that_cannot_be_reached_fails_the_turn_not_the_conversation(
    engine: Engine, agent_lm: AgentLM
) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    engine.settings.agent_lm_api_base = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    failed = await host.chat(conv.id, "remember anything")
    assert failed.status == "failed" and "cannot reach" in (failed.error or ""), failed
    assert "sk-test-agent" not in (failed.error or "")
    engine.settings.agent_lm_api_base = agent_lm.base_url
    assert (await host.chat(conv.id, "remember it now")).status == "paused"  # the conversation goes on


async def test_a_run_without_a_cost_cap_waits_for_approval(engine: Engine, tmp_path: Path) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "uncapped: find the code")
    assert paused.status == "paused" and paused.pending[0].tool == "rlm_run"
    assert "no cost cap" in paused.pending[0].summary
    assert engine.workspace.list_runs().runs == []  # nothing started before the approval
    _, feed = await host.answer(paused.pending[0].id, False, reason="too expensive", actor="test")
    assert "too expensive" in (await feed.outcome()).reply
    assert engine.workspace.list_runs().runs == []


async def test_live_tool_call_events_never_carry_a_configured_secret(
    engine: Engine, agent_lm: AgentLM, agent_env: dict[str, str]
) -> None:
    """The model may put a key into a tool call's arguments: the live event is masked like the stored row."""
    key = agent_env["FLEET_AGENT_LM_API_KEY"]
    agent_lm.add(Policy("leak it", [Call("write_memory", {"path": "k.md", "text": f"key={key}"}), Say("ok")]))
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    feed = await host.send(conv.id, "leak it")
    events = [e async for e in feed.follow()]
    calls = [e for e in events if e["kind"] == "tool.call"]
    assert calls and calls[0]["tool"] == "write_memory"
    assert key not in str(events) and "***" in calls[0]["arguments"]["text"]
