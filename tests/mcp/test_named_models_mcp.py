"""MCP results carry usage per configured model when a named model (FLEET_MODELS) answered (issue 38):
an in-memory MCP client, two scripted model servers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from mcp import Client
from tests.support.oracle_lm import OracleLM, Scenario, default_sub

pytestmark = pytest.mark.anyio


@pytest.fixture
def fast(fleet_env: dict, monkeypatch: pytest.MonkeyPatch) -> Iterator[OracleLM]:
    scenario = Scenario("never a root here", ["SUBMIT('x')"], sub=lambda p: "fast:" + default_sub(p))
    with OracleLM(scenario) as lm:
        monkeypatch.setenv(
            "FLEET_MODELS", json.dumps({"fast": {"model": "openai/gpt-4o-mini", "api_base": lm.base_url}})
        )
        yield lm


async def test_run_and_get_run_report_usage_per_named_model(fast: OracleLM, client: Client, oracle: OracleLM) -> None:
    oracle.add(Scenario("ask fast", ["SUBMIT(llm_query('The secret code is M1', model='fast'))"]))
    done = (await client.call_tool("run", {"question": "ask fast", "context_text": "x"})).structured_content
    assert done is not None and done["status"] == "succeeded" and done["answer"] == "fast:M1"
    state = (await client.call_tool("get_run", {"run_id": done["run_id"]})).structured_content
    assert state is not None
    for usage in (done["usage"], state["usage"]):
        assert {name: part["calls"] for name, part in usage["by_name"].items()} == {"root": 1, "fast": 1}
        assert usage["by_name"]["fast"]["model"] == "openai/gpt-4o-mini"
    assert len(fast.requests()) == 1
