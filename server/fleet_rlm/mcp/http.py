"""Streamable HTTP: loopback by default, DNS-rebinding protection, bearer token, bounded sessions.

A browser page on any site can reach 127.0.0.1, so the Host/Origin allow-lists stop DNS
rebinding; the bearer token (``fleet_rlm.http_auth``: configured, or generated per launch)
keeps other local processes out. Listening on anything but loopback needs authentication and
an explicit ``allow_remote``. SSE streams are resumable (``fleet_rlm.mcp.resume``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from fleet_rlm.http_auth import Guard, SessionLimit, check_bind, is_loopback, max_sessions
from fleet_rlm.mcp.resume import RETRY_MS, SessionEvents, SessionScope

if TYPE_CHECKING:
    from mcp.server import MCPServer


def loopback_security(port: int | None = None) -> TransportSecuritySettings:
    """Host/Origin allow-lists for loopback; a foreign Host gets 421, a foreign Origin 403."""
    p = str(port) if port else "*"
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"127.0.0.1:{p}", f"localhost:{p}", f"[::1]:{p}"],
        allowed_origins=[f"http://127.0.0.1:{p}", f"http://localhost:{p}", f"http://[::1]:{p}"],
    )


def build_http_app(
    server: MCPServer[Any],
    *,
    token: str | None,
    host: str = "127.0.0.1",
    port: int | None = None,
    allow_remote: bool = False,
    path: str = "/mcp",
) -> ASGIApp:
    """The streamable HTTP app, guarded as described in the module docstring.

    ``token`` must be chosen explicitly: a string makes every request but ``GET /health`` need
    ``Authorization: Bearer <token>``; None serves without authentication (``--no-auth``).
    ``fleet_rlm.http_auth.resolve_token`` gives the default (configured, else generated).
    """
    check_bind(host, token, allow_remote)
    # Remote binds have no fixed host name to allow-list; the required token protects them.
    security = (
        loopback_security(port)
        if is_loopback(host)
        else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    limit = max_sessions()
    app: ASGIApp = server.streamable_http_app(
        streamable_http_path=path,
        transport_security=security,
        host=host,
        max_sessions=limit,
        event_store=SessionEvents(),
        retry_interval=RETRY_MS,
    )
    return Guard(SessionLimit(SessionScope(app), limit), token)
