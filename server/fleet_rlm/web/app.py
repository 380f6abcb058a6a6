"""``create_app``: one Starlette app over the process's Engine serving the JSON API, SSE streams,
the static UI and the MCP endpoint at ``/mcp`` (the MCP face's own HTTP app, on the same Engine).

Request path, outside in: security headers, Host/Origin check (``web.security``), token or
browser session id (``fleet_rlm.http_auth.Guard``, the module ``fleet-mcp --transport http`` uses),
then the routes. Errors become JSON in one place (``web.errors``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from fleet_rlm.http_auth import BrowserSessions, Guard, check_bind
from fleet_rlm.web import errors, optimize, routes_agent, runs, settings, static, system, volumes
from fleet_rlm.web.api import Endpoint, to_route
from fleet_rlm.web.openapi import document
from fleet_rlm.web.security import HostCheck, SecurityHeaders
from fleet_rlm.web.state import AppState, McpFace

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine

SSE_PING_SECONDS = 15.0


def endpoints() -> tuple[Endpoint, ...]:
    """Every JSON API endpoint, by area."""
    return (*runs.routes.endpoints, *volumes.routes.endpoints, *settings.routes.endpoints, *system.routes.endpoints,
            *optimize.routes.endpoints, *routes_agent.routes.endpoints)  # fmt: skip


def _open_path(path: str) -> bool:
    """Paths without data, open to all: the UI's files and the API's description."""
    return path == "/openapi.json" or static.is_open(path)


class _Mcp:
    """``/mcp``: waits for the shared Engine, then hands the request to the MCP app."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: AppState = scope["app"].state.fleet
        await state.engine()
        if state.mcp_app is None:
            await errors.error_response(404, "this server was started without MCP")(scope, receive, send)
            return
        await state.mcp_app(scope, receive, send)


def create_app(
    engine: Engine | None = None,
    *,
    token: str | None,
    host: str = "127.0.0.1",
    port: int | None = None,
    allow_remote: bool = False,
    ui_dir: Path | None = None,
    mcp: McpFace | None = None,
    follow_settings: bool = True,
    sse_ping: float = SSE_PING_SECONDS,
) -> Starlette:
    """The web app.

    * ``engine``: share a running Engine (its owner opens and closes it); None: the app opens one
      in the background at startup (``/health`` answers meanwhile) and closes it at shutdown.
    * ``token``: required on every request but ``/health``, the session exchange and the static
      UI, as the bearer or traded for a browser session id; None only for tests and ``--no-auth``.
    * ``host``/``port``: where it listens, for the Host checks; ``port`` None accepts any port.
      A non-loopback ``host`` needs ``token`` and ``allow_remote`` (``BindError`` otherwise).
    * ``ui_dir``: the UI folder (default: packaged, else the checkout's ``webui/``).
    * ``mcp``: builds the MCP face served at ``/mcp`` on the same Engine (``fleet web`` hands in
      ``fleet_rlm.mcp.server.http_app``); None: no MCP (the desktop window).
    * ``follow_settings``: re-read the settings before each run, so saved ones apply at once.
    """
    check_bind(host, token, allow_remote)
    table = endpoints()

    async def openapi(_request: Request) -> JSONResponse:
        return JSONResponse(document(table, mcp=mcp is not None))

    routes: list[BaseRoute] = [to_route(e) for e in table]
    routes += [Route("/openapi.json", openapi, include_in_schema=False), Route("/mcp", _Mcp())]
    routes += static.routes(ui_dir or static.ui_folder())
    state = AppState(
        engine, token=token, host=host, port=port, allow_remote=allow_remote, mcp=mcp,
        follow_settings=follow_settings, sse_ping=sse_ping,
    )  # fmt: skip
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(HostCheck, host=host, port=port),
            Middleware(Guard, token=token, sessions=BrowserSessions(), is_open=_open_path),
        ],
        exception_handlers=errors.HANDLERS,  # type: ignore[arg-type]
        lifespan=state.lifespan,
    )
    app.state.fleet = state
    return app


def current_engine(app: Starlette) -> Engine | None:
    """The engine an app made by ``create_app`` serves, once it has opened it (the desktop asks)."""
    state: AppState = app.state.fleet
    return state.current
