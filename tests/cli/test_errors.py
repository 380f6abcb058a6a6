"""How the CLI fails: one `error:` line with the fix, exit 2 for a user's mistake and 1 for an
outage or a bug, no traceback unless FLEET_DEBUG=1, and nothing recorded for a refused request.
Model mistakes are caught before the first step; progress shows what the run waits for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from fleet_rlm import __version__
from fleet_rlm.cli.common import fail
from fleet_rlm.cli.progress import Progress
from fleet_rlm.errors import Conflict, NotFound, Unavailable, UserError
from tests.cli.terminal import Terminal
from tests.support.oracle_lm import OracleLM, Scenario

BIN = Path(sys.executable).parent


def cli(*args: str, env: dict, stdin: str | None = "", prog: str = "fleet-rlm") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / prog), *args], input=stdin, capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


def runs(env: dict) -> list[dict]:
    return json.loads(cli("runs", "--json", env=env).stdout)


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (UserError("bad flag: fix it"), 2, "error: bad flag: fix it"),
        (NotFound("no run 'x': see runs"), 2, "error: no run 'x': see runs"),
        (Conflict("session closed"), 2, "error: session closed"),
        (Unavailable("nothing answers at http://x; is the server running?"), 1, "error: nothing answers at"),
        (KeyboardInterrupt(), 130, "interrupted"),
        (RuntimeError("boom\nsecond line"), 1, "error: internal error: RuntimeError: boom; second line"),
    ],
)
def test_fail_maps_each_error_to_one_line_and_a_status(
    exc: BaseException, code: int, line: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_DEBUG", raising=False)
    assert fail(exc) == code
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "Traceback" not in err


def test_fleet_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_DEBUG", "1")
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        assert fail(exc) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: internal error: RuntimeError")


def test_version_on_every_entry_point(fleet_env: dict) -> None:
    for prog in ("fleet-rlm", "fleet", "fleet-mcp"):
        out = cli("--version", env=fleet_env, prog=prog)
        assert out.returncode == 0 and out.stdout.strip().endswith(__version__), (prog, out.stdout, out.stderr)


def test_broken_pipe_is_quiet(fleet_env: dict, tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("line\n" * 400_000)  # far more than a pipe buffer
    assert cli("volumes", "put", str(big), "notes/memory/big.txt", env=fleet_env).returncode == 0
    script = f"'{BIN / 'fleet-rlm'}' volumes cat notes/memory/big.txt | head -c 5; echo \" status=${{PIPESTATUS[0]}}\""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, **fleet_env})
    assert proc.stdout == "line\n status=0\n" and proc.stderr == ""


def test_config_messages(fleet_env: dict, tmp_path: Path) -> None:
    help_text = cli("config", "--help", env=fleet_env).stdout
    assert all(word in help_text for word in ("list", "get", "set", "unset"))
    bad = cli("config", "set", "max_iters", "abc", env=fleet_env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "http" not in bad.stderr
    assert bad.stderr.startswith("error: max_iters = 'abc' is not valid")
    (tmp_path / ".env").write_text("FLEET_MAX_ITERS=9\n")  # fleet_env runs commands in tmp_path
    listing = cli("config", "list", env=fleet_env).stdout
    assert any(line.startswith("max_iters") and "9" in line and "[.env]" in line for line in listing.splitlines())
    assert any(line.startswith("max_depth") and "[default]" in line for line in listing.splitlines())
    # Where a value comes from is asked of the sources that read it, under every name they read it by.
    aliased = cli("config", "list", env={**fleet_env, "FLEET_DAYTONA_TARGET": "eu"}).stdout
    (target,) = [line for line in aliased.splitlines() if line.startswith("daytona_target")]
    assert " eu " in target and "[env]" in target
    secret = cli("config", "set", "lm_api_key", env=fleet_env, stdin="sk-typed-in-for-nothing\n")
    assert secret.returncode == 2 and secret.stderr.startswith("error: no secure OS keyring")
    assert "not echoed" not in secret.stdout + secret.stderr  # refused before asking for the key


@pytest.mark.slow
def test_wrong_model_name_fails_before_the_first_step(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.state.strict_models = True  # it refuses names it does not list, as vLLM and hosted APIs do
    env = {**fleet_env, "FLEET_LM_MODEL": "openai/gpt-nope", "FLEET_LM_RETRIES": "3"}
    proc = cli("run", "hello", "--text", "x", "--json", env=env)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith("error: ")
    assert "serves no model 'gpt-nope'" in proc.stderr and "oracle" in proc.stderr
    assert "/models" in proc.stderr  # how to list the models
    # The name is not listed: one tiny call, without retries, got the server's definite no; no step ran.
    assert [r.model for r in oracle.requests()] == ["gpt-nope"] and oracle.requests("root") == []
    assert json.loads(cli("runs", "--json", env=env).stdout) == []  # a bad request is not a run
    doctor = cli("doctor", "--json", env=env)
    assert doctor.returncode == 1 and "serves no model 'gpt-nope'" in json.loads(doctor.stdout)["model"]["detail"]


@pytest.mark.slow
def test_a_server_that_answers_any_name_runs_with_one_warning(fleet_env: dict, oracle: OracleLM) -> None:
    """llama.cpp's server lists its GGUF file and answers to any name, as wildcard proxies do."""
    oracle.add(Scenario("hello", ["SUBMIT('hi')"]))
    env = {**fleet_env, "FLEET_LM_MODEL": "openai/qwen2.5-7b-instruct"}
    proc = cli("run", "hello", "--text", "x", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer"] == "hi"
    warned = [line for line in proc.stderr.splitlines() if "does not list 'qwen2.5-7b-instruct'" in line]
    assert len(warned) == 1 and "oracle" in warned[0]
    doctor = json.loads(cli("doctor", "--json", env=env).stdout)["model"]
    assert doctor["ok"] is True and "does not list 'qwen2.5-7b-instruct'" in doctor["detail"]


@pytest.mark.slow
def test_an_ollama_model_it_does_not_list_is_refused_without_a_call(fleet_env: dict, oracle: OracleLM) -> None:
    """Ollama serves exactly the models it lists (the pulled ones): its list is a definite answer."""
    proc = cli("run", "hello", "--text", "x", env={**fleet_env, "FLEET_LM_MODEL": "ollama_chat/nope"})
    assert proc.returncode == 2 and "serves no model 'nope'" in proc.stderr
    assert oracle.requests() == [] and runs(fleet_env) == []


@pytest.mark.slow
def test_closed_port_fails_fast_with_the_fix(fleet_env: dict) -> None:
    env = {**fleet_env, "FLEET_LM_API_BASE": "http://127.0.0.1:9/v1", "FLEET_LM_RETRIES": "3"}
    proc = cli("run", "hello", "--text", "x", "--json", env=env)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ")
    assert "nothing answers at http://127.0.0.1:9/v1; is the server running?" in proc.stderr
    # The preflight said it (one refused connection), not the first call after three retries.
    assert json.loads(cli("runs", "--json", env=env).stdout) == []


@pytest.mark.slow
@pytest.mark.parametrize("model", ["openai/", "no-such-provider-model"])
def test_model_string_without_provider_is_refused_with_the_form(fleet_env: dict, model: str) -> None:
    proc = cli("run", "hello", "--text", "x", env={**fleet_env, "FLEET_LM_MODEL": model})
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: FLEET_LM_MODEL='{model}' needs a provider")
    assert "FLEET_LM_MAX_TOKENS" not in proc.stderr and proc.stdout == ""
    assert runs(fleet_env) == []


def test_doctor_keyring_is_fine_when_the_key_is_in_the_environment(fleet_env: dict) -> None:
    report = json.loads(cli("doctor", "--json", "--offline", env=fleet_env).stdout)
    assert report["keyring"]["ok"] is True  # FLEET_LM_API_KEY is set: no keyring needed
    assert isinstance(report["sandbox"]["detail"], str)


@pytest.mark.slow
def test_unusable_sandbox_in_settings_fails_doctor_with_the_fix_that_works(fleet_env: dict) -> None:
    assert cli("config", "set", "sandbox", "daytona", env=fleet_env).returncode == 0
    doctor = cli("doctor", "--offline", "--json", env=fleet_env)
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 1 and report["sandbox"]["ok"] is False
    assert "fleet-rlm config unset sandbox" in report["sandbox"]["fix"]
    refused = cli("run", "hello", "--text", "x", env=fleet_env)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ") and runs(fleet_env) == []


@pytest.mark.slow
def test_context_from_a_terminal_says_how_to_finish(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("echo it", ["SUBMIT(context.strip().upper())"]))
    term = Terminal("fleet-rlm", "run", "echo it", "--context", "-", env=fleet_env)
    try:
        term.expect("then Ctrl-D on a line of its own")
        term.type("quiet otter")
        os.write(term.master, b"\x04")  # Ctrl-D
        term.expect("QUIET OTTER")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()


def test_progress_line_ticks_and_names_what_the_run_waits_for() -> None:
    progress = Progress("compact", console=Console(file=StringIO()))

    def feed(kind: str, **data: object) -> None:
        progress.feed({"kind": kind, "node": "root", "depth": 0, "data": data})

    feed("run.started", session_id=None)
    assert "loading the context" in progress.line().plain
    feed("context.loaded", chars=1, sources=1, skipped=[], report="1 source")
    since = progress.waiting_since
    assert "waiting for the model (0s)" in progress.line(now=since).plain
    assert "waiting for the model (12s)" in progress.line(now=since + 12).plain  # ticks with no new event
    feed("lm.call", step=1, predictor="act", prompt_tokens=10, completion_tokens=5)
    assert "step 1 · running code" in progress.line().plain and "15 tokens" in progress.line().plain
    for index in range(2):
        feed("subcall.finished", batch={"id": 1, "index": index, "size": 4})
    assert "2/4 sub-queries" in progress.line().plain
    feed("code.executed", step=1, code="x", output="", submitted=False)
    assert "waiting for the model" in progress.line().plain
    feed("run.finished", status="succeeded")
    assert "waiting" not in progress.line().plain


@pytest.mark.slow
def test_live_timer_ticks_while_the_model_thinks(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow model", ["SUBMIT('done thinking')"]))
    oracle.state.latency = 2.5  # one root call: long enough for several redraws in between
    term = Terminal("fleet-rlm", "run", "slow model", "--text", "x", env=fleet_env)
    try:
        term.expect("done thinking")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
    assert "waiting for the model (0s)" in term.seen and "waiting for the model (2s)" in term.seen
