"""A tiny MCP server over stdio for the agent's MCP-server tests: one tool, ``shout(text)``, that returns the
text upper-cased. Run as ``python echo_mcp_server.py PIDS_FILE``: it appends its process id to PIDS_FILE
when it starts, so a test can check afterwards that every process it started has ended.

It runs as its own program (the agent starts it), so it imports nothing from the tests.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")


@server.tool()
def shout(text: str) -> str:
    """The text, upper-cased."""
    return text.upper()


if __name__ == "__main__":
    with open(sys.argv[1], "a", encoding="utf-8") as pids:
        pids.write(f"{os.getpid()}\n")
    server.run("stdio")
