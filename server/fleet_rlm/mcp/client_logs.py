"""``logging/setLevel`` for 2025-era clients: the server's own log records, sent to them.

A client that calls ``logging/setLevel`` receives ``notifications/message`` for every
``fleet_rlm`` log record at or above that level (engine start, marked-interrupted runs,
sandbox warnings, ...), masked by the same redaction as stderr; until it asks it receives
none. 2026-07-28 removed the method (logs are a per-request opt-in there): the SDK answers it
"Method not found" on that era, and stderr stays the place for server logs.

Records can come from any thread (sync tools run on workers), so each one is handed to the
event loop of the client that asked, and sent there.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Any

import mcp.types as types

from fleet_rlm.mcp.notify import connection_of
from fleet_rlm.redaction import RedactingFormatter

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp.server.context import ServerRequestContext

SOURCE = "fleet_rlm"  # the logger whose records are forwarded
# MCP (RFC 5424) levels -> stdlib levels; notice/alert/emergency fall between or above.
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO + 5, "warning": logging.WARNING,
    "error": logging.ERROR, "critical": logging.CRITICAL, "alert": logging.CRITICAL + 5,
    "emergency": logging.CRITICAL + 10,
}  # fmt: skip


def mcp_level(levelno: int) -> str:
    """The MCP level of a stdlib record: the highest one not above it."""
    return max((lv for lv, n in LEVELS.items() if n <= levelno), key=LEVELS.__getitem__, default="debug")


class ClientLogs(logging.Handler):
    """Forwards log records to the connections that asked for them with ``logging/setLevel``."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(RedactingFormatter("%(message)s"))
        # connection -> (stdlib level, its loop); weak, so a closed connection is simply dropped
        self._clients: weakref.WeakKeyDictionary[Any, tuple[int, asyncio.AbstractEventLoop]] = (
            weakref.WeakKeyDictionary()
        )
        self._sending: set[asyncio.Task[None]] = set()

    def install(self, server: MCPServer[Any]) -> None:
        """Serve ``logging/setLevel`` (the 2026 revision dropped it, so MCPServer does not)."""
        low = server._lowlevel_server  # private: the SDK's documented seam for re-providing a method
        low.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_level)

    async def _set_level(self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams) -> Any:
        level = LEVELS[params.level]
        self._clients[connection_of(ctx)] = (level, asyncio.get_running_loop())
        source = logging.getLogger(SOURCE)
        if self not in source.handlers:
            source.addHandler(self)
        if source.getEffectiveLevel() > level:
            # Let the records through to this handler; stderr's handler keeps its own level.
            source.setLevel(level)
        return types.EmptyResult()

    def emit(self, record: logging.LogRecord) -> None:
        targets = [(c, loop) for c, (level, loop) in list(self._clients.items()) if record.levelno >= level]
        if not targets:
            return
        params = {"level": mcp_level(record.levelno), "logger": record.name, "data": self.format(record)}
        for connection, loop in targets:
            try:
                loop.call_soon_threadsafe(self._send, connection, params)
            except RuntimeError:  # that loop is closed: the client is gone
                self._clients.pop(connection, None)

    def _send(self, connection: Any, params: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(connection, params))
        self._sending.add(task)  # keep a reference until it is sent
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, connection: Any, params: dict[str, Any]) -> None:
        try:
            await connection.notify("notifications/message", params)
        except Exception:  # the connection went away: forget it, and never log from here (a loop)
            self._clients.pop(connection, None)


_FORWARDER = ClientLogs()  # one per process: every server's clients share the one logger handler


def install(server: MCPServer[Any]) -> None:
    """Serve ``logging/setLevel`` on ``server`` and forward log records to the clients that ask."""
    _FORWARDER.install(server)
