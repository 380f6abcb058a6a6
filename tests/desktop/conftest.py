"""Desktop tests: each window runs in its own process (pywebview owns the main thread), offscreen.

Without the ``desktop`` extra these tests skip on a developer's machine and FAIL in CI (CI=true),
where .ci/run installs it: a missing dependency must never pass as a skip there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.prereqs import require_desktop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def desktop_env(fleet_env: dict[str, str]) -> dict[str, str]:
    """The scripted LM and a fresh FLEET_HOME, Qt offscreen (no display needed), the keyring off."""
    require_desktop()
    env = {k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "PYWEBVIEW_GUI"}}
    env.update(fleet_env)
    env.update({"QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)})
    return env


def drive(env: dict[str, str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``tests/desktop/driver.py`` in a subprocess (see its docstring)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.desktop.driver", *argv],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout,
    )  # fmt: skip
