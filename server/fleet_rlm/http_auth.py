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

Browser pages (the web UI, the desktop shell's window) never hold the token and never get a
cookie: browsers send cookies for 127.0.0.1 to every port, so any other local web app would
receive one. A ``Guard`` with ``BrowserSessions`` trades the token for a random session id
instead: ``POST /api/auth {"token": ...}`` answers ``{"session": ...}``, the page keeps it in its
tab's ``sessionStorage`` (per origin, port included) and sends it as the bearer; ``DELETE
/api/auth`` with it revokes it. Session ids live in this process only and end after an idle spell.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet_rlm.config import env_name, secret_setting
from fleet_rlm.errors import UserError

TOKEN_SETTING = "mcp_token"
TOKEN_ENV = env_name(TOKEN_SETTING)  # FLEET_MCP_TOKEN
MAX_SESSIONS_ENV = "FLEET_MCP_MAX_SESSIONS"
DEFAULT_MAX_SESSIONS = 64
HEALTH_PATH = "/health"
AUTH_PATH = "/api/auth"
SESSION_IDLE_SECONDS = 8 * 3600  # a working day: a tab left open over lunch stays signed in
MAX_BROWSER_SESSIONS = 256
_MAX_AUTH_BODY = 4096
LOOPBACK_NAMES = ("localhost",)


class BindError(UserError):
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
    # The protocol named, not 0: asyncio turns Nagle off only on accepted sockets whose proto is
    # IPPROTO_TCP, and with Nagle on a response sent as headers then body waits ~40 ms for the
    # client's delayed ACK on every later request of a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} is in use; pick another with --port N (or --port 0 for any free port)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}; check --host and --port") from None
    return sock


def bind_server(host: str, port: int, token: str | None, allow_remote: bool, log: logging.Logger) -> socket.socket:
    """A local HTTP server's listening socket under the bind policy: refused before binding when the
    policy says no (``check_bind``), and a warning when other machines reach it unfenced."""
    check_bind(host, token, allow_remote)
    sock = listen(host, port)
    warn_if_unfenced(host, log)
    return sock


def run_server(
    app: ASGIApp, sock: socket.socket, *, log_level: str = "WARNING", when_up: Callable[[], None] | None = None
) -> None:
    """Serve ``app`` on ``sock`` with uvicorn until stopped (blocking), its lifespan run and no access
    log (a path may name a run or a session); ``when_up`` is called, from a thread, once it accepts."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level.lower(), access_log=False, lifespan="on"))
    if when_up is not None:
        threading.Thread(target=_call_when_up, args=(server, when_up), daemon=True).start()
    server.run(sockets=[sock])


def _call_when_up(server: Any, when_up: Callable[[], None]) -> None:
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        when_up()


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
        raise UserError(f"{MAX_SESSIONS_ENV}={raw!r}: give a whole number of sessions, at least 1")
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


def _bearer_credential(header: bytes | None) -> bytes:
    """What an ``Authorization: Bearer <credential>`` header carries (scheme in any case); b"" otherwise."""
    scheme, _, given = (header or b"").partition(b" ")
    return given.strip() if scheme.lower() == b"bearer" else b""


class BrowserSessions:
    """Sign-ins of browser pages: random ids known to this server process only.

    An id ends when its page signs out (``close``), after ``idle_seconds`` without a request, when
    more than ``limit`` are open (the least recently used goes first), and with the process. Ids are
    kept as SHA-256 digests, so looking one up says nothing through timing about stored ids."""

    def __init__(self, idle_seconds: float = SESSION_IDLE_SECONDS, limit: int = MAX_BROWSER_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._idle, self._limit, self._clock = idle_seconds, limit, clock
        self._last_used: OrderedDict[bytes, float] = OrderedDict()  # digest -> last use, oldest first

    def open(self) -> str:
        """A new session id."""
        now, session = self._clock(), secrets.token_urlsafe(32)
        self._last_used[_digest(session.encode())] = now
        while self._last_used:  # drop, least recently used first, what is past the limit or idle too long
            oldest = next(iter(self._last_used.values()))
            if len(self._last_used) <= self._limit and now - oldest <= self._idle:
                break
            self._last_used.popitem(last=False)
        return session

    def check(self, given: bytes) -> bool:
        """Is ``given`` a live session id? A live one counts as used now."""
        key = _digest(given)
        last = self._last_used.get(key)
        now = self._clock()
        if last is None or now - last > self._idle:
            self._last_used.pop(key, None)
            return False
        self._last_used[key] = now
        self._last_used.move_to_end(key)
        return True

    def close(self, given: bytes) -> None:
        """Revoke ``given`` (nothing happens for an unknown id)."""
        self._last_used.pop(_digest(given), None)


def _digest(session: bytes) -> bytes:
    return hashlib.sha256(session).digest()


async def _read_small(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None past ``limit`` bytes."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body"):
            return body


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


async def send_json(send: Send, status: int, payload: dict[str, object], headers: list[tuple[bytes, bytes]]) -> None:
    """Answer from an ASGI wrapper with a JSON body (and ``headers`` after the content ones)."""
    body = json.dumps(payload).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI wrapper: ``GET /health`` answers openly; everything else needs the bearer token (if any).

    ``sessions``: also serve the session exchange at ``AUTH_PATH`` and accept a live browser session
    id as the bearer (``/mcp`` behind keeps its own Guard, which wants the token itself).
    ``is_open(path)``: GET/HEAD of such paths needs nothing (static files with no data in them)."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        *,
        sessions: BrowserSessions | None = None,
        is_open: Callable[[str], bool] | None = None,
    ) -> None:
        self.app = app
        self._token = token
        self._sessions = sessions
        self._is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan passes through
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == HEALTH_PATH and method in ("GET", "HEAD"):
            await send_json(send, 200, {"status": "ok"}, [])  # nothing about the machine or the runs
            return
        if self._sessions is not None and path == AUTH_PATH:
            await self._exchange(scope, receive, send, self._sessions)
            return
        if self._token is not None and not (self._is_open and method in ("GET", "HEAD") and self._is_open(path)):
            authorization = _header(scope, b"authorization")
            signed_in = self._sessions is not None and self._sessions.check(_bearer_credential(authorization))
            if not (signed_in or bearer_matches(authorization, self._token)):
                await self._refuse(send)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send) -> None:
        browser = "open the address `fleet web` printed (it carries the token), paste the token into the page, or "
        hint = browser if self._sessions is not None else ""
        message = (
            f"missing or wrong bearer token: {hint}send 'Authorization: Bearer <token>' "
            f"with the token the server printed at launch, or the configured {TOKEN_ENV}"
        )
        challenge = [(b"www-authenticate", b'Bearer realm="fleet-rlm"')]
        await send_json(send, 401, {"error": "unauthorized", "message": message}, challenge)

    async def _exchange(self, scope: Scope, receive: Receive, send: Send, sessions: BrowserSessions) -> None:
        """``POST {"token"}``: a new session id (replacing one presented as the bearer); ``DELETE``: 204, the
        session id presented as the bearer revoked."""
        if scope["method"] == "DELETE":
            sessions.close(_bearer_credential(_header(scope, b"authorization")))
            await _send_empty(send, 204, [])
            return
        if scope["method"] != "POST":
            await send_json(send, 405, {"error": "method_not_allowed", "message": "use POST or DELETE"}, [])
            return
        body = await _read_small(receive, _MAX_AUTH_BODY)
        try:
            given = json.loads(body or b"null")["token"]
        except (ValueError, TypeError, KeyError):
            given = None
        if not isinstance(given, str):
            message = 'send {"token": "<the token fleet web printed>"} as JSON'
            await send_json(send, 400, {"error": "bad_request", "message": message}, [])
            return
        if self._token is None:  # no authentication on this server: nothing to hold
            await send_json(send, 200, {"session": None}, [(b"cache-control", b"no-store")])
            return
        if not given or not hmac.compare_digest(given.encode(), self._token.encode()):
            await self._refuse(send)
            return
        sessions.close(_bearer_credential(_header(scope, b"authorization")))  # a tab signing in again: its old id ends
        await send_json(send, 200, {"session": sessions.open()}, [(b"cache-control", b"no-store")])


async def _send_empty(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


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
                await send_json(send, 503, {"jsonrpc": "2.0", "id": None, "error": error}, [])

        await self.app(scope, receive, explain)


def log_to_stderr(level: str = "WARNING") -> None:
    """A server's logging, the same for every face: stderr only (on stdio, stdout is the MCP
    channel), every record masked, the model libraries' chatter held to warnings."""
    from fleet_rlm.redaction import RedactingFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level)  # a client's logging/setLevel may lower fleet_rlm's level, not stderr's
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    for noisy in ("LiteLLM", "litellm", "httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def warn_if_unfenced(host: str, log: logging.Logger) -> None:
    """A server other machines reach lets its clients name any file this user can read as context,
    unless ``context_roots`` fences them: from the environment or settings.json alike."""
    from fleet_rlm.config import load_settings

    if not is_loopback(host) and load_settings().allowed_context_roots is None:
        log.warning(
            "remote clients can name any file this user can read as context: set context_roots "
            "(`fleet-rlm config set context_roots DIR` or FLEET_CONTEXT_ROOTS) to the folders they may use"
        )
