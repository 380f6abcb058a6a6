"""Streamable HTTP: loopback by default, DNS-rebinding protection, optional bearer token.

A browser page on any site can reach 127.0.0.1, so the Host/Origin allow-lists stop DNS
rebinding, and a token (``FLEET_MCP_TOKEN``) keeps other local users and pages out. Listening
on anything but loopback needs both the token and an explicit ``allow_remote``.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from typing import TYPE_CHECKING, Any

from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from mcp.server import MCPServer

TOKEN_ENV = "FLEET_MCP_TOKEN"
LOOPBACK_NAMES = ("localhost",)


class BindError(ValueError):
    """Refused to listen where the server would be exposed without protection."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(token: str | None) -> str | None:
    """The token argument, else ``FLEET_MCP_TOKEN``; empty means none."""
    value = token if token is not None else os.environ.get(TOKEN_ENV)
    return value or None


def check_bind(host: str, token: str | None, allow_remote: bool) -> None:
    """Raise BindError unless ``host`` is loopback, or a token is set and remote use was allowed."""
    if is_loopback(host):
        return
    missing = []
    if not token:
        missing.append(f"a bearer token ({TOKEN_ENV} or --token)")
    if not allow_remote:
        missing.append("--allow-remote")
    if missing:
        raise BindError(
            f"refusing to listen on {host}: other machines could reach it. Listening beyond loopback "
            f"needs {' and '.join(missing)}; or use --host 127.0.0.1."
        )


def loopback_security(port: int | None = None) -> TransportSecuritySettings:
    """Host/Origin allow-lists for loopback; a foreign Host gets 421, a foreign Origin 403."""
    p = str(port) if port else "*"
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"127.0.0.1:{p}", f"localhost:{p}", f"[::1]:{p}"],
        allowed_origins=[f"http://127.0.0.1:{p}", f"http://localhost:{p}", f"http://[::1]:{p}"],
    )


class BearerTokenMiddleware:
    """Require ``Authorization: Bearer <token>`` on every HTTP request (lifespan passes through)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                given = value
                break
        # Constant time, so response timing says nothing about how much of a guess was right.
        if not hmac.compare_digest(given, self._expected):
            response = JSONResponse(
                {"error": "unauthorized", "message": "missing or wrong bearer token"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="fleet-rlm"'},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_http_app(
    server: MCPServer[Any],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    token: str | None = None,
    allow_remote: bool = False,
    path: str = "/mcp",
) -> ASGIApp:
    """The streamable HTTP app, guarded as described in the module docstring.

    ``token`` is used as given (call ``resolve_token`` to fall back to the environment).
    """
    check_bind(host, token, allow_remote)
    # Remote binds have no fixed host name to allow-list; the required token protects them.
    security = (
        loopback_security(port)
        if is_loopback(host)
        else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    app: ASGIApp = server.streamable_http_app(streamable_http_path=path, transport_security=security, host=host)
    if token:
        app = BearerTokenMiddleware(app, token)
    return app
