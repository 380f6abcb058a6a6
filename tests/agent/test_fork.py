"""The workspace agent replays and forks runs: a replay runs at once (no model calls, no cost), a fork
waits for the user's approval, whose card says what the fork will do, and then asks no model for the
steps before its fork point."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from tests.agent.conftest import CODE
from tests.support.agent_lm import AgentLM, Call, Policy, Say
from tests.support.oracle_lm import OracleLM
from tests.support.workloads import write_haystack

pytestmark = pytest.mark.anyio


async def _recorded(engine: Engine, tmp_path: Path) -> str:
    hay = write_haystack(tmp_path / "hay.txt", 20_000, CODE)
    result = await engine.run(RunRequest("What is the secret code?", context_paths=[str(hay)]))
    assert result.answer == CODE
    return result.run_id


@pytest.mark.slow
async def test_the_agent_replays_at_once_and_forks_after_approval(
    engine: Engine, agent_lm: AgentLM, needle: OracleLM, tmp_path: Path
) -> None:
    source = await _recorded(engine, tmp_path)
    asked = len(needle.requests())
    agent_lm.add(Policy("replay it", [Call("replay_run", {"run_id": source}), Say(lambda r: f"Replay: {r.result}")]))
    agent_lm.add(Policy("fork it", [
        Call("fork_run", {"run_id": source, "at": "3", "code": "SUBMIT('forked ' + found[0])"}),
        Say(lambda r: f"Fork: {r.result}"),
    ]))  # fmt: skip
    host = AgentHost.of(engine)
    conv = await host.create_conversation("forks")

    replayed = await host.chat(conv.id, "replay it")
    assert replayed.status == "done" and '"diverged": false' in replayed.reply, replayed.reply

    paused = await host.chat(conv.id, "fork it")
    assert paused.status == "paused" and [a.tool for a in paused.pending] == ["fork_run"]
    summary = paused.pending[0].summary
    assert f"fork run {source} at step 3" in summary and "run code there \"SUBMIT('forked" in summary
    assert "no cost cap" in summary
    assert len(engine.workspace.runs(kind="run")) == 1  # nothing forked before the approval
    decided, feed = await host.answer(paused.pending[0].id, True, actor="test")
    assert decided.status == "approved" and feed is not None
    done = await feed.outcome()
    assert done.status == "done" and f"forked {CODE}" in done.reply, done.reply
    assert len(needle.requests()) == asked  # the replay and the fork's steps 1-2 asked no model
    fork = next(r for r in engine.workspace.runs(kind="run") if r.id != source)
    assert (fork.parent_run_id, fork.fork_at) == (source, "root:3")
    assert {r.run_id for r in host.conversation(conv.id).runs} >= {fork.id}
