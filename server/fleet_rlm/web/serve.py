"""``fleet web``: serve the app on uvicorn, print the sign-in address, open the browser.

Like Jupyter, the address carries the token in its fragment (``/#token=...``: a fragment never
reaches the server's logs or the Referer); the page trades it for a browser session id. The token is
``FLEET_MCP_TOKEN`` or the keyring's ``mcp_token`` when set (so MCP client configurations survive
restarts), else random for this launch. Nothing heavy is imported before the socket listens, so
``/health`` answers within a fraction of a second; the runtime loads in the background.
"""

from __future__ import annotations

import argparse
import logging
import sys
import webbrowser
from typing import TYPE_CHECKING, TextIO

from fleet_rlm.errors import FleetError
from fleet_rlm.http_auth import bind_server, log_to_stderr, resolve_token, run_server, url_of

if TYPE_CHECKING:
    from fleet_rlm.web.state import McpFace

log = logging.getLogger(__name__)
DEFAULT_PORT = 8000


def sign_in_url(base: str, token: str | None) -> str:
    return f"{base}/#token={token}" if token else f"{base}/"


def announce(url: str, mcp_url: str | None, out: TextIO) -> None:
    print(f"fleet web: open {url}", file=out)
    if mcp_url:
        print(f"fleet web: MCP clients connect to {mcp_url} with 'Authorization: Bearer <the token above>'", file=out)
    print("fleet web: the address carries this launch's token; anyone with it can use the server", file=out)
    out.flush()


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, open_browser: bool = True,
          allow_remote: bool = False, out: TextIO | None = None, mcp: McpFace | None = None) -> None:  # fmt: skip
    """Run ``fleet web`` until stopped (blocking), with the MCP face ``mcp`` builds at ``/mcp``.
    Raises BindError/OSError before listening when refused."""
    from fleet_rlm.web.app import create_app

    out = out or sys.stderr
    required = resolve_token()
    token = required.value if required else None
    sock = bind_server(host, port, token, allow_remote, log)
    app = create_app(token=token, host=host, port=sock.getsockname()[1], allow_remote=allow_remote, mcp=mcp)
    base = url_of(sock)
    url = sign_in_url(base, token)
    announce(url, f"{base}/mcp" if mcp else None, out)
    run_server(app, sock, when_up=(lambda: _open_browser(url)) if open_browser else None)


def _open_browser(url: str) -> None:
    if not webbrowser.open(url):
        print("fleet web: could not open a browser: open the address above yourself", file=sys.stderr)


def cmd_web(args: argparse.Namespace, mcp: McpFace | None = None) -> int:
    """The ``fleet web`` command (``fleet_rlm.cli.main`` parses its arguments and hands in the MCP face)."""
    log_to_stderr()
    try:
        serve(args.host, args.port, open_browser=not args.no_open, allow_remote=args.allow_remote, mcp=mcp)
    except (FleetError, OSError) as exc:  # BindError, a busy port, a bad setting
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
