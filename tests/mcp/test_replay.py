"""``replay_run`` and ``fork_run`` through a real MCP client, in both protocol eras: a replay reports no
divergence and asks no model, a fork reports its lineage, both report progress and stop when the
client cancels."""

from __future__ import annotations

import anyio
import pytest

from fleet_rlm.config import load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.mcp.server import build_server
from mcp import Client
from tests.mcp.conftest import SLOW_STEPS
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

STEPS = [
    "print(context)",
    "answers = llm_query_batched(['The secret code is A1', 'The secret code is B2'])\nprint(answers)",
    "SUBMIT(' '.join(answers))",
]


async def _recorded(client: Client, oracle: OracleLM) -> str:
    oracle.add(Scenario("find the codes", STEPS))
    run = await client.call_tool("run", {"question": "find the codes", "context_text": "alpha"})
    assert run.structured_content is not None and run.structured_content["answer"] == "A1 B2"
    return str(run.structured_content["run_id"])


async def test_replay_and_fork_tools(client: Client, oracle: OracleLM) -> None:
    source = await _recorded(client, oracle)
    asked = len(oracle.requests())
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    replay = await client.call_tool("replay_run", {"run_id": source}, progress_callback=on_progress)
    report = replay.structured_content
    assert not replay.is_error and report is not None, replay.content
    assert report["source_run_id"] == source and report["diverged"] is False and report["same_answer"] is True
    assert report["first_divergence"] is None and len(report["steps"]) == 3
    assert report["trace_uri"] == f"fleet://runs/{report['run_id']}/trace"
    assert progress[0] == f"run {report['run_id']} started" and progress[-1] == "run succeeded"

    fork = await client.call_tool("fork_run", {"run_id": source, "at": "3", "code": "SUBMIT(answers[0] + '!')"})
    out = fork.structured_content
    assert not fork.is_error and out is not None, fork.content
    assert out["answer"] == "A1!" and (out["parent_run_id"], out["fork_at"]) == (source, "root:3")
    assert len(oracle.requests()) == asked  # the replay and the fork's first steps asked no model

    listed = (await client.call_tool("list_runs", {})).structured_content
    forked = next(r for r in listed["runs"] if r["run_id"] == out["run_id"])  # type: ignore[index]
    assert (forked["parent_run_id"], forked["fork_at"]) == (source, "root:3")
    page = (await client.call_tool("inspect_trace", {"run_id": out["run_id"]})).structured_content
    assert page is not None and page["lineage"] == {"kind": "fork", "source": source, "at": "root:3"}

    bad = await client.call_tool("fork_run", {"run_id": source, "at": "7", "code": "print(1)"})
    assert bad.is_error and "has steps 1..3" in bad.content[0].text  # type: ignore[union-attr]
    unknown = await client.call_tool("replay_run", {"run_id": "r-nope"})
    assert unknown.is_error and "no run 'r-nope'" in unknown.content[0].text  # type: ignore[union-attr]


@pytest.mark.slow
async def test_cancelling_a_fork_call_cancels_the_fork(fleet_env: dict, oracle: OracleLM, era: str) -> None:
    oracle.add(Scenario("take your time", ["print('quick')", "SUBMIT('never')"]))
    async with Engine(load_settings()) as engine, Client(build_server(engine), mode=era) as client:
        run = await client.call_tool("run", {"question": "take your time", "context_text": "x"})
        source = run.structured_content["run_id"]  # type: ignore[index]
        messages: list[str] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")

        with anyio.move_on_after(2.5) as scope:  # step 2 runs slow code given for the fork
            await client.call_tool(
                "fork_run", {"run_id": source, "at": "2", "code": SLOW_STEPS[0]}, progress_callback=on_progress
            )
        assert scope.cancelled_caught, "the fork should still have been going"
        fork_id = messages[0].split()[1]
        with anyio.fail_after(20):
            while (rec := engine.get_run(fork_id)) is None or rec.status != "cancelled":
                await anyio.sleep(0.05)
        assert rec.parent_run_id == source and rec.fork_at == "root:2"
