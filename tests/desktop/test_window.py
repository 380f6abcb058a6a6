"""The window's native touches, through a real window: closing over a running run asks and cancels
it cleanly; links to other sites go to the system browser, never into the window; Export saves
through the save dialog; the window's size is remembered."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.desktop.conftest import BIN, drive
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.slow  # each test starts real processes


def _runs(env: dict) -> list[dict]:
    out = subprocess.run([str(BIN / "fleet-rlm"), "runs", "--json"], capture_output=True, text=True, env=env,
                         timeout=60)  # fmt: skip
    return json.loads(out.stdout)


def test_closing_over_a_running_run_asks_then_cancels_it(desktop_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow work", ["import time\ntime.sleep(120)", "SUBMIT('late')"]))
    proc = drive(desktop_env, "close-running", "slow work")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    [step] = report["steps"]
    assert step["before"] == "running"
    assert report["asked"] == [1]  # the person was asked, about one run
    [run] = _runs(desktop_env)
    assert run["run_id"] == step["run_id"] and run["status"] == "cancelled", run


def test_links_elsewhere_open_in_the_system_browser(desktop_env: dict, tmp_path: Path) -> None:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    browser.chmod(0o755)
    env = {**desktop_env, "BROWSER": str(browser)}
    proc = drive(env, "link", "https://example.org/paper")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [step] = json.loads(proc.stdout)["steps"]
    assert step["origin"].startswith("http://127.0.0.1:") and step["ready"] is True, step  # the window stayed
    assert opened.read_text().split() == ["https://example.org/paper"]


def test_export_is_saved_where_the_save_dialog_says(desktop_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.add(Scenario("export me", ["SUBMIT('done')"]))
    target = tmp_path / "saved" / "trace.jsonl"
    target.parent.mkdir()
    proc = drive({**desktop_env, "FLEET_TEST_SAVE_TO": str(target)}, "export", "export me")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [step] = json.loads(proc.stdout)["steps"]
    assert step["suggested"] == [f"{step['run_id']}.ndjson"]  # the name the page gives it
    events = [json.loads(line) for line in target.read_text().splitlines()]
    assert events[0]["kind"] == "run.started" and events[-1]["kind"] == "run.finished"


def test_a_window_whose_session_ended_signs_in_again(desktop_env: dict) -> None:
    proc = drive(desktop_env, "session-ends", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [step] = json.loads(proc.stdout)["steps"]
    assert step == {"refused": 401, "works": 200}  # the old session is dead; the page holds a new one


def test_the_window_size_is_remembered(desktop_env: dict, tmp_path: Path) -> None:
    home = Path(desktop_env["FLEET_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "desktop.json").write_text(json.dumps({"width": 1000, "height": 700}))
    shot = tmp_path / "shot.png"
    proc = subprocess.run([str(BIN / "fleet"), "desktop", "--self-test", "--screenshot", str(shot)],
                          capture_output=True, text=True, env=desktop_env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(1000x700)" in proc.stdout, proc.stdout
    assert json.loads((home / "desktop.json").read_text()) == {"width": 1000, "height": 700}
    assert stat.S_IMODE((home / "desktop.json").stat().st_mode) == 0o600


LOAD_ORDER = """
import sys
from pathlib import Path
from fleet_shell.server import LocalServer
from fleet_shell.window import DesktopWindow

loaded = []
LocalServer.start = lambda self: loaded.append("shiboken6" in sys.modules and "webview.platforms.qt" in sys.modules)
DesktopWindow(LocalServer(), Path(sys.argv[1]), gui="qt")
print(loaded)
"""


def test_the_qt_binding_is_loaded_before_the_server_thread_starts(desktop_env: dict, tmp_path: Path) -> None:
    """shiboken aborts the process when another thread imports while it starts (seen once in a suite
    run: "libshiboken/signature: could not initialize part 2"), so the window loads Qt first."""
    proc = subprocess.run([sys.executable, "-c", LOAD_ORDER, str(tmp_path)], capture_output=True, text=True,
                          env=desktop_env, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "[True]", proc.stdout + proc.stderr
