"""The fleet-rlm MCP server: ``build_server`` for embedding, ``serve``/``main`` to run it.

Startup stays light (no dspy/litellm): the Engine opens on the first tool or resource call,
so clients get their ``initialize``/``server/discover`` reply quickly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

from mcp.server import MCPServer

from fleet_rlm import __version__
from fleet_rlm.errors import FleetError, UserError
from fleet_rlm.mcp import (
    client_logs,
    completion,
    prompts,
    resources,
    tools_agent,
    tools_optimize,
    tools_runs,
    tools_system,
    tools_trace,
    tools_volumes,
)
from fleet_rlm.mcp.notify import Notifier
from fleet_rlm.mcp.provider import EngineProvider

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from fleet_rlm.core.engine import Engine

log = logging.getLogger(__name__)

NAME = "fleet-rlm"
TOKEN_HELP = "FLEET_MCP_TOKEN or the keyring's mcp_token, else a random token printed once at launch"
INSTRUCTIONS = """\
fleet-rlm answers questions over inputs too large for your context window: long documents,
large logs, whole folders or many files. Instead of reading such input yourself, call `run`
with the question and `context_paths` (absolute paths): a recursive language model explores the
text with Python in a sandbox, fans sub-queries out over chunks and returns one answer, while
the input never enters your context. Ask precise questions and ask for quotes with line numbers
when you need to cite. `run` blocks and reports progress; if long tool calls time out, use
`start_run` then poll `get_run`. `inspect_trace` shows how an answer was found. Volumes
(`list_volumes`, `read_file`, `write_file`) keep notes and artifacts between runs. If a run fails
with a configuration error, call `doctor`. For small inputs that fit in your context, just read
them yourself."""


def build_server(engine: Engine | None = None) -> MCPServer[EngineProvider]:
    """Build the MCP server.

    Without ``engine`` the server opens one Engine for the process on first use and closes it
    when the server shuts down. With ``engine`` (e.g. the web app's, when mounting this server
    at ``/mcp``) it uses that one and leaves its lifecycle to the owner.
    """
    provider = EngineProvider(engine)
    notifier = Notifier()
    provider.on_open(notifier.watch)

    @asynccontextmanager
    async def lifespan(_server: MCPServer[EngineProvider]) -> AsyncIterator[EngineProvider]:
        async with provider:
            if provider.shared:  # a host's engine is already running: watch it right away
                await provider.get()
            yield provider

    server: MCPServer[EngineProvider] = MCPServer(
        NAME,
        title="fleet-rlm",
        description="Recursive language models over inputs too large for a context window.",
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=lifespan,
        subscriptions=notifier.bus,
        log_level=_log_level(),
    )
    notifier.install_legacy(server)
    tools_runs.register(server, provider)
    tools_trace.register(server, provider)
    tools_volumes.register(server, provider)
    tools_system.register(server, provider)
    tools_optimize.register(server, provider)
    tools_agent.register(server, provider)
    resources.register(server, provider)
    prompts.register(server)
    completion.register(server, provider)
    client_logs.install(server)
    return server


def http_app(engine: Engine, *, token: str | None, host: str, port: int | None, allow_remote: bool) -> ASGIApp:
    """This face over streamable HTTP on a host's running Engine, behind the same guard as
    ``serve(transport="http")``: what ``fleet web`` mounts at ``/mcp``."""
    from fleet_rlm.mcp.http import build_http_app

    return build_http_app(build_server(engine), token=token, host=host, port=port, allow_remote=allow_remote)


def serve(
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    allow_remote: bool = False,
    no_auth: bool = False,
) -> None:
    """Run the server until stopped (blocking).

    * ``stdio``: MCP over stdin/stdout; only protocol goes to stdout, logs go to stderr.
    * ``http``: streamable HTTP at ``http://host:port/mcp`` (port 0: a free one). Every request
      needs ``Authorization: Bearer <token>``: ``token``, else ``FLEET_MCP_TOKEN`` or the
      keyring, else a random token printed once on stderr; ``no_auth`` turns that off. Loopback
      only, with Host/Origin checks against DNS rebinding, unless ``allow_remote`` is set with
      authentication on. Raises ``BindError`` (a ValueError) before binding when refusing.
      Prints a "listening on" line on stderr once the socket accepts connections.
    """
    import anyio

    server = build_server()
    if transport == "stdio":
        anyio.run(server.run_stdio_async)
        return
    if transport != "http":
        raise UserError(f"unknown transport '{transport}': use 'stdio' or 'http'")
    from fleet_rlm.http_auth import announce, bind_server, resolve_token, run_server, url_of
    from fleet_rlm.mcp.http import build_http_app

    required = resolve_token(no_auth=no_auth, given=token)
    secret = required.value if required else None
    sock = bind_server(host, port, secret, allow_remote, log)  # a refused server never listens
    app = build_http_app(server, host=host, port=sock.getsockname()[1], token=secret, allow_remote=allow_remote)
    announce("fleet-mcp", url_of(sock, "/mcp"), required)
    run_server(app, sock, log_level=_log_level())


def _log_level() -> Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]:
    level = os.environ.get("FLEET_MCP_LOG_LEVEL", "WARNING").upper()
    return level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "WARNING"  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """``fleet-mcp``: the MCP server over stdio (default) or streamable HTTP."""
    parser = argparse.ArgumentParser(prog="fleet-mcp", description="fleet-rlm MCP server")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP: interface to listen on (default loopback)")
    parser.add_argument("--port", type=int, default=8765, help="HTTP: port (default 8765)")
    parser.add_argument(
        "--allow-remote", action="store_true", help="HTTP: allow a non-loopback host (authentication stays on)"
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help=f"HTTP: serve without a bearer token (default: {TOKEN_HELP}); loopback only",
    )
    parser.add_argument("--version", action="version", version=f"fleet-mcp {__version__}")
    args = parser.parse_args(argv)
    from fleet_rlm.http_auth import log_to_stderr

    log_to_stderr(_log_level())
    # The token comes from FLEET_MCP_TOKEN or the keyring only: a command-line secret shows up in `ps`.
    try:
        serve(args.transport, host=args.host, port=args.port, allow_remote=args.allow_remote, no_auth=args.no_auth)
    except (FleetError, OSError) as exc:  # BindError, a bad FLEET_MCP_MAX_SESSIONS, a port in use
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m fleet_rlm.mcp.server`
    raise SystemExit(main())
