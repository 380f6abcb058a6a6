"""Keys typed into the desktop's Settings page go to the OS keyring, and runs use them: with an
in-memory backend (same window), with a real Secret Service (gnome-keyring on a private D-Bus
session; the next process's run). A backend that stores nothing securely is refused with guidance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.desktop.conftest import BIN, ROOT, drive
from tests.support import prereqs
from tests.support.oracle_lm import OracleLM, Scenario

SECRET = "sk-desktop-keyring-5a4b3c2d"


def _keyring_env(desktop_env: dict, backend: str | None) -> dict[str, str]:
    env = {k: v for k, v in desktop_env.items() if k not in {"FLEET_NO_KEYRING", "FLEET_LM_API_KEY"}}
    env["HOME"] = str(Path(env["FLEET_HOME"]).parent / "user-home")  # keyring files, if any, go here
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    if backend:
        env["PYTHON_KEYRING_BACKEND"] = backend
    return env


def _no_file_holds(home: Path, secret: str) -> None:
    files = [p for p in home.rglob("*") if p.is_file()]
    assert files and all(secret.encode() not in p.read_bytes() for p in files)


@pytest.mark.slow
def test_key_saved_in_settings_reaches_the_model_in_memory_keyring(desktop_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("who am i", ["SUBMIT('hello')"]))
    env = _keyring_env(desktop_env, "tests.desktop.memory_keyring.MemoryKeyring")
    proc = drive(env, "save-key", SECRET, "run", "who am i")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved, ran = json.loads(proc.stdout)["steps"]
    assert "Saved: lm_api_key" in saved["saved"] and not saved["error"], saved
    assert "MemoryKeyring" in saved["backend"], saved  # the backend in use is shown
    assert ran["status"] == "succeeded", ran
    assert [r.auth for r in oracle.requests()] == [f"Bearer {SECRET}"]
    _no_file_holds(Path(env["FLEET_HOME"]), SECRET)
    assert SECRET not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["keyring.backends.fail.Keyring", "keyring.backends.null.Keyring"])
def test_a_keyring_that_cannot_keep_secrets_is_refused_with_guidance(desktop_env: dict, backend: str) -> None:
    env = _keyring_env(desktop_env, backend)
    proc = drive(env, "save-key", SECRET)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [saved] = json.loads(proc.stdout)["steps"]
    assert not saved["saved"], saved
    assert f"no secure OS keyring is available ({backend})" in saved["error"], saved
    assert "export FLEET_LM_API_KEY=" in saved["error"] and "gnome-keyring" in saved["error"]
    assert backend in saved["backend"] and "not usable" in saved["backend"], saved
    _no_file_holds(Path(env["FLEET_HOME"]), SECRET)


@pytest.mark.slow
def test_key_saved_in_settings_lands_in_the_secret_service_and_the_next_run_uses_it(
    desktop_env: dict, oracle: OracleLM
) -> None:
    prereqs.require_secret_service()
    oracle.add(Scenario("who am i", ["SUBMIT('hello')"]))
    env = _keyring_env(desktop_env, None)
    env.pop("PYTHON_KEYRING_BACKEND", None)
    script = f"""
{prereqs.UNLOCK_KEYRING}
{sys.executable} -m tests.desktop.driver save-key {SECRET} > "$FLEET_HOME.desktop.json" || exit 11
echo "GET=$({BIN / "fleet-rlm"} config get lm_api_key)"
{BIN / "fleet-rlm"} run "who am i" --text x --json >/dev/null || exit 12
"""
    proc = subprocess.run(["dbus-run-session", "--", "sh", "-c", script], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [saved] = json.loads(Path(env["FLEET_HOME"] + ".desktop.json").read_text())["steps"]
    assert "Saved: lm_api_key" in saved["saved"], saved
    assert "SecretService" in saved["backend"], saved
    assert "GET=set (…3c2d)" in proc.stdout  # in the keyring, shown masked
    # The next process's run took the key from the keyring: the model server saw it.
    assert [r.auth for r in oracle.requests()] == [f"Bearer {SECRET}"]
    _no_file_holds(Path(env["FLEET_HOME"]), SECRET)
