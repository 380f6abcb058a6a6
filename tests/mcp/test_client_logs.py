"""logging/setLevel: 2025-era clients that ask receive the server's log records; 2026 has no such method."""

from __future__ import annotations

import logging

import pytest
from mcp.types import METHOD_NOT_FOUND, LoggingMessageNotificationParams

from fleet_rlm.mcp.client_logs import mcp_level
from fleet_rlm.mcp.server import build_server
from mcp import Client, MCPError

# The SDK marks the client side of logging/setLevel and ping deprecated (they are 2025-era only).
pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]


async def test_legacy_client_gets_logs_at_its_level(fleet_env: dict[str, str]) -> None:
    received: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        received.append(params)

    async with Client(build_server(), mode="legacy", logging_callback=on_log) as client:
        assert client.server_capabilities is not None and client.server_capabilities.logging is not None
        await client.call_tool("list_runs", {})  # opens the engine, which logs at INFO: not asked for yet
        assert received == []

    async with Client(build_server(), mode="legacy", logging_callback=on_log) as client:
        assert (await client.set_logging_level("info")).model_dump(exclude_none=True) == {}
        await client.call_tool("list_runs", {})
        logging.getLogger("fleet_rlm.test").debug("below the level: not sent")
        logging.getLogger("fleet_rlm.test").warning("key sk-abcdefgh12345678 leaked")
        await client.send_ping()  # a round trip, so notifications sent before it have arrived
    opened = [m for m in received if "engine opened" in str(m.data)]
    assert opened and opened[0].level == "info" and opened[0].logger == "fleet_rlm.mcp.provider"
    assert not any("below the level" in str(m.data) for m in received)
    (leak,) = [m for m in received if "leaked" in str(m.data)]
    assert leak.level == "warning" and "sk-abcdefgh12345678" not in str(leak.data)  # masked like stderr


async def test_legacy_level_filters(fleet_env: dict[str, str]) -> None:
    received: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        received.append(params)

    async with Client(build_server(), mode="legacy", logging_callback=on_log) as client:
        await client.set_logging_level("error")
        await client.call_tool("list_runs", {})
        logging.getLogger("fleet_rlm.test").error("an error")
        await client.send_ping()
    assert [m.data for m in received] == ["an error"]


async def test_modern_era_has_no_set_level(fleet_env: dict[str, str]) -> None:
    async with Client(build_server(), mode="auto") as client:
        assert client.protocol_version == "2026-07-28"
        with pytest.raises(MCPError) as raised:
            await client.set_logging_level("info")
        assert raised.value.error.code == METHOD_NOT_FOUND


def test_levels_map_both_ways() -> None:
    assert [mcp_level(n) for n in (logging.DEBUG, logging.INFO, 25, logging.WARNING, logging.CRITICAL)] == [
        "debug", "info", "notice", "warning", "critical",
    ]  # fmt: skip
