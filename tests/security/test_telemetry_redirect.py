"""Runs' traces go where the environment says, and the environment's OTLP headers only there.

A face that saves settings (`PUT /api/settings` of `fleet web`, the desktop's Settings page uses the same
API) must not move the export of runs (their questions, code, outputs and answers) to another host, nor
stop it: `otel` and `otel_endpoint` are restart-only. The headers of `OTEL_EXPORTER_OTLP_HEADERS` (a
collector's bearer token) go only to the endpoint the environment names; a file setting (settings.json,
.env) that points the spans elsewhere sends them there without the headers, and `fleet-rlm doctor` says so.

Both collectors are real loopback OTLP/HTTP receivers that record every header and byte they got; the CLI
runs as subprocesses; settings.json is read from the host's disk afterwards.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.config import load_settings, save_settings
from fleet_rlm.core.doctor import doctor_report
from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM
from tests.support.otlp_collector import Collector, collecting
from tests.web.conftest import api_client

BIN = Path(sys.executable).parent
TOKEN = "otlp" + secrets.token_hex(16)  # the collector's token: nothing key-shaped about it
HEADERS = f"authorization=Bearer%20{TOKEN}"  # URL-encoded, as the OTLP specification writes it
CODE = "KESTREL42"
HAYSTACK = f"Notes from the field.\nThe secret code is {CODE}.\nMore notes."
QUESTION = "What is the secret code?"
OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_SDK_DISABLED", "FLEET_OTEL", "FLEET_OTEL_ENDPOINT",
)  # fmt: skip


@pytest.fixture
def configured() -> Iterator[Collector]:
    """The collector the environment names, the one the headers are for."""
    with collecting() as collector:
        yield collector


@pytest.fixture
def listener() -> Iterator[Collector]:
    """A collector on another loopback port: a host no header was ever given for."""
    with collecting() as collector:
        yield collector


@pytest.fixture
def otel_env(fleet_env: dict[str, str], configured: Collector, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    env = {**fleet_env, "OTEL_EXPORTER_OTLP_ENDPOINT": configured.url, "OTEL_EXPORTER_OTLP_HEADERS": HEADERS}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "fleet-rlm"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=180)  # fmt: skip


def run_cli(env: dict[str, str]) -> str:
    """One run through the CLI; returns everything it printed (checked for the token by the caller)."""
    run = cli("run", QUESTION, "--text", HAYSTACK, "--json", env=env)
    assert run.returncode == 0 and json.loads(run.stdout)["answer"] == CODE, run.stdout + run.stderr
    return run.stdout + run.stderr


def headers_reached(collector: Collector) -> set[str | None]:
    assert collector.spans, f"{collector.url} got no span: the test would prove nothing"
    return {h.get("authorization") for h in collector.headers}


def nothing_reached(collector: Collector) -> None:
    assert not collector.headers and not collector.spans, f"{collector.url} got {len(collector.spans)} spans"


def doctor_otel(env: dict[str, str]) -> dict[str, Any]:
    report = cli("doctor", "--offline", "--json", env=env)
    assert TOKEN not in report.stdout + report.stderr
    otel: dict[str, Any] = json.loads(report.stdout)["otel"]
    return otel


# -- the attack: the web app moves the export, the next run sends its spans there ----------------


@pytest.mark.slow
@pytest.mark.anyio
async def test_web_settings_can_neither_move_nor_stop_the_export(
    otel_env: dict[str, str], needle: OracleLM, configured: Collector, listener: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings_file = Path(otel_env["FLEET_HOME"]) / "settings.json"
    attempts: dict[str, tuple[Any, str]] = {
        "otel_endpoint": (listener.url, "FLEET_OTEL_ENDPOINT"),
        "otel": (False, "FLEET_OTEL"),
    }
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")  # the app's own engine: not what is tested here
    async with api_client() as api:
        for name, (value, env) in attempts.items():
            for attempt in (value, None):
                refused = await api.put("/api/settings", json={name: attempt})
                assert refused.status_code == 400, refused.text[:300]
                message = refused.json()["message"]
                assert env in message and f"fleet-rlm config set {name}" in message and "restart" in message, message
        mixed = await api.put("/api/settings", json={"max_iters": 7, "otel_endpoint": listener.url})
        assert mixed.status_code == 400, mixed.text[:300]  # nothing of a change that holds one lands
        shown = {s["name"]: s for s in (await api.get("/api/settings")).json()["settings"]}
        assert shown["otel"]["restart_only"] and shown["otel_endpoint"]["restart_only"]
    saved = settings_file.read_text() if settings_file.exists() else ""
    assert "otel" not in saved and "max_iters" not in saved, saved
    monkeypatch.delenv("FLEET_SANDBOX")
    said = run_cli(otel_env)  # the next CLI run: its spans still go to the configured collector
    assert headers_reached(configured) == {f"Bearer {TOKEN}"}
    nothing_reached(listener)
    assert TOKEN not in said


# -- the local user may move it, but the environment's headers stay with its endpoint -------------


@pytest.mark.slow
def test_an_endpoint_saved_in_settings_never_gets_the_environment_headers(
    otel_env: dict[str, str], needle: OracleLM, configured: Collector, listener: Collector
) -> None:
    assert cli("config", "set", "otel_endpoint", listener.url, env=otel_env).returncode == 0
    said = run_cli(otel_env)
    assert headers_reached(listener) == {None}  # the spans went where the file says, without the token
    assert TOKEN.encode() not in listener.received() and TOKEN not in said
    nothing_reached(configured)
    otel = doctor_otel(otel_env)  # the file hides the environment's endpoint: doctor says so, and how to undo it
    assert otel["ok"] is False, otel
    assert listener.url in otel["detail"] and configured.url in otel["detail"], otel
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in otel["detail"] and "settings.json" in otel["detail"], otel
    assert "withheld" in otel["detail"] and "authorization" in otel["detail"], otel
    assert "fleet-rlm config unset otel_endpoint" in otel["fix"], otel

    assert cli("config", "unset", "otel_endpoint", env=otel_env).returncode == 0
    run_cli(otel_env)
    assert headers_reached(configured) == {f"Bearer {TOKEN}"}
    assert doctor_otel(otel_env)["ok"] is True


@pytest.mark.anyio
async def test_a_dotenv_endpoint_gets_the_spans_but_not_the_headers(
    otel_env: dict[str, str], needle: OracleLM, configured: Collector, listener: Collector, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """.env in the working folder (a cloned repository's, say) is a file too. The same endpoint spelled
    otherwise in the environment (upper-case scheme, a trailing slash) is the same endpoint."""
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    (tmp_path / ".env").write_text(f"FLEET_OTEL_ENDPOINT={listener.url}\n")  # fleet_env works in tmp_path
    async with Engine() as engine:
        result = await engine.run(RunRequest(QUESTION, context_text=[HAYSTACK]))
    assert result.answer == CODE, result.error
    assert headers_reached(listener) == {None} and TOKEN.encode() not in listener.received()
    nothing_reached(configured)
    otel = (await doctor_report(load_settings(), offline=True))["otel"]
    assert otel["ok"] is False and ".env" in otel["detail"] and "withheld" in otel["detail"], otel
    assert otel["fix"] == "remove FLEET_OTEL_ENDPOINT from .env in this folder", otel

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", listener.url.replace("http://", "HTTP://") + "/")
    async with Engine() as engine:
        result = await engine.run(RunRequest(QUESTION, context_text=[HAYSTACK]))
    assert result.answer == CODE, result.error
    assert headers_reached(listener) == {None, f"Bearer {TOKEN}"}  # the first run's requests, then this one's


@pytest.mark.anyio
async def test_the_traces_variable_binds_the_headers_too(
    otel_env: dict[str, str], needle: OracleLM, configured: Collector, listener: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (a full URL) is the environment's endpoint for traces."""
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{configured.url}/v1/traces")
    async with Engine() as engine:
        assert (await engine.run(RunRequest(QUESTION, context_text=[HAYSTACK]))).answer == CODE
    assert headers_reached(configured) == {f"Bearer {TOKEN}"} and set(configured.paths) == {"/v1/traces"}
    nothing_reached(listener)


@pytest.mark.anyio
async def test_doctor_says_when_a_file_turns_the_environment_export_off(otel_env: dict[str, str]) -> None:
    save_settings({"otel": False})  # as `fleet-rlm config set otel false` does: the local user may
    otel = (await doctor_report(load_settings(), offline=True))["otel"]
    assert otel["ok"] is False and "off" in otel["detail"] and "settings.json" in otel["detail"], otel
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in otel["detail"] and "fleet-rlm config unset otel" in otel["fix"], otel
