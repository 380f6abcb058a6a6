"""The agent over MCP through the SDK's real client: approvals asked by elicitation in both protocol eras
(mid-tool on 2025-11-25, the input-required round on 2026-07-28), and the approve tool for clients that
cannot be asked."""

from __future__ import annotations

from typing import Any

import pytest

from fleet_rlm.mcp.server import build_server
from mcp import Client, types
from tests.agent.conftest import MEMORY, memory_file

pytestmark = pytest.mark.anyio


def answering(content: dict[str, Any] | None, action: str = "accept", asked: list[str] | None = None) -> Any:
    async def callback(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if asked is not None:
            asked.append(params.message)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return callback


@pytest.mark.slow
@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_elicitation_approves_the_memory_write(agent_env: dict[str, str], era: str) -> None:
    asked: list[str] = []
    async with Client(build_server(), mode=era, elicitation_callback=answering({"approve": True}, asked=asked)) as c:
        assert c.protocol_version == ("2025-11-25" if era == "legacy" else "2026-07-28")
        result = await c.call_tool("chat", {"message": "remember my favourite bird"})
        out = result.structured_content
        assert not result.is_error and out is not None, result
        assert out["status"] == "done" and "wrote" in out["reply"] and out["how_to_approve"] is None
        assert len(asked) == 1 and "memory/birds.md" in asked[0]
        listing = (await c.call_tool("conversations", {"conversation_id": out["conversation_id"]})).structured_content
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY
    audit = [(e["action"], e["actor"]) for e in reversed(listing["conversation"]["audit"])]
    assert audit == [("requested", "agent"), ("approved", "mcp"), ("executed", "agent")]


@pytest.mark.slow
@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_elicitation_decline_is_a_rejection(agent_env: dict[str, str], era: str) -> None:
    decline = answering(None, action="decline")
    async with Client(build_server(), mode=era, elicitation_callback=decline) as c:
        out = (await c.call_tool("chat", {"message": "remember this"})).structured_content
    assert out["status"] == "done" and "declined in the MCP client" in out["reply"]
    assert not memory_file(agent_env["FLEET_HOME"]).exists()


@pytest.mark.slow
async def test_without_elicitation_the_result_says_how_and_approve_works(agent_env: dict[str, str]) -> None:
    async with Client(build_server(), mode="auto") as c:
        out = (await c.call_tool("chat", {"message": "remember it"})).structured_content
        assert out["status"] == "paused" and "approve tool" in out["how_to_approve"]
        approval_id = out["pending"][0]["id"]
        assert not memory_file(agent_env["FLEET_HOME"]).exists()
        listed = (await c.call_tool("conversations", {})).structured_content
        assert [p["id"] for p in listed["pending_approvals"]] == [approval_id]
        done = (await c.call_tool("approve", {"approval_id": approval_id, "approve": True})).structured_content
        assert done["status"] == "approved" and done["turn"]["status"] == "done"
        again = await c.call_tool("approve", {"approval_id": approval_id, "approve": True})
        assert again.is_error and "approved already" in again.content[0].text  # type: ignore[union-attr]
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY
