"""`fleet-rlm run` with FLEET_HOME on a disk that fills up during the run (a real, small tmpfs).

The CLI neither hangs nor dies with SQLite's words: it tries the run's end again for a while, then
exits 1 with one `error:` line that says the store's disk is full, and once space is back the store
shows the run ended, not `running`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.small_disk import fill, free, small_disk

BIN = Path(sys.executable).parent
STEPS = ["print('working ' * 2000)", "print('still working ' * 2000)", "SUBMIT('done')"]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk") as mounted:
        try:
            yield mounted
        finally:
            free(mounted)


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "fleet-rlm"), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


@pytest.mark.slow
def test_a_run_whose_disk_fills_up_exits_with_the_reason_and_is_not_left_running(
    fleet_env: dict[str, str], oracle: OracleLM, disk: Path, tmp_path: Path
) -> None:
    env = {**os.environ, **fleet_env, "FLEET_HOME": str(disk / "home")}
    oracle.add(Scenario("fill the disk", STEPS))
    oracle.state.hold = threading.Event()  # the first model call waits while the test fills the disk
    proc = subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", "fill the disk", "--text", "some text"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not oracle.requests("root") and proc.poll() is None:
            assert time.monotonic() < deadline, "no model call arrived"
            time.sleep(0.02)
        fill(disk)
        oracle.state.hold.set()
        out, err = proc.communicate(timeout=120)  # a bound against a hang, not a speed
    finally:
        oracle.state.hold.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the store's disk is full"), err
    assert "Traceback" not in err and "savepoint" not in err and "internal error" not in err
    assert out == ""

    free(disk)
    (run,) = json.loads(_cli("runs", "--json", env=env, cwd=tmp_path).stdout)
    # Its process is gone and nothing more could be written: readers close it out, with its run.finished.
    assert run["run_id"] in last and run["status"] == "interrupted"
