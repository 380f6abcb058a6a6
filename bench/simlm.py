"""The simulated model, in its own process: the scripted OpenAI-compatible server of the tests
(``tests/support/oracle_lm.py``) playing the benchmark's workloads, with latency and jitter,
recording concurrency and prompt sizes.

``python -m bench.simlm`` prints ``{"base_url": ...}`` and then answers one JSON command per
line on stdin (``scenario``, ``config``, ``reset``, ``stats``, ``outage``); ``SimLM`` is the runner's handle.
Before a figure is trusted, ``keepalive_check`` times raw requests on one kept-alive connection:
a server whose responses stall (the delayed-ACK trap) would inflate every figure.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.oracle_lm import OracleLM, OracleState, Outage, Scenario

ROOT = Path(__file__).resolve().parents[1]


def _stats(state: OracleState) -> dict[str, Any]:
    with state.lock:
        requests = list(state.requests)
        peak = state.max_in_flight
    out: dict[str, Any] = {"max_in_flight": peak}
    for kind in ("root", "sub"):
        mine = [r for r in requests if r.kind == kind]
        out[kind] = {
            "calls": len(mine),
            "started": [r.started for r in mine],
            "prompt_chars": [r.prompt_chars for r in mine],
            "reply_chars": sum(r.reply_chars for r in mine),
        }
    return out


def serve() -> None:
    """The server process: scenarios arrive over stdin; the child policy stays last (a catch-all)."""
    from bench.workloads import CHILD_STEPS, read

    fallback = Scenario("", list(CHILD_STEPS), sub=read)
    with OracleLM(fallback) as lm:
        state = lm.state
        state.keep_messages = False
        print(json.dumps({"base_url": lm.base_url}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd.pop("op")
            reply: dict[str, Any] = {"ok": True}
            if op == "scenario":
                with state.lock:
                    state.scenarios.insert(0, Scenario(cmd["trigger"], cmd["steps"], sub=read))
            elif op == "config":
                state.latency, state.jitter = float(cmd["latency"]), float(cmd.get("jitter", 0.0))
            elif op == "reset":
                with state.lock:
                    state.requests.clear()
                    state.max_in_flight = 0
                    state.outage = None
            elif op == "stats":
                reply = _stats(state)
            elif op == "outage":
                with state.lock:
                    state.outage = Outage(cmd["after"], list(cmd["statuses"]), tuple(cmd["spare"]))
            else:
                reply = {"ok": False, "error": f"unknown op {op}"}
            print(json.dumps(reply), flush=True)


class SimLM:
    """The runner's handle on the server process."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.simlm"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        first = self._proc.stdout.readline() if self._proc.stdout else ""
        if not first:
            raise RuntimeError("the simulated model server did not start (see its stderr above)")
        self.base_url: str = json.loads(first)["base_url"]
        self._known: set[str] = set()

    def _call(self, **cmd: Any) -> dict[str, Any]:
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        reply = json.loads(self._proc.stdout.readline())
        if reply.get("ok") is False:
            raise RuntimeError(f"simulated model: {reply.get('error')}")
        return reply

    def play(self, trigger: str, steps: tuple[str, ...]) -> None:
        if trigger not in self._known:
            self._call(op="scenario", trigger=trigger, steps=list(steps))
            self._known.add(trigger)

    def configure(self, latency: float = 0.0, jitter: float = 0.0) -> None:
        self._call(op="config", latency=latency, jitter=jitter)

    def reset(self) -> None:
        self._call(op="reset")

    def stats(self) -> dict[str, Any]:
        return self._call(op="stats")

    def outage(self, after: int, statuses: list[int], spare: tuple[str, ...] = ()) -> None:
        """Once ``after`` root calls have arrived, fail the next requests with ``statuses``, one each,
        sparing those that mention a ``spare`` text (``oracle_lm.Outage``); ``reset`` ends it."""
        self._call(op="outage", after=after, statuses=statuses, spare=list(spare))

    def keepalive_check(self, requests: int = 12) -> dict[str, float]:
        """Milliseconds for a fresh connection's first request and the median of later ones."""
        parts = urlsplit(self.base_url)
        body = json.dumps({"model": "oracle", "messages": [{"role": "user", "content": "ECHO: ok"}]})
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        times = []
        try:
            for _ in range(requests):
                started = time.perf_counter()
                conn.request("POST", f"{parts.path}/chat/completions", body, {"Content-Type": "application/json"})
                conn.getresponse().read()
                times.append((time.perf_counter() - started) * 1000)
        finally:
            conn.close()
        later = sorted(times[1:])
        return {"first_ms": times[0], "later_median_ms": later[len(later) // 2]}

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> SimLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    serve()
