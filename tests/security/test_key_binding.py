"""Each model key goes only to the endpoint it was given for.

A face that changes settings (`PUT /api/settings` of `fleet web`, the desktop's Settings page, which
uses that same API, and `fleet-rlm config set`) can point a model at another host; the key in the
environment or the keyring must not follow it there. The host here is a second scripted model server
on another loopback port that records the Authorization header of every request it gets; the
configured model server (the oracle) keeps answering the root model. Faces are driven for real: the
`fleet web` process over HTTP, the CLI as subprocesses, keys in an in-memory keyring inside the web
process or in a real Secret Service (gnome-keyring) across CLI processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import prereqs
from tests.support.agent_lm import AgentLM, Policy, Say
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS
from tests.web.conftest import fleet_web

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-oracle-0000"  # the environment's root key (fleet_env)
FRESH = "sk-given-again-for-the-listener-5e4d"
CODE = "KESTREL42"
HAYSTACK = f"Notes from the field.\nThe secret code is {CODE}.\nMore notes."
QUESTION = "What is the secret code?"
MEMORY_KEYRING = "tests.desktop.memory_keyring.MemoryKeyring"


@pytest.fixture
def listener() -> Iterator[OracleLM]:
    """A model server on another loopback port: a host no key was ever given for."""
    with OracleLM(Scenario("secret code", NEEDLE_STEPS)) as lm:
        yield lm


def keys_seen(server: OracleLM | AgentLM, kind: str | None = None) -> set[str | None]:
    requests = server.requests(kind) if isinstance(server, OracleLM) else server.requests
    assert requests, "the server got no request: the test would prove nothing"
    return {r.auth for r in requests}


def no_key_reached(server: OracleLM | AgentLM, kind: str | None = None) -> None:
    seen = keys_seen(server, kind)
    assert all(auth in (None, "Bearer not-needed") for auth in seen), f"a key reached {server.base_url}: {seen}"


def web_env(fleet_env: dict[str, str], keyring: bool = False) -> dict[str, str]:
    env = {**os.environ, **fleet_env}
    if keyring:  # keys saved through the app live in its process's memory
        env.pop("FLEET_NO_KEYRING", None)
        env.update({"PYTHON_KEYRING_BACKEND": MEMORY_KEYRING, "PYTHONPATH": str(ROOT)})
    return env


def put_settings(api: httpx.Client, changes: dict[str, Any]) -> None:
    saved = api.put("/api/settings", json=changes)
    assert saved.status_code == 200, saved.text


def run_via_web(api: httpx.Client) -> dict[str, Any]:
    started = api.post("/api/runs", json={"question": QUESTION, "context_text": [HAYSTACK]})
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = api.get(f"/api/runs/{run_id}").json()
        if state["status"] not in ("queued", "running"):
            return state
        time.sleep(0.1)
    pytest.fail(f"run {run_id} did not finish")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "fleet-rlm"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=180)  # fmt: skip


# -- the attack: a face points a model elsewhere, no key follows ---------------------------------


@pytest.mark.slow
def test_web_settings_never_send_the_key_to_a_new_sub_model_host(
    fleet_env: dict[str, str], needle: OracleLM, listener: OracleLM, tmp_path: Path
) -> None:
    with fleet_web(tmp_path, web_env(fleet_env)) as web, web.api() as api:
        put_settings(api, {"sub_lm_model": "openai/oracle", "sub_lm_api_base": listener.base_url})
        run = run_via_web(api)
    assert run["status"] == "succeeded" and run["answer"] == CODE, run  # the listener answered llm_query
    no_key_reached(listener, "sub")
    assert keys_seen(needle, "root") == {f"Bearer {KEY}"}  # the root model still has its key


@pytest.mark.slow
def test_web_settings_never_send_the_key_to_a_new_agent_model_host(
    fleet_env: dict[str, str], needle: OracleLM, tmp_path: Path
) -> None:
    with AgentLM(Policy("hello", [Say("hello back")])) as agent:
        with fleet_web(tmp_path, web_env(fleet_env)) as web, web.api() as api:
            put_settings(api, {"agent_lm_model": "openai/agent", "agent_lm_api_base": agent.base_url})
            conversation = api.post("/api/conversations", json={}).json()["id"]
            turn = api.post(f"/api/conversations/{conversation}/turns", json={"message": "hello"}).json()
        assert turn["status"] == "done" and "hello back" in turn["reply"], turn
        no_key_reached(agent)


@pytest.mark.slow
def test_cli_config_set_never_sends_the_key_to_a_new_sub_model_host(
    fleet_env: dict[str, str], needle: OracleLM, listener: OracleLM
) -> None:
    for name, value in (("sub_lm_model", "openai/oracle"), ("sub_lm_api_base", listener.base_url)):
        assert cli("config", "set", name, value, env=fleet_env).returncode == 0
    run = cli("run", QUESTION, "--text", HAYSTACK, "--json", env=fleet_env)
    assert run.returncode == 0 and json.loads(run.stdout)["answer"] == CODE, run.stdout + run.stderr
    no_key_reached(listener, "sub")
    assert keys_seen(needle, "root") == {f"Bearer {KEY}"}


@pytest.mark.slow
def test_a_root_base_saved_in_settings_never_gets_the_environment_key(
    fleet_env: dict[str, str], listener: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment holds the key but not the base: a base saved through a face is not where
    the key was given for. The host refuses the keyless call, and every face says why and how to fix it."""
    monkeypatch.delenv("FLEET_LM_API_BASE")
    env = {k: v for k, v in fleet_env.items() if k != "FLEET_LM_API_BASE"}
    listener.state.fail_kind = {"root": 401}
    assert cli("config", "set", "lm_api_base", listener.base_url, env=env).returncode == 0
    run = cli("run", QUESTION, "--text", HAYSTACK, "--json", env=env)
    no_key_reached(listener, "root")
    said = run.stdout + run.stderr
    assert run.returncode != 0 and "withheld" in said and "fleet-rlm config set lm_api_key" in said, said
    assert KEY not in said
    listing = cli("config", "list", env=env).stdout
    row = next(line for line in listing.splitlines() if line.startswith("lm_api_key"))
    assert "withheld" in row and listener.base_url.rstrip("/") in row, row
    report = json.loads(cli("doctor", "--offline", "--json", env=env).stdout)
    assert report["keys"]["ok"] is False and listener.base_url.rstrip("/") in report["keys"]["detail"], report


