"""MCP tools take a run as the CLI does: `last`, `last~N`, or a unique start or end of its id."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp import Client
from tests.support.run_refs import MIDDLE, NEWEST, seed_runs

pytestmark = pytest.mark.anyio


async def test_get_run_takes_last_and_a_suffix(fleet_env: dict[str, str], client: Client) -> None:
    seed_runs(Path(fleet_env["FLEET_HOME"]))
    last = (await client.call_tool("get_run", {"run_id": "last"})).structured_content
    assert last["run_id"] == NEWEST and last["trace_uri"] == f"fleet://runs/{NEWEST}/trace"
    by_end = (await client.call_tool("get_run", {"run_id": MIDDLE[-6:]})).structured_content
    assert by_end["run_id"] == MIDDLE


async def test_ambiguous_run_is_a_tool_error_that_says_so(fleet_env: dict[str, str], client: Client) -> None:
    seed_runs(Path(fleet_env["FLEET_HOME"]))
    result = await client.call_tool("get_run", {"run_id": "cafe"})
    assert result.is_error and "matches more than one run" in result.content[0].text
