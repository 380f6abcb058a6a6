"""Resource-updated notifications for run URIs, in both protocol eras.

2026-07-28 clients watch URIs with ``subscriptions/listen``: we publish to the server's
subscription bus. 2025-era clients use ``resources/subscribe``, which ``MCPServer`` no longer
serves, so we register that method ourselves and push ``notifications/resources/updated`` to
the sessions that asked. A watcher follows every run of the engine (not just the calling
tool's), so runs started with ``start_run`` or from the web UI notify too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.subscriptions import ResourceUpdated

from fleet_rlm.mcp.models import run_uri, trace_uri

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp.server.context import ServerRequestContext

    from fleet_rlm.core.engine import Engine

log = logging.getLogger(__name__)

RUNS_URI = "fleet://runs"
THROTTLE_SECONDS = 0.5  # per URI: a batch of 500 sub-queries must not send 1000 notifications


class Notifier:
    """Fan a URI update out to listen streams (modern) and legacy subscribers."""

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        # connection -> URIs it subscribed to; weak, so a closed connection is simply dropped
        self._legacy: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._last: dict[str, float] = {}

    async def updated(self, uri: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last.get(uri, 0.0) < THROTTLE_SECONDS:
            return
        self._last[uri] = now
        await self.bus.publish(ResourceUpdated(uri=uri))
        for connection, uris in list(self._legacy.items()):
            if uri not in uris:
                continue
            try:
                await connection.send_resource_updated(uri)
            except Exception:  # the connection went away: forget it
                self._legacy.pop(connection, None)

    def forget(self, uri: str) -> None:
        self._last.pop(uri, None)

    # -- legacy resources/subscribe ------------------------------------------------------------

    async def _subscribe(self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams) -> Any:
        self._legacy.setdefault(connection_of(ctx), set()).add(str(params.uri))
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams) -> Any:
        self._legacy.get(connection_of(ctx), set()).discard(str(params.uri))
        return types.EmptyResult()

    def install_legacy(self, server: MCPServer[Any]) -> None:
        """Serve resources/subscribe + unsubscribe for handshake-era sessions.

        MCPServer has no public hook for re-providing a method the 2026 revision removed; the
        SDK docs point at the low-level ``Server.add_request_handler`` for exactly this case.
        """
        low = server._lowlevel_server  # private: see the docstring
        low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
        low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)

    # -- the run watcher -----------------------------------------------------------------------

    async def watch(self, engine: Engine) -> Callable[[], Awaitable[None]]:
        """Follow every run's live events; returns a closer that stops the watcher."""
        task = asyncio.create_task(self._watch(engine), name="fleet-mcp resource watcher")

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        return stop

    async def _watch(self, engine: Engine) -> None:
        async with contextlib.aclosing(engine.subscribe(None)) as events:
            async for event in events:
                run_id, kind = event["run_id"], event["kind"]
                final = kind in ("run.started", "run.finished")
                # Step boundaries always notify; bursts of sub-query events are throttled.
                force = final or kind in ("lm.call", "code.executed", "child.finished")
                try:
                    await self.updated(run_uri(run_id), force=force)
                    await self.updated(trace_uri(run_id), force=force)
                    if final:
                        await self.updated(RUNS_URI, force=True)
                except Exception:
                    log.debug("resource notification failed", exc_info=True)
                if kind == "run.finished":
                    self.forget(run_uri(run_id))
                    self.forget(trace_uri(run_id))


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The connection behind a request: ``ctx.session`` is a fresh wrapper per request.

    Both expose ``send_resource_updated``; the connection's sends outside any request, and it
    lives exactly as long as the client is connected, which is what a subscription should.
    """
    return getattr(ctx.session, "_connection", ctx.session)
