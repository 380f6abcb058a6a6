"""What the suite needs from the machine beyond `uv sync`, and what happens when a piece is missing.

`.ci/setup` installs all of it on Debian (as root). The README's test command runs that script
itself when it runs as root and finds something missing (see tests/conftest.py); otherwise the
tests that need a missing piece skip with the one line to run, except in CI or as root, where a
missing piece is a broken setup and fails: it must never pass as a skip there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / ".ci" / "setup"
CHROMIUM = Path(os.environ.get("FLEET_CHROMIUM", "/usr/bin/chromium"))
NODE_TOOLS = {"FLEET_INSPECTOR": "mcp-inspector", "FLEET_MCPB": "mcpb", "FLEET_CONFORMANCE": "conformance"}
COMMANDS = ("bwrap", "dbus-run-session", "gnome-keyring-daemon")


def tools_folder() -> Path:
    """Where `.ci/setup` installs the Node tools (the same default, the same override)."""
    return Path(os.environ.get("FLEET_CI_TOOLS", Path.home() / ".cache" / "fleet-rlm-ci-tools"))


def node_tool_path(env_var: str) -> Path:
    """The tool named by its variable, or where `.ci/setup` puts it."""
    value = os.environ.get(env_var)
    return Path(value) if value else tools_folder() / "node_modules" / ".bin" / NODE_TOOLS[env_var]


def missing() -> list[str]:
    """The pieces this machine lacks, by the names a person would install."""
    absent = [cmd for cmd in COMMANDS if shutil.which(cmd) is None]
    if not CHROMIUM.exists():
        absent.append("chromium")
    absent += [name for var, name in NODE_TOOLS.items() if not node_tool_path(var).exists()]
    return absent


def strict() -> bool:
    """CI and root machines have (or were just given) everything: missing there fails."""
    return os.environ.get("CI", "").lower() in {"1", "true"} or os.geteuid() == 0


def how_to_install() -> str:
    return f"install with `sudo {SETUP.relative_to(ROOT)}` (Debian), or run the suite once as root"


def require(what: str, present: bool) -> None:
    """Skip (or, in CI and as root, fail) a test whose machine piece is absent."""
    if present:
        return
    message = f"{what} is missing: {how_to_install()}"
    if strict():
        pytest.fail(message)
    pytest.skip(message)


def require_desktop() -> None:
    """Skip a test of the desktop window without the ``desktop`` extra (a Python extra, not a machine
    piece: `uv sync --extra desktop`); in CI, where .ci/run installs it, fail instead."""
    from fleet_shell import deps

    absent = deps.missing()
    if not absent:
        return
    reason = f"the desktop extra is not installed ({', '.join(absent)}): uv sync --extra desktop"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must test the desktop: {reason}")
    pytest.skip(reason)


def node_tool(env_var: str) -> Path:
    path = node_tool_path(env_var)
    require(f"{NODE_TOOLS[env_var]} ({path})", path.exists())
    return path


def has_secret_service() -> bool:
    return all(shutil.which(cmd) for cmd in ("dbus-run-session", "gnome-keyring-daemon"))


def require_secret_service() -> None:
    require("a Secret Service (dbus-run-session and gnome-keyring-daemon)", has_secret_service())


# Shell lines, run inside `dbus-run-session`, that start an unlocked Secret Service and wait until it
# owns its bus name: `--unlock` returns before the forked daemon claims it, and a client asking first
# makes D-Bus start a second daemon, which reads the half-written login keyring and fails to prompt.
UNLOCK_KEYRING = """echo -n unlock | gnome-keyring-daemon --unlock --components=secrets >/dev/null
n=0
until dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \\
    org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q true; do
  n=$((n + 1)); [ "$n" -lt 600 ] || { echo "the Secret Service did not start within 30 s" >&2; exit 10; }
  sleep 0.05
done
"""
