"""The desktop's server takes orders from its own window only: every API, SSE and /mcp request
without this launch's token (or with a wrong one) is refused. A second launch raises the running
window instead of starting another; SIGTERM closes it cleanly."""

from __future__ import annotations

import http.client
import json
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.desktop.conftest import BIN

pytestmark = pytest.mark.slow  # each test starts real processes


def _request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
             body: bytes | None = None) -> int:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def _wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline() if proc.stderr else ""
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no line matching {pattern!r}: {''.join(seen)}")


def test_requests_without_the_launch_token_are_refused_and_one_instance_runs(desktop_env: dict) -> None:
    first = subprocess.Popen([str(BIN / "fleet"), "desktop"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=desktop_env)  # fmt: skip
    try:
        port = int(_wait_for_line(first, r"serving http://127\.0\.0\.1:(\d+)").group(1))
        assert _request(port, "GET", "/health") == 200  # open, says nothing but "up"
        wrong = "not-the-launch-token"
        mcp = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
        attempts = [
            ("GET", "/api/runs", {}, None),
            ("GET", "/api/runs", {"Authorization": f"Bearer {wrong}"}, None),
            ("GET", "/api/runs", {"Cookie": "fleet_session=0123456789abcdef"}, None),
            ("GET", "/api/settings", {}, None),
            ("PUT", "/api/settings", {"Content-Type": "application/json"}, b'{"lm_api_key": "sk-stolen"}'),
            ("GET", "/api/runs/r-x/events", {"Accept": "text/event-stream"}, None),
            ("POST", "/mcp", {"Content-Type": "application/json", "Accept": "application/json"}, mcp),
            ("POST", "/mcp", {"Authorization": f"Bearer {wrong}", "Content-Type": "application/json"}, mcp),
            ("POST", "/api/auth", {"Content-Type": "application/json"}, json.dumps({"token": wrong}).encode()),
        ]
        for method, path, headers, body in attempts:
            assert _request(port, method, path, headers, body) == 401, (method, path, headers)
        # A web page elsewhere naming this port is refused before any token is looked at.
        assert _request(port, "GET", "/api/runs", {"Host": "evil.example:80"}) == 421

        second = subprocess.run([str(BIN / "fleet"), "desktop"], capture_output=True, text=True, env=desktop_env,
                                timeout=60)  # fmt: skip
        assert second.returncode == 0, second.stderr
        assert "already running; its window was brought to the front" in second.stderr
        _wait_for_line(first, r"a second launch asked for this window")
        assert first.poll() is None, "the first window must stay open"
    finally:
        first.send_signal(signal.SIGTERM)
        rest = first.communicate(timeout=60)[1]
    assert first.returncode == 0, rest
    home = Path(desktop_env["FLEET_HOME"])
    assert not (home / "desktop.instance").exists()  # the claim on FLEET_HOME ends with the window
    assert stat.S_IMODE((home / "desktop.lock").stat().st_mode) == 0o600
    assert _closed(port)


def _closed(port: int) -> bool:
    try:
        _request(port, "GET", "/health")
    except OSError:
        return True
    return False
