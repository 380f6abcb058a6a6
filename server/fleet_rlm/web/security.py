"""Browser-facing protections of the web app, as ASGI wrappers.

* ``HostCheck``: on loopback, the ``Host`` header must name loopback (421 otherwise): a page of
  another site that rebinds its DNS name to 127.0.0.1 sends its own name and is refused. An
  ``Origin`` header, when a browser sends one, must be this server's own origin (403 otherwise),
  so no other site drives the API from a visitor's browser.
* ``SecurityHeaders``: a strict Content-Security-Policy (no inline script, nothing from elsewhere),
  no MIME sniffing, no referrer, no framing.
Authentication (token, browser session id) is ``fleet_rlm.http_auth.Guard``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet_rlm.http_auth import is_loopback, send_json

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def split_host(value: str) -> tuple[str, str]:
    """``"127.0.0.1:8000"`` -> ("127.0.0.1", "8000"); ``"[::1]:80"`` -> ("[::1]", "80"); no port: ""."""
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return name + "]", rest.removeprefix(":")
    name, _, port = value.partition(":")
    return name, port


class HostCheck:
    def __init__(self, app: ASGIApp, host: str, port: int | None) -> None:
        self.app = app
        self._loopback = is_loopback(host)
        self._port = str(port) if port else None

    def _host_ok(self, host: str) -> bool:
        if not self._loopback:
            return True  # a remote bind has no fixed name to check; the required token protects it
        name, port = split_host(host.lower())
        return name in LOOPBACK_HOSTS and self._port in (None, port or "80")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in (b"host", b"origin")}
        host = headers.get("host", "")
        if not self._host_ok(host):
            await _refuse(send, 421, "misdirected", f"this server does not answer for host {host!r}: use the "
                          "address `fleet web` printed (127.0.0.1 or localhost)")  # fmt: skip
            return
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in (f"http://{host}".lower(), f"https://{host}".lower()):
            await _refuse(send, 403, "forbidden", f"requests from {origin!r} are refused: only this server's own "
                          "page may call it")  # fmt: skip
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, kind: str, message: str) -> None:
    await send_json(send, status, {"error": kind, "message": message}, [])


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in HEADERS if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
