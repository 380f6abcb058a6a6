"""Soak: 200 runs through the HTTP API, 20 at a time, each followed by one SSE subscriber that
stays and one that drops after a few events and comes back with Last-Event-ID. Every event reaches
each subscriber exactly once and in order; memory and open file descriptors stay flat from the
50th run to the 200th (measured at rest, after each phase). Fast fake sandbox: isolation is not
what this tests."""

from __future__ import annotations

import asyncio
import gc
import json
import os
from pathlib import Path

import httpx
import pytest

from fleet_rlm.web import create_app
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


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


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
    assert json.loads(export[-1])["data"]["answer"] == "soaked"
    assert whole == expected, (n, whole, expected)
    assert dropped + back == expected, (n, dropped, back, expected)


async def _phase(client: httpx.AsyncClient, numbers: range) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def gated(n: int) -> None:
        async with gate:
            await _one(client, n)

    await asyncio.gather(*(gated(n) for n in numbers))


async def _at_rest() -> tuple[float, int]:
    await asyncio.sleep(1.0)  # closed connections wind down on the server's side too
    gc.collect()
    return rss_mb(), open_fds()


async def test_two_hundred_runs_exactly_once_and_flat(fake_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("soak run", STEPS))
    app = create_app(token=TOKEN)
    limits = httpx.Limits(max_connections=CONCURRENCY * 3 + 5, max_keepalive_connections=CONCURRENCY * 3)
    with serving(app) as base:
        measured = []
        for numbers in (range(1, 51), range(51, 201)):
            # A client per phase, closed before measuring: its kept-alive sockets are not the server's.
            async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=120, limits=limits) as client:
                await _phase(client, numbers)
                total = len((await client.get("/api/runs", params={"limit": 500, "status": "running"})).json()["runs"])
                assert total == 0
            measured.append(await _at_rest())
        (rss_50, fds_50), (rss_200, fds_200) = measured
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=120) as client:
            total = len((await client.get("/api/runs", params={"limit": 500})).json()["runs"])
    assert total == 200
    assert fds_200 <= fds_50 + 2, (
        fds_50,
        fds_200,
        sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")),
    )
    assert rss_200 - rss_50 < MAX_RSS_GROWTH_MB, (rss_50, rss_200)
