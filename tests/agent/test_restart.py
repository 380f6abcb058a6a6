"""The durable pause, through real wires: `fleet web` processes, the HTTP API, the scripted models.

A turn asks to write memory and pauses; the server is killed (SIGKILL: nothing gets to clean up); a new
server process answers the approval over HTTP, the turn resumes where it stopped, and the write happens
exactly once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.agent.conftest import MEMORY, memory_file
from tests.support.agent_lm import AgentLM

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fleet_web(env: dict[str, str], log: Path) -> Iterator[httpx.Client]:
    """A `fleet web` process; yields an authenticated client. Killed with SIGKILL on exit."""
    port = _free_port()
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    full = {**keep, **env, "FLEET_NO_KEYRING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    full.pop("FLEET_SANDBOX", None)  # the fake sandbox lives in the test process; no run happens here
    out = log.open("w+")
    proc = subprocess.Popen([str(BIN / "fleet"), "web", "--no-open", "--port", str(port)], env=full, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"#token=(\S+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {found.group(1)}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as client:
            while True:
                try:
                    if client.get("/api/conversations").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            yield client
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        out.close()


def test_approval_survives_a_server_restart(agent_env: dict[str, str], agent_lm: AgentLM, tmp_path: Path) -> None:
    with fleet_web(agent_env, tmp_path / "first.log") as api:
        conv = api.post("/api/conversations", json={"title": "birds"}).json()
        paused = api.post(f"/api/conversations/{conv['id']}/turns", json={"message": "remember my bird"}).json()
        assert paused["status"] == "paused", paused
        approval_id = paused["pending"][0]["id"]
        assert "memory/birds.md" in paused["pending"][0]["summary"]
    assert not memory_file(agent_env["FLEET_HOME"]).exists()
    calls_before = len(agent_lm.requests)

    with fleet_web(agent_env, tmp_path / "second.log") as api:
        pending = api.get("/api/approvals").json()["approvals"]
        assert [a["id"] for a in pending] == [approval_id]  # shown after the restart
        assert api.get("/api/conversations").json()["conversations"][0]["pending"] == 1
        answer = api.post(f"/api/approvals/{approval_id}", json={"approve": True}).json()
        assert answer["approval"]["status"] == "approved" and answer["approval"]["decided_by"] == "web"
        assert answer["turn"]["status"] == "done" and "wrote" in answer["turn"]["reply"], answer
        assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY
        # Resumed exactly where it stopped: one more model call, which saw the call's result.
        assert len(agent_lm.requests) == calls_before + 1
        assert "wrote" in agent_lm.requests[-1].messages[-1]["content"]

        memory_file(agent_env["FLEET_HOME"]).unlink()
        again = api.post(f"/api/approvals/{approval_id}", json={"approve": True})
        assert again.status_code == 409 and "approved already" in again.json()["message"]
        view = api.get(f"/api/conversations/{conv['id']}").json()
        actions = [e["action"] for e in reversed(view["audit"])]
        assert actions == ["requested", "approved", "executed"]
        assert view["status"] == "idle" and [m["kind"] for m in view["messages"]] == [
            "text",
            "tool_call",
            "tool_result",
            "text",
        ]
    assert not memory_file(agent_env["FLEET_HOME"]).exists()  # never written a second time
