"""Who may talk to fleet-rlm's local HTTP servers: bind policy, bearer token, session bound, /health.

Shared by ``fleet-mcp --transport http``, the web app and the desktop shell. Loopback is not
private: every local process can reach it, and the server reads host files for whoever calls
it. So HTTP needs a bearer token by default:

* ``FLEET_MCP_TOKEN`` or the keyring (``fleet-rlm config set mcp_token``) when set, so a
  client's configuration survives restarts;
* otherwise a random token per launch, shown once on the terminal that started the server
  (``announce``), never logged or written to a file;
* ``--no-auth`` turns it off, explicitly, and only on loopback.

``GET /health`` stays open and says only that the server is up. Standard library and
Starlette only: no runtime, no MCP.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import socket
import sys
from dataclasses import dataclass, field
from typing import TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet_rlm.config import env_name, secret_setting

TOKEN_SETTING = "mcp_token"
TOKEN_ENV = env_name(TOKEN_SETTING)  # FLEET_MCP_TOKEN
MAX_SESSIONS_ENV = "FLEET_MCP_MAX_SESSIONS"
DEFAULT_MAX_SESSIONS = 64
HEALTH_PATH = "/health"
LOOPBACK_NAMES = ("localhost",)


class BindError(ValueError):
    """Refused to listen where the server would be exposed without protection."""


@dataclass(frozen=True)
class Token:
    """The bearer token a server requires. ``generated``: random for this launch only."""

    value: str = field(repr=False)
    generated: bool = False


def resolve_token(*, no_auth: bool = False, given: str | None = None) -> Token | None:
    """The token to require: ``given``, else FLEET_MCP_TOKEN / the keyring, else a random one.

    None only with ``no_auth``. Blank values count as unset, so no server ever accepts a blank token."""
    if no_auth:
        return None
    value = (given or "").strip() or secret_setting(TOKEN_SETTING)
    if value:
        return Token(value)
    return Token(secrets.token_urlsafe(32), generated=True)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, allow_remote: bool) -> None:
    """Raise BindError unless ``host`` is loopback, or authentication is on and remote use was allowed."""
    if is_loopback(host):
        return
    missing = []
    if not token:
        missing.append(f"authentication (drop --no-auth: the server then requires {TOKEN_ENV} or a generated token)")
    if not allow_remote:
        missing.append("--allow-remote")
    if missing:
        raise BindError(
            f"refusing to listen on {host}: other machines could reach it. Listening beyond loopback "
            f"needs {' and '.join(missing)}; or use --host 127.0.0.1."
        )


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one), ready before anything is announced."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror} (use another --port?)") from exc
    return sock


def url_of(sock: socket.socket, path: str = "") -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}{path}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}{path}"


def announce(name: str, url: str, token: Token | None, out: TextIO | None = None) -> None:
    """Tell the terminal where the server listens; a generated token is shown here, once, and nowhere else."""
    out = out or sys.stderr
    if token is None:
        print(f"{name}: listening on {url} WITHOUT authentication (--no-auth): any local process can use it",
              file=out)  # fmt: skip
    elif token.generated:
        print(f"{name}: listening on {url}", file=out)
        print(f"{name}: bearer token for this launch (shown once, stored nowhere): {token.value}", file=out)
        print(f'{name}: clients send "Authorization: Bearer <token>"; for a token that survives restarts set '
              f"{TOKEN_ENV} or run `fleet-rlm config set {TOKEN_SETTING}`", file=out)  # fmt: skip
    else:
        print(f"{name}: listening on {url} (bearer token required: the configured {TOKEN_ENV})", file=out)
    out.flush()


def max_sessions() -> int:
    """How many MCP sessions may be open at once (FLEET_MCP_MAX_SESSIONS, default 64)."""
    raw = os.environ.get(MAX_SESSIONS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_SESSIONS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{MAX_SESSIONS_ENV}={raw!r}: give a whole number of sessions, at least 1")
    return int(raw)


def bearer_matches(header: bytes | None, token: str) -> bool:
    """``Authorization: Bearer <token>``; the scheme in any case; constant time; blank never matches."""
    if not header or not token:
        return False
    scheme, _, given = header.partition(b" ")
    given = given.strip()
    # Always compare, even on a wrong scheme, so timing says nothing about which part was wrong.
    same = hmac.compare_digest(given, token.encode())
    return same and scheme.lower() == b"bearer" and bool(given)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


async def _send_json(send: Send, status: int, payload: dict[str, object], headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps(payload).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI wrapper: ``GET /health`` answers openly; everything else needs the bearer token (if any)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan passes through
            await self.app(scope, receive, send)
            return
        if scope["path"] == HEALTH_PATH and scope["method"] in ("GET", "HEAD"):
            await _send_json(send, 200, {"status": "ok"}, [])  # nothing about the machine or the runs
            return
        if self._token is not None and not bearer_matches(_header(scope, b"authorization"), self._token):
            await _send_json(
                send,
                401,
                {"error": "unauthorized", "message": "missing or wrong bearer token: send 'Authorization: Bearer "
                 f"<token>' with the token the server printed at launch, or the configured {TOKEN_ENV}"},
                [(b"www-authenticate", b'Bearer realm="fleet-rlm"')],
            )  # fmt: skip
            return
        await self.app(scope, receive, send)


class SessionLimit:
    """ASGI wrapper: when the MCP session manager refuses a new session (503), say why and what to do.

    The bound itself is the session manager's ``max_sessions`` (see ``max_sessions()``)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _header(scope, b"mcp-session-id") is not None:
            await self.app(scope, receive, send)
            return
        refused = False

        async def explain(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] == 503:
                refused = True
            if not refused:
                await send(message)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                error = {
                    "code": -32603,
                    "message": f"too many open MCP sessions (the limit is {self._limit}): close clients you no "
                    f"longer use, wait for idle ones to expire, or raise {MAX_SESSIONS_ENV}",
                }
                await _send_json(send, 503, {"jsonrpc": "2.0", "id": None, "error": error}, [])

        await self.app(scope, receive, explain)
