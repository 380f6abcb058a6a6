"""One Engine per process, opened on first use.

The engine import chain pulls in dspy/litellm (over a second), so the stdio server answers
``initialize`` first and opens the engine only when a tool or resource needs it. A host app
(the web server) can hand in its own running engine instead; then we never open or close one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine

log = logging.getLogger(__name__)

Closer = Callable[[], Awaitable[None]]
OnOpen = Callable[["Engine"], Awaitable[Closer | None]]


class EngineProvider:
    """Lazily opens (and later closes) the process's Engine; shares a given one as-is."""

    def __init__(self, engine: Engine | None = None) -> None:
        self._given = engine
        self._engine: Engine | None = engine
        self._owned = False
        self._lock = asyncio.Lock()
        self._users = 0
        self._on_open: list[OnOpen] = []
        self._closers: list[Closer] = []
        self._opened_hooks = False

    @property
    def shared(self) -> bool:
        """True when the engine belongs to a host app (we must not close it)."""
        return self._given is not None

    @property
    def current(self) -> Engine | None:
        """The engine if it is open, without opening it."""
        return self._engine

    def on_open(self, hook: OnOpen) -> None:
        """Run ``hook(engine)`` once the engine is available; it may return a closer run at shutdown."""
        self._on_open.append(hook)

    async def get(self) -> Engine:
        """The open engine; opens it on first call. Raises ConfigError on broken settings."""
        if self._engine is not None and self._opened_hooks:
            return self._engine
        async with self._lock:
            if self._engine is None:
                from fleet_rlm.config import load_settings
                from fleet_rlm.core.engine import Engine

                engine = Engine(load_settings())
                await engine.__aenter__()
                self._engine, self._owned = engine, True
                log.info("engine opened (home %s)", engine.settings.home)
            if not self._opened_hooks:
                self._opened_hooks = True
                for hook in self._on_open:
                    closer = await hook(self._engine)
                    if closer is not None:
                        self._closers.append(closer)
            return self._engine

    async def __aenter__(self) -> EngineProvider:
        # Counted: the in-memory client runs the server lifespan once per connection.
        self._users += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._users -= 1
        if self._users > 0:
            return
        self._opened_hooks = False
        closers, self._closers = self._closers, []
        engine, owned = self._engine, self._owned
        # Shielded: shutdown often happens under cancellation, and runs must still be recorded.
        with anyio.CancelScope(shield=True):
            for closer in reversed(closers):
                await closer()
            if owned and engine is not None:
                self._engine, self._owned = None, False
                await engine.close()
                log.info("engine closed")
