"""Per-step overhead of the Daytona backend against the loopback API double (docs/daytona.md).

    uv run python -m bench.daytona_overhead [--steps 50]

Measures, with the real ``daytona`` SDK on the wire: sandbox start (create from the snapshot,
context, worker upload), an empty step, a step making one host call (the in-band bridge), one
round trip of a plain toolbox HTTP request (the floor of a preview-URL broker's poll), and 5 MB
of input. The local sandbox's empty step is measured beside it. Medians, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.daytona_api import DoubleThread

from fleet_rlm.config import Settings
from fleet_rlm.sandbox.base import SandboxSpec, create_sandbox


async def _timed(n: int, step: Any) -> float:
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - began)
    return round(statistics.median(samples) * 1000, 2)


async def measure(api_url: str, work: Path, steps: int) -> dict[str, Any]:
    daytona = Settings(sandbox="daytona", home=work / "home", daytona_api_url=api_url, daytona_api_key="test-key")
    local = Settings(sandbox="local", home=work / "home")
    out: dict[str, Any] = {}
    box = create_sandbox(daytona, SandboxSpec(work_dir=work / "d"))
    began = time.perf_counter()
    await box.start()
    out["daytona_start_ms"] = round((time.perf_counter() - began) * 1000, 1)

    async def echo(x: int) -> int:
        return x

    await box.register_functions({"echo": echo})
    out["daytona_empty_step_ms"] = await _timed(steps, lambda: box.execute("None"))
    out["daytona_host_call_step_ms"] = await _timed(steps, lambda: box.execute("echo(1)"))
    many = await _timed(5, lambda: box.execute("for i in range(20):\n    echo(i)"))
    out["daytona_host_call_ms"] = round((many - out["daytona_empty_step_ms"]) / 20, 2)
    remote = box._remote.sandbox  # type: ignore[attr-defined]
    out["toolbox_http_roundtrip_ms"] = await _timed(steps, lambda: remote.get_work_dir())
    text = "x" * 5_000_000
    out["daytona_put_text_5mb_ms"] = await _timed(5, lambda: box.put_text("context", text))
    await box.shutdown()
    loc = create_sandbox(local, SandboxSpec(work_dir=work / "l"))
    await loc.start()
    out["local_empty_step_ms"] = await _timed(steps, lambda: loc.execute("None"))
    await loc.shutdown()
    out["overhead_per_step_ms"] = round(out["daytona_empty_step_ms"] - out["local_empty_step_ms"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, DoubleThread(Path(tmp) / "double") as double:
        print(json.dumps(asyncio.run(measure(double.api_url, Path(tmp), args.steps)), indent=2))


if __name__ == "__main__":
    main()
