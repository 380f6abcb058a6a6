"""Per-call overhead of an MCP tool called from the REPL against a direct client call (docs/tools.md).

    uv run python -m bench.tool_overhead [--calls 200]

One stdio MCP server (tests/support/tools_mcp_server.py). Direct: ``mcp.Client.call_tool`` from the
host, as any client calls it. From the REPL: the same tool as ``lab.shout(text=...)`` in the local
sandbox (bubblewrap where the host has it), through the host-call bridge and the run's ToolBox
(core/tools.py: allow check, caps, result conversion, the event). Medians per call, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleet_rlm.config import Settings
from fleet_rlm.core.tools import open_tools
from fleet_rlm.sandbox.base import SandboxSpec, create_sandbox
from fleet_rlm.types import RunRequest

SERVER = Path(__file__).resolve().parent.parent / "tests" / "support" / "tools_mcp_server.py"


async def measure(calls: int, work: Path) -> dict[str, Any]:
    from mcp.client.stdio import StdioServerParameters

    from mcp import Client

    log = work / "calls.log"
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio", str(log)])
    async with Client(params) as client:
        samples = []
        for _ in range(calls):
            began = time.perf_counter()
            await client.call_tool("shout", {"text": "x"})
            samples.append(time.perf_counter() - began)
    direct = statistics.median(samples) * 1000

    servers = {"lab": {"command": sys.executable, "args": [str(SERVER), "stdio", str(log)]}}
    settings = Settings(sandbox="local", home=work / "home", mcp_servers=servers)
    events: list[Any] = []
    async with open_tools(settings, RunRequest("bench", mcp_servers=["lab"]), None) as box:
        assert box is not None
        sandbox = create_sandbox(settings, SandboxSpec(work_dir=work / "box"))
        (work / "box").mkdir()
        await sandbox.start()
        try:
            await sandbox.register_functions(dict(box.functions(lambda kind, data: events.append(data))))
            code = (
                "import time, statistics\nsamples = []\n"
                f"for _ in range({calls}):\n    t = time.perf_counter()\n    lab.shout(text='x')\n"
                "    samples.append(time.perf_counter() - t)\nstatistics.median(samples) * 1000"
            )
            result = await sandbox.execute(code, timeout=600)
            assert result.error is None, result.error
            from_repl = float(result.value or 0)
        finally:
            await sandbox.shutdown()
    assert len(events) == calls
    return {
        "calls": calls,
        "direct_ms": round(direct, 3),
        "from_repl_ms": round(from_repl, 3),
        "overhead_ms": round(from_repl - direct, 3),
        "isolation": getattr(sandbox, "isolation", None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(args.calls, Path(tmp))), indent=2))


if __name__ == "__main__":
    main()
