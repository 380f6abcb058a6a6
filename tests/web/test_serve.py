"""`fleet web` as a user runs it (a real process, the real local sandbox): the sign-in address,
/health soon after launch, the session exchange, a 5 MB upload answered end to end with its events
streamed, MCP at /mcp on the same Engine, and the bind policy."""

from __future__ import annotations

import http.client
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp.client.streamable_http import streamable_http_client

from mcp import Client
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS
from tests.web.conftest import parse_sse

BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.anyio]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(fleet_env: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, **fleet_env, "FLEET_NO_KEYRING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _health(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def web(fleet_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, str, float]]:
    """A `fleet web` process: (base URL, the token from its printed address, seconds to /health)."""
    port = _free_port()
    log = (tmp_path / "web.log").open("w+")
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN / "fleet"), "web", "--no-open", "--port", str(port)], env=_env(fleet_env), stderr=log
    )
    try:
        while not _health(port):
            assert proc.poll() is None, (tmp_path / "web.log").read_text()
            assert time.monotonic() - started < 30, "no /health within 30 s"
            time.sleep(0.01)
        up = time.monotonic() - started
        printed = (tmp_path / "web.log").read_text()
        found = re.search(rf"open (http://127\.0\.0\.1:{port})/#token=(\S+)", printed)
        assert found, printed
        yield found.group(1), found.group(2), up
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert proc.returncode in (0, -15), (tmp_path / "web.log").read_text()


async def test_upload_run_stream_and_mcp_on_one_engine(web: tuple[str, str, float], oracle: OracleLM) -> None:
    base, token, _up = web  # /health's time is measured by bench against a bare Starlette app, not asserted
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    needle = "The secret code is PAPAYA."
    filler = "lorem ipsum dolor sit amet " * 40 + "\n"
    lines = [filler] * (5 * 1024 * 1024 // len(filler))
    lines[len(lines) * 2 // 3] = needle + "\n"
    data = "".join(lines).encode()
    assert len(data) >= 5_000_000
    async with httpx.AsyncClient(base_url=base, timeout=120) as browser:
        assert (await browser.get("/api/runs")).status_code == 401
        session = (await browser.post("/api/auth", json={"token": token})).json()["session"]
        browser.headers["Authorization"] = f"Bearer {session}"  # as the page does
        sent = await browser.post("/api/uploads", files=[("file", ("log.txt", data, "text/plain"))])
        assert sent.status_code == 201, sent.text
        upload = sent.json()["uploads"][0]
        assert upload["size"] == len(data)
        started = await browser.post(
            "/api/runs", json={"question": "What is the secret code?", "upload_ids": [upload["upload_id"]]}
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        async with browser.stream("GET", f"/api/runs/{run_id}/events") as stream:  # the session, as the page
            frames = parse_sse((await stream.aread()).decode())
        events = [f for f in frames if "id" in f]
        assert [int(f["id"]) for f in events] == list(range(1, len(events) + 1))
        assert events[-1]["event"] == "run.finished" and "PAPAYA" in events[-1]["data"]
        state = (await browser.get(f"/api/runs/{run_id}")).json()
        assert state["status"] == "succeeded" and state["answer"] == "PAPAYA"
        doctor = (await browser.get("/api/doctor")).json()
        assert doctor["sandbox"]["isolation"] in ("bwrap", "none")

    authed = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=120))
    async with authed, Client(streamable_http_client(f"{base}/mcp", http_client=authed)) as mcp:
        listed = await mcp.call_tool("list_runs", {})
        assert run_id in [r["run_id"] for r in listed.structured_content["runs"]]  # the same Engine and store


def _health_ms(conn: http.client.HTTPConnection) -> float:
    started = time.perf_counter()
    conn.request("GET", "/health")
    conn.getresponse().read()
    return (time.perf_counter() - started) * 1000


def test_a_kept_alive_connection_is_answered_without_a_delayed_ack_stall(web: tuple[str, str, float]) -> None:
    """Without TCP_NODELAY a response written in two sends (headers, then body) waits for the
    client's delayed ACK, ~40 ms, on every request after the first few of a kept-alive connection
    (a browser's API calls, a script's loop); a fresh connection is ACKed at once."""
    port = int(web[0].rsplit(":", 1)[1])
    fresh = []
    for _ in range(10):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        fresh.append(_health_ms(conn))
        conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    kept = [_health_ms(conn) for _ in range(20)][5:]  # past the connection's quick-ACK start
    conn.close()
    assert statistics.median(kept) <= 3 * statistics.median(fresh), (kept, fresh)


def test_bind_policy_and_usage_errors(fleet_env: dict[str, str]) -> None:
    refused = subprocess.run(
        [str(BIN / "fleet"), "web", "--no-open", "--host", "0.0.0.0", "--port", "0"],
        env=_env(fleet_env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--allow-remote" in refused.stderr and "Traceback" not in refused.stderr


def _remote_launch_warnings(env: dict[str, str]) -> str:
    """What `fleet web --host 0.0.0.0 --allow-remote` prints up to its address, then stopped."""
    proc = subprocess.Popen(
        [str(BIN / "fleet"), "web", "--no-open", "--host", "0.0.0.0", "--allow-remote", "--port", "0"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen = []
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if "fleet web: open http" in line:
                break
    finally:
        proc.terminate()
        proc.wait(30)
    return "".join(seen)


def test_remote_warning_knows_the_context_roots_saved_in_settings(fleet_env: dict[str, str], tmp_path: Path) -> None:
    """context_roots fences remote clients wherever it was set: saved with `config set` it counts too."""
    env = _env(fleet_env)
    assert "remote clients can name any file" in _remote_launch_warnings(env)
    fenced = tmp_path / "shared"
    fenced.mkdir()
    subprocess.run([str(BIN / "fleet-rlm"), "config", "set", "context_roots", str(fenced)], env=env, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    assert "FLEET_CONTEXT_ROOTS" not in env
    assert "remote clients can name any file" not in _remote_launch_warnings(env)
