"""A run whose process was SIGKILLed shows `interrupted` at once, in every face, without a new
engine starting; a live owner is never mistaken for a dead one, nor a recycled pid for the owner."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcp import Client, StdioServerParameters
from tests.mcp.conftest import fleet_mcp_command, server_env
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BIN = Path(sys.executable).parent
# Step 2 never ends by itself; the scripted model is slow too, so a kill lands mid-run.
HANG = ["print('working')", "import time\ntime.sleep(120)"]


def start_run(question: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", question, "--text", "x", "--json"],
        env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def rows(db: Path) -> dict[str, dict]:
    """The runs as stored, read without fleet-rlm (so without its liveness check)."""
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return {r["question"]: dict(r) for r in conn.execute("SELECT * FROM runs")}


def wait_until_running(db: Path, questions: set[str]) -> None:
    """Until each run has reached its endless step (started, context, lm, code, lm)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            with sqlite3.connect(db) as conn:
                counts = dict(
                    conn.execute(
                        "SELECT r.question, COUNT(*) FROM events e JOIN runs r ON r.id = e.run_id GROUP BY r.id"
                    )
                )
        except sqlite3.OperationalError:  # not created yet
            continue
        if all(counts.get(q, 0) >= 5 for q in questions):
            return
    raise AssertionError("the runs never got going")


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def cli_runs(env: dict[str, str]) -> dict[str, dict]:
    out = subprocess.run(
        [str(BIN / "fleet-rlm"), "runs", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return {r["question"]: r for r in json.loads(out.stdout)}


async def test_killed_runs_show_interrupted_at_once_everywhere(
    fleet_env: dict[str, str], oracle: OracleLM, tmp_path: Path
) -> None:
    oracle.state.latency = 0.3
    oracle.add(Scenario("hang", HANG))
    db = Path(fleet_env["FLEET_HOME"]) / "fleet.db"
    a, b = start_run("hang A", fleet_env), start_run("hang B", fleet_env)
    impostor: subprocess.Popen[bytes] | None = None
    try:
        wait_until_running(db, {"hang A", "hang B"})
        # Started seconds after B's owner (start stamps tick every 10 ms), as a recycled pid would be.
        impostor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        command, *args = fleet_mcp_command()
        params = StdioServerParameters(command=command, args=args, env=server_env(fleet_env), cwd=str(tmp_path))
        async with Client(params) as client:
            run_a = rows(db)["hang A"]["id"]
            # The engine of this server opens now, while both owners live: nothing is closed out.
            assert (await client.call_tool("get_run", {"run_id": run_a})).structured_content["status"] == "running"  # type: ignore[index]
            assert {r["status"] for r in cli_runs(fleet_env).values()} == {"running"}

            kill(a)
            kill(b)
            # B's pid now belongs to a live process: what a recycled pid looks like to a reader.
            with sqlite3.connect(db) as conn:
                conn.execute("UPDATE runs SET owner_pid = ? WHERE question = 'hang B'", (impostor.pid,))
            assert rows(db)["hang B"]["owner_start"]  # the owner's start stamp tells them apart

            # MCP: the already-running server notices on this very read, no new engine involved.
            state = (await client.call_tool("get_run", {"run_id": run_a})).structured_content
            assert state["status"] == "interrupted", state  # type: ignore[index]
            assert state["stop_reason"] == f"the process running it stopped (pid {a.pid})"  # type: ignore[index]
            # B is not asserted still running here: this server's tail of other processes' runs may
            # close it out at any moment after the kill (a busy machine showed that race).

            # CLI: `runs` opens only the store, and sees B's owner is gone despite the live pid.
            listed = cli_runs(fleet_env)
            assert listed["hang B"]["status"] == "interrupted" and listed["hang A"]["status"] == "interrupted"
            assert impostor.poll() is None  # the impostor really was alive all along
            listing = (await client.call_tool("list_runs", {})).structured_content["runs"]  # type: ignore[index]
            assert {r["status"] for r in listing} == {"interrupted"}
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait()
        for proc in (a, b):
            if proc.poll() is None:
                kill(proc)

    # Durably, with one closing event each, after the run's own events (gap-free).
    for question in ("hang A", "hang B"):
        row = rows(db)[question]
        assert row["status"] == "interrupted" and row["finished_at"]
        with sqlite3.connect(db) as conn:
            events = conn.execute("SELECT seq, kind, data_json FROM events WHERE run_id = ? ORDER BY seq", (row["id"],))
            events = list(events)
        assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
        assert [kind for _, kind, _ in events].count("run.finished") == 1 and events[-1][1] == "run.finished"
        assert json.loads(events[-1][2])["status"] == "interrupted"
