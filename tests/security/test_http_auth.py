"""`fleet-mcp --transport http` as a real process: a bearer token by default, printed once when
generated and stored nowhere; `--no-auth` on request; `/health` open; sessions bounded."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp.client.streamable_http import streamable_http_client

from mcp import Client
from tests.mcp.conftest import fleet_mcp_command, server_env

pytestmark = pytest.mark.slow

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}  # fmt: skip
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+/mcp)")
GENERATED = re.compile(r"bearer token for this launch \(shown once, stored nowhere\): (\S+)")


@dataclass
class Served:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    url: str = ""

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = pattern.search(self.stderr)
            if found:
                return found
            assert self.proc.poll() is None, f"fleet-mcp exited: {self.stderr}"
            time.sleep(0.05)
        raise AssertionError(f"fleet-mcp never printed {pattern.pattern!r}: {self.stderr}")

    def post(self, body: dict, **headers: str) -> httpx.Response:
        return httpx.post(self.url, json=body, headers={**HEADERS, **headers}, timeout=30)

    def raw_status(self, authorization: str) -> int:
        """POST initialize with an Authorization value httpx would refuse to send (e.g. "Bearer ")."""
        host_port = self.url.split("/")[2]
        body = json.dumps(INITIALIZE).encode()
        head = (f"POST /mcp HTTP/1.1\r\nHost: {host_port}\r\nAuthorization: {authorization}\r\n"
                f"Accept: {HEADERS['Accept']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        host, port = host_port.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(head.encode() + body)
            status_line = conn.makefile("rb").readline().decode()
        return int(status_line.split()[1])


@contextmanager
def fleet_mcp_http(env: dict[str, str], cwd: Path, *flags: str) -> Iterator[Served]:
    """Start the server on a free port (--port 0) and wait for its "listening on" line."""
    proc = subprocess.Popen(
        [*fleet_mcp_command(), "--transport", "http", "--port", "0", *flags],
        env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    served = Served(proc)
    reader = threading.Thread(target=lambda: served.lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        served.url = served.wait_for(LISTENING).group(1)
        yield served
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)


def quiet_env(fleet_env: dict[str, str], **extra: str) -> dict[str, str]:
    """The server's environment, with debug logging on: whatever it logs is checked too."""
    return server_env(fleet_env) | {"FLEET_MCP_LOG_LEVEL": "DEBUG"} | extra


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.anyio
async def test_generated_token_is_required_and_shown_once(fleet_env: dict[str, str], tmp_path: Path) -> None:
    home = Path(fleet_env["FLEET_HOME"])
    with fleet_mcp_http(quiet_env(fleet_env), tmp_path) as served:
        token = served.wait_for(GENERATED).group(1)
        assert len(token) >= 32
        assert served.post(INITIALIZE).status_code == 401
        for wrong in (f"Bearer {token}x", "Bearer", f"Basic {token}", token, f"Bearer{token}"):
            refused = served.post(INITIALIZE, Authorization=wrong)
            assert refused.status_code == 401, wrong
            assert token not in refused.text and "bearer token" in refused.json()["message"]
        for blank in ("Bearer ", "Bearer   ", "bearer \t"):
            assert served.raw_status(blank) == 401, repr(blank)
        assert served.raw_status(f"Bearer {token}") == 200  # the raw request itself is well formed
        assert served.post(INITIALIZE, Authorization=f"bearer {token}").status_code == 200
        assert served.post(INITIALIZE, Authorization=f"BEARER {token}").status_code == 200

        health = httpx.get(served.url.replace("/mcp", "/health"), timeout=10)
        assert health.status_code == 200 and health.json() == {"status": "ok"}  # open, and says nothing else

        # A real client, lowercase scheme and all; list_runs opens the engine and writes the store.
        authed = httpx2.AsyncClient(headers={"Authorization": f"bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
        async with authed, Client(streamable_http_client(served.url, http_client=authed)) as client:
            assert "run" in [t.name for t in (await client.list_tools()).tools]
            assert (await client.call_tool("list_runs", {})).structured_content["runs"] == []  # type: ignore[index]
    # Shown once, on the terminal; the debug log that went to the same stream never repeats it.
    assert served.stderr.count(token) == 1, served.stderr
    assert (home / "fleet.db").exists()
    for path in files_under(tmp_path):  # FLEET_HOME (store, settings) and the working directory
        assert token.encode() not in path.read_bytes(), path


def test_configured_token_is_used_and_never_printed(fleet_env: dict[str, str], tmp_path: Path) -> None:
    token = "tok-" + "7f3a9c" * 6
    with fleet_mcp_http(quiet_env(fleet_env, FLEET_MCP_TOKEN=token), tmp_path) as served:
        assert served.post(INITIALIZE).status_code == 401
        assert served.post(INITIALIZE, Authorization=f"Bearer {token}").status_code == 200
    assert "bearer token required: the configured FLEET_MCP_TOKEN" in served.stderr
    assert token not in served.stderr and not GENERATED.search(served.stderr)


def test_no_auth_serves_openly_on_loopback_only(fleet_env: dict[str, str], tmp_path: Path) -> None:
    with fleet_mcp_http(quiet_env(fleet_env), tmp_path, "--no-auth") as served:
        assert served.post(INITIALIZE).status_code == 200
    assert "WITHOUT authentication (--no-auth)" in served.stderr and not GENERATED.search(served.stderr)

    flags = ["--transport", "http", "--host", "0.0.0.0", "--port", "0", "--allow-remote", "--no-auth"]
    remote = subprocess.run(
        [*fleet_mcp_command(), *flags],
        env=quiet_env(fleet_env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert remote.returncode == 2 and remote.stdout == ""
    assert "refusing to listen on 0.0.0.0" in remote.stderr and "drop --no-auth" in remote.stderr


def test_sessions_are_bounded_with_a_clear_error(fleet_env: dict[str, str], tmp_path: Path) -> None:
    with fleet_mcp_http(quiet_env(fleet_env, FLEET_MCP_MAX_SESSIONS="3"), tmp_path) as served:
        auth = {"Authorization": f"Bearer {served.wait_for(GENERATED).group(1)}"}
        sessions = []
        for _ in range(3):
            opened = served.post(INITIALIZE, **auth)
            assert opened.status_code == 200
            sessions.append(opened.headers["mcp-session-id"])
        assert len(set(sessions)) == 3
        refused = served.post(INITIALIZE, **auth)
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        assert "too many open MCP sessions (the limit is 3)" in message and "FLEET_MCP_MAX_SESSIONS" in message
        # Ending a session makes room for a new one.
        ended = httpx.delete(served.url, headers={**auth, "mcp-session-id": sessions[0]}, timeout=10)
        assert ended.status_code in (200, 204), ended.text
        assert served.post(INITIALIZE, **auth).status_code == 200
