"""``fleet web`` figures, against the real server process:

* ``/health`` time after launch: spawn to the first 200, against a bare Starlette app on uvicorn
  spawned the same way (the floor the server stands on);
* SSE delivery latency: a run's events, from the moment each was stored (its envelope's ``ts``)
  to its arrival at each of 100 subscribers (and at 1, the baseline), with every event counted.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.procs import cpu_seconds

BIN = Path(sys.executable).parent
SIGN_IN = re.compile(r"(http://127\.0\.0\.1:(\d+))/#token=(\S+)")  # the address `fleet web` prints
BARE_APP = """\
import sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def health(request):
    return JSONResponse({"status": "ok"})

uvicorn.run(Starlette(routes=[Route("/health", health)]), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health_ok(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def health_seconds(cmd: list[str], port: int, env: dict[str, str], limit: float = 30.0) -> tuple[float, float]:
    """Wall seconds from spawn to the first 200 on ``/health`` (polled every 5 ms), and the CPU
    seconds the process had used by then."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not _health_ok(port):
            if proc.poll() is not None or time.perf_counter() - started > limit:
                raise RuntimeError(f"{cmd[0]} did not answer /health (exit {proc.returncode})")
            time.sleep(0.005)
        return time.perf_counter() - started, cpu_seconds(proc.pid)
    finally:
        _stop(proc)


def health_after_launch(env: dict[str, str], repeats: int) -> dict[str, float]:
    """Minimum wall and CPU seconds to ``/health``: ``fleet web`` (``fleet_s``, ``fleet_cpu``), then a
    bare Starlette app (``bare_s``, ``bare_cpu``)."""
    fleet, bare = [], []
    for _ in range(repeats):  # interleaved, so the machine's load hits both alike
        port = free_port()
        fleet.append(health_seconds([str(BIN / "fleet"), "web", "--no-open", "--port", str(port)], port, env))
        port = free_port()
        bare.append(health_seconds([sys.executable, "-c", BARE_APP, str(port)], port, env))
    return {
        "fleet_s": min(wall for wall, _ in fleet),
        "bare_s": min(wall for wall, _ in bare),
        "fleet_cpu": min(cpu for _, cpu in fleet),
        "bare_cpu": min(cpu for _, cpu in bare),
    }


@dataclass(frozen=True)
class WebServer:
    base: str  # http://127.0.0.1:PORT
    token: str  # the bearer token it printed
    pid: int


def _written(log: Any) -> str:
    """What the server wrote to ``log`` so far. Read at an offset, never by seeking: the server writes
    through the same open file, at its offset, and a seek back to 0 made its next line overwrite the
    sign-in address (under load, the SSE figure then waited out its 60 s for a line that was gone)."""
    return os.pread(log.fileno(), 1 << 20, 0).decode(errors="replace")


@contextmanager
def web_server(env: dict[str, str]) -> Iterator[WebServer]:
    """A ``fleet web`` process on a port it picks (``--port 0``: no other process can take it
    between a pick and the bind), until the block ends."""
    cmd = [str(BIN / "fleet"), "web", "--no-open", "--port", "0"]
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 60
            found = None
            while found is None or not _health_ok(int(found.group(2))):
                if time.monotonic() > deadline or proc.poll() is not None:
                    tail = _written(log)[-500:]
                    raise RuntimeError(f"fleet web did not answer /health (exit {proc.poll()}): {tail}")
                time.sleep(0.02)
                found = found or SIGN_IN.search(_written(log))
            yield WebServer(found.group(1), found.group(3), proc.pid)
        finally:
            _stop(proc)


async def _subscribe(
    client: httpx.AsyncClient, url: str, connected: asyncio.Event, out: list[tuple[float, float]]
) -> None:
    """Read one SSE stream to its end; record (arrival, stored) per event."""
    async with client.stream("GET", url) as response:
        response.raise_for_status()
        async for now, frame in sse_frames(response):
            if frame.startswith("retry:"):
                connected.set()
            for line in frame.split("\n"):
                if line.startswith("data: "):
                    ts = float(line.split('"ts":', 1)[1].split(",", 1)[0])
                    out.append((now, ts))


async def sse_frames(response: httpx.Response) -> AsyncIterator[tuple[float, str]]:
    """Each frame of an SSE response as it arrives: (arrival time, the frame's text)."""
    buffer = ""
    async for chunk in response.aiter_text():
        now = time.time()
        buffer += chunk.replace("\r\n", "\n")
        while "\n\n" in buffer:
            frame, buffer = buffer.split("\n\n", 1)
            yield now, frame


async def sse_latency(base: str, token: str, question: str, max_iters: int, subscribers: int) -> dict[str, Any]:
    """Start a run, follow it with ``subscribers`` streams; latency of the events stored after all joined."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=subscribers + 4)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120, limits=limits) as client:
        started = await client.post(
            "/api/runs", json={"question": question, "context_text": ["x" * 4000], "max_iters": max_iters}
        )
        started.raise_for_status()
        run_id = started.json()["run_id"]
        joined = [asyncio.Event() for _ in range(subscribers)]
        received: list[list[tuple[float, float]]] = [[] for _ in range(subscribers)]
        url = f"/api/runs/{run_id}/events"
        tasks = [asyncio.create_task(_subscribe(client, url, joined[i], received[i])) for i in range(subscribers)]
        async with asyncio.timeout(60):
            await asyncio.gather(*(e.wait() for e in joined))
            all_joined = time.time()
            await asyncio.gather(*tasks)
        total = len((await client.get(f"/api/runs/{run_id}/export")).text.splitlines())
    late = [(now - ts) * 1000 for got in received for now, ts in got if ts > all_joined]
    complete = all(len(got) == total for got in received)
    return {
        "subscribers": subscribers,
        "events": total,
        "all_delivered": complete,
        "measured": len(late),
        "median_ms": statistics.median(late) if late else None,
        "p95_ms": statistics.quantiles(late, n=20)[18] if len(late) >= 20 else None,
    }


def web_env(home: Path, base_url: str, model: str) -> dict[str, str]:
    return {
        **os.environ,
        "FLEET_HOME": str(home),
        "FLEET_LM_MODEL": model,
        "FLEET_LM_API_BASE": base_url,
        "FLEET_LM_API_KEY": "sk-bench",
        "FLEET_LM_RETRIES": "0",
        "FLEET_NO_KEYRING": "1",
        "FLEET_MCP_TOKEN": "",
    }
