"""Cold start of the faces, timed from spawn, against the floor each one stands on: bare Python
for ``fleet-rlm --help``, and an empty ``MCPServer`` of the same SDK, spawned the same way, for
``fleet-mcp``'s first replies (initialize, then tools/list over stdio)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

BIN = Path(sys.executable).parent
EMPTY_SERVER = "from mcp.server import MCPServer\nMCPServer('empty').run()\n"


def _spawn(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "FLEET_NO_KEYRING": "1"})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@dataclass
class Spawns:
    """Minimum wall and CPU seconds of a command and of its floor, measured in alternation."""

    wall: float
    cpu: float
    floor_wall: float
    floor_cpu: float


def cli_help(repeats: int) -> Spawns:
    """``fleet-rlm --help`` against ``python -c pass``, each pair back to back, so a busy moment
    slows both sides. CPU time is the steady figure on a shared machine: a competing process
    stretches a command's wall time in proportion to how long it runs, not its CPU time."""
    fleet, bare = [], []
    for _ in range(repeats):
        fleet.append(_spawn([str(BIN / "fleet-rlm"), "--help"]))
        bare.append(_spawn([sys.executable, "-c", "pass"]))
    return Spawns(min(w for w, _ in fleet), min(c for _, c in fleet), min(w for w, _ in bare), min(c for _, c in bare))


async def _first_reply(command: str, args: list[str]) -> float:
    from mcp import Client, StdioServerParameters  # here: the other parts run without the SDK's import

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
