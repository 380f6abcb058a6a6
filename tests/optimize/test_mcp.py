"""The MCP face: optimize (waiting, with progress), the optimization resource, list_programs and
promote_program (gate, override, rollback), then a run through the run tool uses the promoted version."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_rlm.config import load_settings
from fleet_rlm.core.workspace import Workspace
from fleet_rlm.mcp.server import build_server
from fleet_rlm.optimize import datasets
from mcp import Client
from tests.support.oracle_lm import OracleLM

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(fake_env: dict[str, str], shout: OracleLM, shout_file: Path) -> AsyncIterator[Client]:
    with Workspace.open(load_settings()) as ws:
        rows = datasets.parse_jsonl(shout_file.read_text().splitlines())
        await datasets.create(ws, "shout", rows, source="jsonl")
    async with Client(build_server()) as c:
        yield c


@pytest.mark.slow
async def test_optimize_promote_and_roll_back_over_mcp(client: Client, shout: OracleLM) -> None:
    progress: list[str] = []

    async def on_progress(_done: float, _total: float | None, message: str | None) -> None:
        progress.append(message or "")

    called = await client.call_tool("optimize", {"dataset": "shout", "optimizer": "bootstrap", "metric": "exact",
                                                 "wait": True}, progress_callback=on_progress)  # fmt: skip
    assert not called.is_error, called.content
    out = called.structured_content
    assert out is not None and out["status"] == "succeeded"
    result = out["result"]
    assert result["scores"]["train_after"] == 1.0 > result["scores"]["train_before"]
    assert any(line.startswith("trial 1 · candidate") for line in progress)
    assert any("after: holdout score" in line for line in progress)

    resource = json.loads((await client.read_resource(out["resource_uri"])).contents[0].text)  # type: ignore[union-attr]
    assert resource["version_id"] == result["version_id"] and resource["trials"][-1]["score"] == 1.0
    version = result["version_id"]
    listed = (await client.call_tool("list_programs", {})).structured_content
    assert listed is not None and listed["active"] == "builtin" and listed["versions"][0]["id"] == version

    promoted = (await client.call_tool("promote_program", {"version_id": version})).structured_content
    assert promoted is not None and promoted["active"] == version
    run = (await client.call_tool("run", {"question": "Shout the word in the context (plum)",
                                          "context_text": "Word: plum"})).structured_content  # fmt: skip
    assert run is not None and run["answer"] == "PLUM"
    back = (await client.call_tool("promote_program", {"rollback": True})).structured_content
    assert back is not None and back["active"] == "builtin"
    refused = await client.call_tool("promote_program", {"version_id": "v-nope"})
    assert refused.is_error and "no program version 'v-nope'" in refused.content[0].text  # type: ignore[union-attr]


async def test_a_bad_optimize_request_is_a_readable_tool_error(client: Client) -> None:
    bad = await client.call_tool("optimize", {"dataset": "nope", "optimizer": "gepa"})
    assert bad.is_error and "no dataset 'nope'" in bad.content[0].text  # type: ignore[union-attr]
    started = (await client.call_tool("optimize", {"dataset": "shout", "optimizer": "bootstrap"})).structured_content
    assert started is not None and started["status"] == "running" and started["estimate"]["evaluations"] > 0
