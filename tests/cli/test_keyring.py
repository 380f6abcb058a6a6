"""Secrets in a real OS keyring: a Secret Service (gnome-keyring) on a private D-Bus session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import prereqs
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.slow  # each test starts real processes

BIN = Path(sys.executable).parent
SECRET = "sk-keyring-only-9f8e7d6c"


def in_keyring_session(script: str, fleet_env: dict) -> subprocess.CompletedProcess:
    """``script`` in a private D-Bus session, with the Secret Service its lines start and its own HOME (the
    keyring's files go there), and no key in the environment: a key can only come from the keyring."""
    env = {k: v for k, v in os.environ.items() if k not in {"FLEET_NO_KEYRING", "FLEET_LM_API_KEY"}}
    env.update({k: v for k, v in fleet_env.items() if k != "FLEET_LM_API_KEY"})
    env["HOME"] = str(Path(fleet_env["FLEET_HOME"]).parent / "user-home")
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["dbus-run-session", "--", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )


def test_key_set_in_keyring_reaches_the_model_and_no_file(fleet_env: dict, oracle: OracleLM) -> None:
    prereqs.require_secret_service()
    oracle.add(Scenario("who am i", ["SUBMIT('hello')"]))
    cli = BIN / "fleet-rlm"
    script = f"""
{prereqs.UNLOCK_KEYRING}
{cli} config set lm_api_key {SECRET} || exit 11
echo "GET=$({cli} config get lm_api_key)"
{cli} config list | grep '^lm_api_key'
{cli} run "who am i" --text x --json || exit 12
{cli} doctor --offline --json
{cli} config unset lm_api_key
echo "AFTER=$({cli} config get lm_api_key)"
"""
    proc = in_keyring_session(script, fleet_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "GET=set (…7d6c)" in out and "[keyring]" in out
    assert SECRET not in out.replace(f"lm_api_key {SECRET}", "")  # shown masked, never in clear
    assert '"SecretService' in out or "SecretService" in out  # doctor names the real backend
    assert "AFTER=(not set)" in out
    # The key came from the keyring: the model server saw it, and it is in no file of ours.
    assert [r.auth for r in oracle.requests()] == [f"Bearer {SECRET}"]
    files = [p for p in Path(fleet_env["FLEET_HOME"]).rglob("*") if p.is_file()]
    assert files and all(SECRET.encode() not in p.read_bytes() for p in files)


def test_read_commands_leave_the_keyring_unasked_and_config_list_still_finds_the_key(
    fleet_env: dict, oracle: OracleLM
) -> None:
    """`runs`, `trace` and `volumes ls` need no secret: they never import keyring (a Secret Service round
    trip per secret was most of their start-up). `config list` and a run still find the saved key."""
    prereqs.require_secret_service()
    oracle.add(Scenario("who am i", ["SUBMIT('hello')"]))
    cli, py = BIN / "fleet-rlm", sys.executable
    script = f"""
{prereqs.UNLOCK_KEYRING}
{cli} config set lm_api_key {SECRET} || exit 11
{cli} run "who am i" --text x >/dev/null || exit 12
for c in runs "trace last" "volumes ls" "config list"; do
  echo "$c: $({py} -X importtime {cli} $c 2>&1 >/dev/null | grep -c ' keyring$')"
done
{cli} config list | grep '^lm_api_key'
"""
    proc = in_keyring_session(script, fleet_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert {"runs: 0", "trace last: 0", "volumes ls: 0", "config list: 1"} <= set(lines), proc.stdout
    assert any(line.startswith("lm_api_key") and "[keyring]" in line for line in lines), proc.stdout
    assert [r.auth for r in oracle.requests()] == [f"Bearer {SECRET}"]


def test_a_locked_keyring_is_a_clear_error_and_keeps_nothing(fleet_env: dict) -> None:
    """A keyring that is there but locked, with no screen to prompt on (a server, ssh): the save and the
    removal say how to fix it, never "internal error", and nothing lands in a file instead."""
    prereqs.require_secret_service()
    cli = BIN / "fleet-rlm"
    lock = (
        "dbus-send --session --print-reply --dest=org.freedesktop.secrets /org/freedesktop/secrets "
        "org.freedesktop.Secret.Service.Lock array:objpath:/org/freedesktop/secrets/collection/login >/dev/null"
    )
    script = f"""
{prereqs.UNLOCK_KEYRING}
{lock} || exit 11
{cli} config set lm_api_key {SECRET}; echo "SET=$?"
{cli} config unset lm_api_key; echo "UNSET=$?"
"""
    proc = in_keyring_session(script, fleet_env)
    assert proc.returncode == 0 and "SET=2" in proc.stdout and "UNSET=2" in proc.stdout, proc.stdout + proc.stderr
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(refusals) == 2 and "internal error" not in proc.stderr, proc.stderr
    assert all("keyring refused to change lm_api_key" in r and "export FLEET_LM_API_KEY=" in r for r in refusals)
    assert SECRET not in proc.stderr
    files = [p for p in Path(fleet_env["FLEET_HOME"]).rglob("*") if p.is_file()]
    assert all(SECRET.encode() not in p.read_bytes() for p in files)
