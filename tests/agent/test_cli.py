"""`fleet --agent` through its real wire: a subprocess on a pipe, approvals answered at the prompt."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import MEMORY, memory_file, subprocess_env

pytestmark = pytest.mark.slow  # each test starts real processes

BIN = Path(sys.executable).parent


def agent_chat(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "fleet"), "--agent"],
        input=script,
        capture_output=True,
        text=True,
        env=subprocess_env(env),
        timeout=180,
    )


def test_terminal_approves_and_rejects_with_a_reason(agent_env: dict[str, str]) -> None:
    script = (
        "\n".join(
            [
                "remember my favourite bird",
                "n",  # reject ...
                "wrong bird",  # ... with a reason the agent reads
                "remember it after all",
                "y",
                "/audit",
                "/quit",
            ]
        )
        + "\n"
    )
    proc = agent_chat(script, agent_env)
    assert proc.returncode == 0, proc.stderr
    assert "The agent asks to write" in proc.stderr and "memory/birds.md" in proc.stderr
    assert "rejected" in proc.stdout and "wrong bird" in proc.stdout  # the agent's reply reports it
    assert "wrote" in proc.stdout
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY
    log = re.findall(r"\d\d:\d\d:\d\d\s+(\w+)\s+(\w+)", proc.stdout)  # /audit: time, action, actor
    assert [a for a, _ in log] == ["requested", "rejected", "requested", "approved", "executed"], proc.stdout
    assert ("rejected", "cli") in log and ("approved", "cli") in log


def test_pending_approval_from_another_face_is_asked_at_start(agent_env: dict[str, str]) -> None:
    first = agent_chat("remember the bird\ns\n/quit\n", agent_env)  # skipped: left pending
    assert "left pending" in first.stderr and not memory_file(agent_env["FLEET_HOME"]).exists()
    second = agent_chat("y\n/quit\n", agent_env)
    assert "1 approval(s) wait for you" in second.stderr, second.stderr
    assert second.returncode == 0 and "wrote" in second.stdout
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY


def test_attaching_a_path_too_long_for_the_file_system_is_a_user_error(
    agent_env: dict[str, str], tmp_path: Path
) -> None:
    proc = agent_chat(f"/attach {tmp_path / ('h' * 300)}\n/quit\n", agent_env)
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr
    assert "File name too long" in proc.stderr, proc.stderr
