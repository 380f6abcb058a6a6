"""A small MCP server for the REPL-tools tests (core/tools.py): read-only tools, one that fails with a
message, one marked destructive. ``python tools_mcp_server.py stdio LOG`` serves it over stdio and
appends one line to LOG per tool call; ``app(log)`` is its Streamable HTTP app (served in a thread
by the tests), which also logs the client address of every request.

It runs as its own program over stdio, so it imports nothing from the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)


def build(name: str, log: Path) -> MCPServer:
    server = MCPServer(name)

    def note(line: str) -> None:
        with log.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    @server.tool(annotations=READ_ONLY)
    def shout(text: str) -> str:
        """The text, upper-cased."""
        note(f"shout {text}")
        return text.upper()

    @server.tool(annotations=READ_ONLY)
    def add(a: int, b: int = 1) -> int:
        """The sum of two integers."""
        note(f"add {a} {b}")
        return a + b

    @server.tool(annotations=READ_ONLY)
    def broken() -> str:
        """Always fails."""
        note("broken")
        raise ToolError("the disk is on fire")

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def wipe(path: str) -> str:
        """Deletes a path (destructive)."""
        note(f"wipe {path}")
        return f"wiped {path}"

    return server


def app(log: Path) -> Any:
    """The Streamable HTTP app at /mcp, logging each request's client host."""
    inner = build("http-lab", log).streamable_http_app()

    async def logged(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            client = scope.get("client") or ("?", 0)
            with log.open("a", encoding="utf-8") as handle:
                handle.write(f"request {client[0]}\n")
        await inner(scope, receive, send)

    return logged


if __name__ == "__main__":
    build("stdio-lab", Path(sys.argv[2])).run(sys.argv[1])
