"""What the web app runs on: the process's Engine and the MCP app sharing it.

Both open in the background when the app starts, so ``/health`` answers within a fraction of a
second of launch while the runtime (dspy, litellm: seconds to import) loads; API requests wait
for it. The MCP app is built by a factory the entry point hands in (``McpFace``): the faces never
import each other. Also the janitor that applies the retention setting, at start and every few hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import ASGIApp, Message

from fleet_rlm.config import load_settings
from fleet_rlm.errors import FleetError, Unavailable

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine

log = logging.getLogger(__name__)
JANITOR_SECONDS = 6 * 3600.0


class McpFace(Protocol):
    """Builds the MCP face's HTTP app on a running Engine behind this guard (``fleet_rlm.mcp.server.
    http_app``): the same token, Host checks and remote policy as ``fleet-mcp --transport http``."""

    def __call__(
        self, engine: Engine, *, token: str | None, host: str, port: int | None, allow_remote: bool
    ) -> ASGIApp: ...


class AppState:
    """The app's Engine (given, or opened and closed here) and its MCP app."""

    def __init__(
        self,
        engine: Engine | None,
        *,
        token: str | None,
        host: str,
        port: int | None,
        allow_remote: bool,
        mcp: McpFace | None,
        follow_settings: bool,
        sse_ping: float,
    ) -> None:
        self._given = engine
        self._engine = engine
        self.sse_ping = sse_ping  # seconds between keep-alive comments on quiet SSE streams
        self._mcp = mcp
        self._mcp_guard: dict[str, Any] = {"token": token, "host": host, "port": port, "allow_remote": allow_remote}
        self.follow_settings = follow_settings
        self.mcp_app: ASGIApp | None = None
        self._ready = asyncio.Event()
        self._failure: FleetError | None = None
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object) -> AsyncIterator[None]:
        # Fresh for each run of the lifespan: a server (or a test client) may start the app again.
        self._engine, self.mcp_app, self._failure, self._tasks = self._given, None, None, []
        self._ready = asyncio.Event()
        opening = asyncio.create_task(self._open(), name="fleet web: open the engine")
        try:
            yield
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(opening, *self._tasks, return_exceptions=True)
            await self._stack.aclose()  # the MCP app, then the engine if it is ours

    async def _open(self) -> None:
        try:
            if self._engine is None:
                module = await asyncio.to_thread(importlib.import_module, "fleet_rlm.core.engine")
                settings = await asyncio.to_thread(load_settings)
                self._engine = await self._stack.enter_async_context(module.Engine(settings))
            if self._mcp is not None:
                self.mcp_app = await self._mount_mcp(self._mcp, self._engine)
            self._tasks.append(asyncio.create_task(self._janitor(), name="fleet web: retention"))
        except FleetError as exc:
            self._failure = exc
        except Exception as exc:
            log.exception("the web app could not start its runtime")
            self._failure = Unavailable(f"the server could not start its runtime ({exc}): run `fleet-rlm doctor`")
        finally:
            self._ready.set()

    async def _mount_mcp(self, mcp: McpFace, engine: Engine) -> ASGIApp:
        """The MCP face's own HTTP app on our Engine, built off the event loop (it imports the SDK)."""
        app = await asyncio.to_thread(lambda: mcp(engine, **self._mcp_guard))
        await self._stack.enter_async_context(lifespan_of(app))
        return app

    async def _janitor(self) -> None:
        from fleet_rlm.core.housekeeping import apply_retention

        engine = await self.engine()
        while True:
            try:
                deleted = await asyncio.to_thread(apply_retention, engine.workspace, engine.settings)
                if deleted:
                    log.info("retention: deleted %d run(s)", deleted)
            except Exception:
                log.exception("applying the retention setting failed")
            await asyncio.sleep(JANITOR_SECONDS)

    # -- use ---------------------------------------------------------------------------------

    @property
    def current(self) -> Engine | None:
        """The Engine if it is open, without waiting (e.g. a desktop shell or a test peeking)."""
        return self._engine if self._ready.is_set() and self._failure is None else None

    async def engine(self) -> Engine:
        """The open Engine; waits while it opens, raises why when it could not."""
        await self._ready.wait()
        if self._failure is not None:
            raise self._failure
        assert self._engine is not None
        return self._engine

    async def refresh_settings(self) -> None:
        """Saved settings apply to the next run, without a restart."""
        engine = await self.engine()
        if self.follow_settings:
            engine.apply_settings(await asyncio.to_thread(load_settings))


@contextlib.asynccontextmanager
async def lifespan_of(app: ASGIApp) -> AsyncIterator[None]:
    """Run an ASGI app's lifespan (startup now, shutdown on exit): a mounted app's own is not run."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))  # type: ignore[arg-type]

    async def reply() -> Message:
        getting = asyncio.ensure_future(outbox.get())
        await asyncio.wait([getting, task], return_when=asyncio.FIRST_COMPLETED)
        if not getting.done():
            getting.cancel()
            task.result()  # raises what stopped the app
            raise RuntimeError("the mounted app ended its lifespan early")
        return getting.result()

    await inbox.put({"type": "lifespan.startup"})
    started = await reply()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the mounted app failed to start: {started.get('message', '')}")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await reply()
        await asyncio.gather(task, return_exceptions=True)