# -- the way that works: give the key again, for the new base ------------------------------------


@pytest.mark.slow
def test_a_key_given_again_with_the_new_base_goes_there_and_only_there(
    fleet_env: dict[str, str], needle: OracleLM, listener: OracleLM, tmp_path: Path
) -> None:
    with OracleLM(Scenario("secret code", NEEDLE_STEPS)) as third:
        with fleet_web(tmp_path, web_env(fleet_env, keyring=True)) as web, web.api() as api:
            # Another model on the root's endpoint shares the root's key.
            put_settings(api, {"sub_lm_model": "openai/gpt-4o-mini"})
            assert run_via_web(api)["answer"] == CODE
            assert keys_seen(needle, "sub") == {f"Bearer {KEY}"}
            # A new base with its key: that key goes there.
            put_settings(api, {"sub_lm_api_base": listener.base_url, "sub_lm_api_key": FRESH})
            assert run_via_web(api)["answer"] == CODE
            assert keys_seen(listener, "sub") == {f"Bearer {FRESH}"}
            # The base moves on without its key: the key stays behind.
            put_settings(api, {"sub_lm_api_base": third.base_url})
            assert run_via_web(api)["answer"] == CODE
        no_key_reached(third, "sub")
    assert keys_seen(needle, "root") == {f"Bearer {KEY}"}


@pytest.mark.slow
def test_cli_key_given_again_in_a_real_keyring_goes_only_to_its_base(
    fleet_env: dict[str, str], needle: OracleLM, listener: OracleLM
) -> None:
    prereqs.require_secret_service()
    with OracleLM(Scenario("secret code", NEEDLE_STEPS)) as third:
        fleet = BIN / "fleet-rlm"
        script = f"""
{prereqs.UNLOCK_KEYRING}
{fleet} config set sub_lm_api_base {listener.base_url} || exit 11
{fleet} config set sub_lm_api_key {FRESH} || exit 12
{fleet} run '{QUESTION}' --text '{HAYSTACK}' --json || exit 13
{fleet} config set sub_lm_api_base {third.base_url} || exit 14
{fleet} run '{QUESTION}' --text '{HAYSTACK}' --json || exit 15
"""
        env = {k: v for k, v in os.environ.items() if k != "FLEET_NO_KEYRING"} | fleet_env
        env["HOME"] = str(Path(fleet_env["FLEET_HOME"]).parent / "user-home")  # the keyring's files go here
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["dbus-run-session", "--", "sh", "-c", script], capture_output=True, text=True,
                              env=env, timeout=240)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert keys_seen(listener, "sub") == {f"Bearer {FRESH}"}
        no_key_reached(third, "sub")
    assert keys_seen(needle, "root") == {f"Bearer {KEY}"}


