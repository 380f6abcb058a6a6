"""Time from spawning ``fleet-mcp`` to its first replies (initialize + tools/list) over stdio,
against the floor: an empty ``MCPServer`` from the same SDK, spawned the same way.

    uv run python bench/mcp_startup.py         # writes bench/results/mcp_startup.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import anyio

from mcp import Client, StdioServerParameters

EMPTY_SERVER = "from mcp.server import MCPServer\nMCPServer('empty').run()\n"


async def first_reply_seconds(command: str, args: list[str]) -> float:
    started = time.perf_counter()
    async with Client(StdioServerParameters(command=command, args=args)) as client:
        await client.list_tools()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "mcp_startup.json"))
    args = parser.parse_args()
    fleet_mcp = str(Path(sys.executable).parent / "fleet-mcp")
    fleet, empty = [], []
    for _ in range(args.repeats):
        fleet.append(anyio.run(first_reply_seconds, fleet_mcp, []))
        empty.append(anyio.run(first_reply_seconds, sys.executable, ["-c", EMPTY_SERVER]))
    row = {
        "fleet_mcp_median_s": round(statistics.median(fleet), 3),
        "empty_mcpserver_median_s": round(statistics.median(empty), 3),
    }
    row["fleet_over_empty"] = round(row["fleet_mcp_median_s"] / row["empty_mcpserver_median_s"], 2)
    print(f"fleet-mcp first reply: {row['fleet_mcp_median_s']:.3f}s median; empty MCPServer: "
          f"{row['empty_mcpserver_median_s']:.3f}s; ratio {row['fleet_over_empty']}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**row, "repeats": args.repeats}, indent=2) + "\n")


if __name__ == "__main__":
    main()
