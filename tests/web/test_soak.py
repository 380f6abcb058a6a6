"""Soak: 200 runs through the HTTP API, 20 at a time, each followed by one SSE subscriber that
stays and one that drops after a few events and comes back with Last-Event-ID. Every event reaches
each subscriber exactly once and in order; memory and open file descriptors stay flat from the
50th run to the 200th (measured at rest, after each phase; the model client's connection pool is
bounded on its own). Fast fake sandbox: isolation is not
what this tests."""

from __future__ import annotations

import asyncio
import gc
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from fleet_rlm.web.app import create_app
from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import AUTH, TOKEN, parse_sse, serving

pytestmark = pytest.mark.anyio
STEPS = ["import time\ntime.sleep(0.05)\nprint('tick')"] * 4 + ["SUBMIT('soaked')"]
CONCURRENCY = 20
MAX_RSS_GROWTH_MB = 40  # at rest after run 50 vs after run 200; a leak of a few KB per run would cross it


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _tcp_ports() -> dict[str, tuple[int, int]]:
    """Socket inode -> (local port, remote port) for this host's TCP sockets."""
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            ports[fields[9]] = (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def open_fds(model_port: int) -> tuple[list[str], int]:
    """This process's descriptors apart from its model connections, and how many of those there are.

    The model client keeps a pool of connections to the model server, which runs in this process
    too, so each pooled connection is two descriptors; the pool grows with the most calls ever in
    flight at once, which differs between two phases on loaded cores. It is bounded on its own."""
    ports = _tcp_ports()
    others, model = [], 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
        local, remote = ports.get(target.removeprefix("socket:[").removesuffix("]"), (0, 0))
        if remote == model_port:
            model += 1
        elif local != model_port or remote == 0:  # the server's side of a model connection is not counted
            others.append(target)
    return sorted(others), model


async def _events(client: httpx.AsyncClient, url: str, *, last: int = 0, stop_after: int | None = None) -> list[int]:
    seqs: list[int] = []
    headers = {"Last-Event-ID": str(last)} if last else {}
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        buffer = ""
        async for chunk in response.aiter_text():
            buffer += chunk.replace("\r\n", "\n")
            *done, buffer = buffer.split("\n\n")
            for frame in parse_sse("\n\n".join(done)):
                if "id" in frame:
                    seqs.append(int(frame["id"]))
                    if stop_after is not None and len(seqs) >= stop_after:
                        return seqs
    return seqs


async def _one(client: httpx.AsyncClient, n: int) -> None:
    started = await client.post("/api/runs", json={"question": f"soak run {n}", "context_text": [f"text {n}"]})
    assert started.status_code == 202, started.text
    url = f"/api/runs/{started.json()['run_id']}/events"
    stays = asyncio.create_task(_events(client, url))
    dropped = await _events(client, url, stop_after=2)
    back = await _events(client, url, last=dropped[-1])
    whole = await stays
    export = (await client.get(url.replace("/events", "/export"))).text.splitlines()
    expected = [json.loads(line)["seq"] for line in export]
    finished = json.loads(export[-1])["data"]
    assert finished.get("answer") == "soaked", (n, finished)  # else its status, error and stop reason
    assert whole == expected, (n, whole, expected)
    assert dropped + back == expected, (n, dropped, back, expected)


async def _phase(client: httpx.AsyncClient, numbers: range) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def gated(n: int) -> None:
        async with gate:
            await _one(client, n)

    await asyncio.gather(*(gated(n) for n in numbers))


async def _at_rest(model_port: int) -> tuple[float, list[str], int]:
    await asyncio.sleep(1.0)  # closed connections wind down on the server's side too
    gc.collect()
    return rss_mb(), *open_fds(model_port)


@pytest.mark.slow
async def test_two_hundred_runs_exactly_once_and_flat(fake_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("soak run", STEPS))
    app = create_app(token=TOKEN)
    # Idle connections expire before the server's 5 s keep-alive: a client starved past it by a busy
    # machine would otherwise send on a connection the server is closing (ReadError).
    limits = httpx.Limits(
        max_connections=CONCURRENCY * 3 + 5, max_keepalive_connections=CONCURRENCY * 3, keepalive_expiry=2.0
    )
    with serving(app) as base:
        measured = []
        for numbers in (range(1, 51), range(51, 201)):
            # A client per phase, closed before measuring: its kept-alive sockets are not the server's.
            async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=120, limits=limits) as client:
                await _phase(client, numbers)
                total = len((await client.get("/api/runs", params={"limit": 500, "status": "running"})).json()["runs"])
                assert total == 0
            measured.append(await _at_rest(urlsplit(oracle.base_url).port or 0))
        (rss_50, fds_50, _), (rss_200, fds_200, model_connections) = measured
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=120) as client:
            total = len((await client.get("/api/runs", params={"limit": 500})).json()["runs"])
    assert total == 200
    assert len(fds_200) <= len(fds_50) + 2, (fds_50, fds_200)
    assert model_connections <= CONCURRENCY, model_connections  # a pool, not a connection per run
    assert rss_200 - rss_50 < MAX_RSS_GROWTH_MB, (rss_50, rss_200)