# -- keys saved by an older version, keys saved for no endpoint ----------------------------------


@pytest.fixture
def memory_keyring(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import keyring

    from tests.desktop.memory_keyring import MemoryKeyring

    monkeypatch.delenv("FLEET_NO_KEYRING")
    monkeypatch.delenv("FLEET_LM_API_KEY")
    previous = keyring.get_keyring()
    keyring.set_keyring(MemoryKeyring())
    try:
        yield
    finally:
        keyring.set_keyring(previous)


def test_a_key_saved_by_an_older_version_goes_only_where_the_environment_points(
    memory_keyring: None, listener: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import keyring

    from fleet_rlm.config import KEYRING_SERVICE, key_for, load_settings, save_settings

    keyring.set_password(KEYRING_SERVICE, "lm_api_key", FRESH)  # no endpoint recorded beside it
    assert key_for(load_settings(), "root").value == FRESH  # the environment's base
    monkeypatch.delenv("FLEET_LM_API_BASE")
    save_settings({"lm_api_base": listener.base_url})
    withheld = key_for(load_settings(), "root")
    assert withheld.value is None and "withheld" in (withheld.note or "") and FRESH not in (withheld.note or "")
    # Given again for this base, it is sent there, even beside a key in the environment (for another endpoint).
    monkeypatch.setenv("FLEET_LM_API_KEY", KEY)
    save_settings({"lm_api_key": FRESH + "-again"})
    assert key_for(load_settings(), "root").value == FRESH + "-again"


def test_a_key_for_no_model_yet_is_refused_with_the_fix(memory_keyring: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_rlm.config import keyring_get, save_settings
    from fleet_rlm.errors import UserError

    monkeypatch.delenv("FLEET_LM_MODEL")
    monkeypatch.delenv("FLEET_LM_API_BASE")
    with pytest.raises(UserError, match="lm_model"):
        save_settings({"lm_api_key": FRESH})
    assert keyring_get("lm_api_key") is None
    save_settings({"lm_model": "openai/gpt-4o-mini", "lm_api_key": FRESH})  # together: bound to that provider
    assert keyring_get("lm_api_key") == FRESH


# -- context_roots: which host files runs may read is not the web app's to change ----------------


@pytest.mark.slow
def test_context_roots_cannot_be_changed_through_the_web_app(fleet_env: dict[str, str], tmp_path: Path) -> None:
    """Settings that guard host files, where the Daytona key goes, or which private hosts runs and the
    agent may fetch are refused by a running server (and shown read-only), with how to change them."""
    settings_file = Path(fleet_env["FLEET_HOME"]) / "settings.json"
    guarded = {
        "context_roots": ("/", "FLEET_CONTEXT_ROOTS"),
        "daytona_api_url": ("http://127.0.0.1:9/api", "DAYTONA_API_URL"),
        "agent_allowed_hosts": ("127.0.0.1", "FLEET_AGENT_ALLOWED_HOSTS"),
        "fetch_allowed_hosts": ("127.0.0.1", "FLEET_FETCH_ALLOWED_HOSTS"),
    }
    with fleet_web(tmp_path, web_env(fleet_env)) as web, web.api() as api:
        for name, (value, env) in guarded.items():
            for attempt in (value, None):
                refused = api.put("/api/settings", json={name: attempt})
                assert refused.status_code == 400, refused.text
                message = refused.json()["message"]
                assert env in message and f"fleet-rlm config set {name}" in message and "restart" in message, message
        shown = {s["name"]: s for s in api.get("/api/settings").json()["settings"]}
        assert all(shown[name]["restart_only"] for name in guarded)
    saved = settings_file.read_text() if settings_file.exists() else ""
    assert not any(name in saved for name in guarded)
    assert cli("config", "set", "context_roots", str(tmp_path), env=fleet_env).returncode == 0  # the local user may
    assert json.loads(settings_file.read_text())["context_roots"] == str(tmp_path)
