"""The MCP face when another process holds the store's write lock: the `run` tool answers with a tool
error in the CLI's words (an outage the model can tell the user about), not a bare "Error executing tool
run", which is all a client reads of an error that is not a ``FleetError``."""

from __future__ import annotations

import sqlite3

import pytest

from fleet_rlm.config import load_settings
from mcp import Client
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio
LOCKED = "stayed locked for 0.2 s by another fleet-rlm process; try again when it is less busy"


@pytest.fixture
def quick_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet_rlm.store.db._BUSY_SECONDS", 0.2)  # before the server's store opens


async def test_a_store_locked_by_another_process_is_a_tool_error_that_says_so(
    quick_busy_timeout: None, client: Client, oracle: OracleLM
) -> None:
    oracle.add(Scenario("quick question", ["SUBMIT('answered')"]))
    question = {"question": "quick question", "context_text": "x"}
    first = await client.call_tool("run", question)
    assert not first.is_error, first.content  # the server has written: its writer is connected
    holder = sqlite3.connect(load_settings().store_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another fleet-rlm process in the middle of a long write
    try:
        refused = await client.call_tool("run", question)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert refused.is_error
    text = refused.content[0].text  # type: ignore[union-attr]
    assert text.endswith(LOCKED), text
    again = await client.call_tool("run", question)
    assert not again.is_error and again.structured_content["answer"] == "answered"  # type: ignore[index]
