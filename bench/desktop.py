"""``fleet desktop`` figure: spawn to a usable window (the UI rendered and signed in, the server
answering), against a bare pywebview window showing a static page, spawned the same way in the
same run. The gap is what the product costs on top of the window itself.

Both run on Qt with the offscreen platform (no display needed); the product's time is read from
``fleet desktop --self-test``'s progress lines as they arrive, the bare one's from its own line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
USABLE_LINE = "signed in through the JS bridge"
BARE_WINDOW = """\
import os, sys, time
import webview

def check(window):
    window.events.loaded.wait(60)
    while window.run_js("document.body.innerText.length > 0") is not True:
        time.sleep(0.03)
    print("usable", flush=True)
    window.destroy()

page = "<!doctype html><title>bare</title><h1>A static page</h1><p>Nothing else.</p>"
webview.start(check, webview.create_window("bare", html=page, width=1280, height=860), gui="qt")
"""


def desktop_env(base: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "PYWEBVIEW_GUI"}}
    env.update({"QT_QPA_PLATFORM": "offscreen", "QT_API": "pyside6"})
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["QTWEBENGINE_DISABLE_SANDBOX"] = "1"  # Chromium refuses root otherwise (as `fleet desktop` sets)
    return env


def seconds_to_line(cmd: list[str], marker: str, env: dict[str, str], limit: float = 120.0) -> float:
    """Seconds from spawn to the first stdout line containing ``marker``; the process is then left to close."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                return time.perf_counter() - started
            if time.perf_counter() - started > limit:
                break
        raise RuntimeError(f"{cmd[0]} never printed {marker!r} (exit {proc.poll()})")
    finally:
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def launch_to_usable(env: dict[str, str], repeats: int) -> tuple[float, float]:
    """Minimum seconds to a usable window: ``fleet desktop``, then a bare pywebview page."""
    from fleet_shell import deps

    absent = deps.missing()
    if absent:
        raise RuntimeError(f"the desktop extra is not installed ({', '.join(absent)}): uv sync --extra desktop")
    env = desktop_env(env)
    fleet, bare = [], []
    for _ in range(repeats):  # interleaved, so the machine's load hits both alike
        fleet.append(seconds_to_line([str(BIN / "fleet"), "desktop", "--self-test"], USABLE_LINE, env))
        bare.append(seconds_to_line([sys.executable, "-c", BARE_WINDOW], "usable", env))
    return min(fleet), min(bare)
