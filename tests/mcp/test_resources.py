"""Resources and their change notifications, in both protocol eras."""

from __future__ import annotations

import json
import warnings
from typing import Any

import anyio
import mcp.types as types
import pytest

from fleet_rlm.mcp.server import build_server
from mcp import Client, MCPError
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

# Three steps with model latency in between: long enough to subscribe while it runs.
STEPPED = ["print('one')", "print('two')", "SUBMIT('three')"]


async def test_resource_listing(client: Client) -> None:
    static = (await client.list_resources()).resources
    assert [(str(r.uri), r.mime_type) for r in static] == [("fleet://runs", "application/json")]
    templates = {t.uri_template: t for t in (await client.list_resource_templates()).resource_templates}
    assert set(templates) == {
        "fleet://runs/{run_id}",
        "fleet://runs/{run_id}/trace",
        "fleet://volumes/{volume}/{+path}",
        "fleet://optimizations/{opt_id}",
        "fleet://programs/{version_id}",
    }
    assert all(t.description for t in templates.values())


@pytest.mark.slow
async def test_run_resources(client: Client, oracle: OracleLM) -> None:
    assert json.loads((await client.read_resource("fleet://runs")).contents[0].text) == []  # type: ignore[union-attr]
    oracle.add(Scenario("hello", ["SUBMIT('hi there')"]))
    run = (await client.call_tool("run", {"question": "say hello", "context_text": "x"})).structured_content
    run_id = run["run_id"]  # type: ignore[index]

    listed = json.loads((await client.read_resource("fleet://runs")).contents[0].text)  # type: ignore[union-attr]
    assert [(r["run_id"], r["status"], r["answer_preview"]) for r in listed] == [(run_id, "succeeded", "hi there")]
    state = await client.read_resource(f"fleet://runs/{run_id}")
    assert state.contents[0].mime_type == "application/json"
    assert json.loads(state.contents[0].text)["question"] == "say hello"  # type: ignore[union-attr]
    trace = json.loads((await client.read_resource(f"fleet://runs/{run_id}/trace")).contents[0].text)  # type: ignore[union-attr]
    assert trace["root"] == "root" and trace["run"]["status"] == "succeeded"
    assert trace["nodes"]["root"]["steps"][0]["code"] == "SUBMIT('hi there')"

    for uri in ("fleet://runs/r-nope", "fleet://runs/r-nope/trace"):
        with pytest.raises(MCPError, match="no run 'r-nope'"):
            await client.read_resource(uri)


async def _start_slow_run(client: Client, oracle: OracleLM) -> str:
    oracle.add(Scenario("stepwise", STEPPED))
    oracle.state.latency = 0.3
    started = await client.call_tool("start_run", {"question": "stepwise please", "context_text": "x"})
    return started.structured_content["run_id"]  # type: ignore[index]


async def _wait_done(client: Client, run_id: str) -> None:
    """Let the run finish, so no model request is cut off when the test ends."""
    with anyio.fail_after(20):
        while (await client.call_tool("get_run", {"run_id": run_id})).structured_content["status"] == "running":  # type: ignore[index]
            await anyio.sleep(0.05)


@pytest.mark.slow
async def test_modern_clients_get_updates_via_listen(fleet_env: dict, oracle: OracleLM) -> None:
    async with Client(build_server(), mode="auto") as client:
        await client.call_tool("list_runs", {})  # open the engine, so its watcher runs
        seen: list[str] = []
        async with client.listen(resource_subscriptions=["fleet://runs"]) as runs_sub:
            run_id = await _start_slow_run(client, oracle)
            with anyio.fail_after(10):
                async for event in runs_sub:
                    seen.append(event.uri)  # type: ignore[union-attr]
                    break
        assert seen == ["fleet://runs"]
        trace_uri = f"fleet://runs/{run_id}/trace"
        async with client.listen(resource_subscriptions=[trace_uri]) as trace_sub:
            with anyio.fail_after(10):
                async for event in trace_sub:
                    seen.append(event.uri)  # type: ignore[union-attr]
                    break
        assert seen[-1] == trace_uri
        await _wait_done(client, run_id)


@pytest.mark.slow
async def test_legacy_clients_get_updates_via_subscribe(fleet_env: dict, oracle: OracleLM) -> None:
    updates: list[str] = []
    got = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)
            got.set()

    async with Client(build_server(), mode="legacy", message_handler=on_message) as client:
        with warnings.catch_warnings():  # resources/subscribe is deprecated, and exactly what we test
            warnings.simplefilter("ignore")
            await client.subscribe_resource("fleet://runs")
        run_id = await _start_slow_run(client, oracle)
        with anyio.fail_after(10):
            await got.wait()
        assert updates[0] == "fleet://runs"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.subscribe_resource(f"fleet://runs/{run_id}")
        with anyio.fail_after(20):
            while f"fleet://runs/{run_id}" not in updates:
                await anyio.sleep(0.05)
        # Not subscribed to the trace: no notification for it.
        assert f"fleet://runs/{run_id}/trace" not in updates
        await _wait_done(client, run_id)
