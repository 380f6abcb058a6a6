"""Cold start of the faces, timed from spawn, against the floor each one stands on: bare Python
for ``fleet-rlm --help``, and an empty ``MCPServer`` of the same SDK, spawned the same way, for
``fleet-mcp``'s first replies (initialize, then tools/list over stdio)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio

from mcp import Client, StdioServerParameters

BIN = Path(sys.executable).parent
EMPTY_SERVER = "from mcp.server import MCPServer\nMCPServer('empty').run()\n"


def _spawn_seconds(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "FLEET_NO_KEYRING": "1"})
    return time.perf_counter() - started


def cli_help_seconds(repeats: int) -> tuple[float, float]:
    """Minimum seconds of ``fleet-rlm --help`` and of ``python -c pass``."""
    fleet = min(_spawn_seconds([str(BIN / "fleet-rlm"), "--help"]) for _ in range(repeats))
    bare = min(_spawn_seconds([sys.executable, "-c", "pass"]) for _ in range(repeats))
    return fleet, bare


async def _first_reply(command: str, args: list[str]) -> float:
    started = time.perf_counter()
    params = StdioServerParameters(command=command, args=args, env={**os.environ, "FLEET_NO_KEYRING": "1"})
    async with Client(params) as client:
        await client.list_tools()
        return time.perf_counter() - started


def mcp_first_reply_seconds(repeats: int) -> tuple[float, float]:
    """Minimum seconds to initialize + tools/list: ``fleet-mcp``, then an empty MCPServer."""
    fleet = min(anyio.run(_first_reply, str(BIN / "fleet-mcp"), []) for _ in range(repeats))
    empty = min(anyio.run(_first_reply, sys.executable, ["-c", EMPTY_SERVER]) for _ in range(repeats))
    return fleet, empty
