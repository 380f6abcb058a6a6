"""The desktop's server: the web app (``fleet_rlm.web.app.create_app``) on uvicorn in a thread.

It listens on a random free loopback port and requires a token minted for this launch only: the
window receives it through the JS bridge and trades it for a browser session id, so no
other local program or web page can drive this server. The token is never printed, logged or
written anywhere.
"""

from __future__ import annotations

import asyncio
import http.client
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from fleet_rlm.core import operations
from fleet_rlm.http_auth import listen, url_of

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine

T = TypeVar("T")
HOST = "127.0.0.1"


class LocalServer:
    """``start()`` serves in a daemon thread; ``stop()`` ends it (runs cancelled).

    The socket listens from construction on, so the window can be pointed at it at once; the web
    app is imported and built in the server's thread, beside the window's own start-up."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)
        self._sock = listen(HOST, 0)
        self.port: int = self._sock.getsockname()[1]
        self.url = url_of(self._sock)
        self._app: Any = None
        self._server: Any = None
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="fleet desktop: server", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None

    def _serve(self) -> None:
        try:
            import uvicorn

            from fleet_rlm.web.app import create_app

            # No MCP endpoint: no MCP client can know a token that only the window ever sees, and
            # mounting it would delay the first API answer by the MCP SDK's import (about 1 s).
            self._app = create_app(token=self.token, host=HOST, port=self.port)  # no MCP face: the window only
            config = uvicorn.Config(self._app, log_level="warning", access_log=False, lifespan="on")
            self._server = uvicorn.Server(config)
            self._server.should_exit = self._stopping
            asyncio.run(self._main())
        except BaseException as exc:  # reported by wait_started / the caller
            self.error = exc

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[self._sock])

    def start(self) -> None:
        self._thread.start()

    def wait_started(self, timeout: float = 30.0) -> None:
        """Block until uvicorn accepts requests; raise why it could not."""
        deadline = time.monotonic() + timeout
        while not (self._server is not None and self._server.started):
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the desktop's server did not start: {self.error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the desktop's server did not start within {timeout:.0f} s")
            time.sleep(0.01)

    def healthy(self) -> bool:
        """Does ``GET /health`` answer 200 over the wire?"""
        return self.request("GET", "/health", auth=False)[0] == 200

    def request(self, method: str, path: str, *, auth: bool = True, body: bytes | None = None) -> tuple[int, bytes]:
        """One HTTP request to this server (with the launch token unless ``auth`` is False)."""
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def call(self, job: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60.0) -> T:
        """Run ``job()`` on the server's event loop (where the Engine lives) and wait for its result."""
        if self._loop is None:
            raise RuntimeError("the desktop's server is not running")
        return asyncio.run_coroutine_threadsafe(job(), self._loop).result(timeout)

    def _engine(self) -> Engine | None:
        from fleet_rlm.web.app import current_engine

        return current_engine(self._app) if self._app is not None else None

    def active_runs(self) -> list[str]:
        """Runs of this process still queued or running (other processes' runs are theirs to stop)."""
        engine = self._engine()
        if engine is None:
            return []

        async def ours() -> list[str]:
            return operations.own_active_runs(engine)

        return self.call(ours)

    def cancel_runs(self) -> int:
        """Cancel this process's runs (each recorded as cancelled); how many were stopped."""
        engine = self._engine()
        if engine is None:
            return 0
        return self.call(lambda: operations.cancel_own_runs(engine))

    def stop(self, timeout: float = 30.0) -> None:
        """Shut uvicorn down (the app closes its Engine, cancelling what still runs) and wait."""
        self._stopping = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
