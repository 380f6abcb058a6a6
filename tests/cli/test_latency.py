"""What the CLI loads on its way: `fleet-rlm run` before its first model call, and the read commands at
all. Seen from a real subprocess through ``python -X importtime`` (module names, never a time); the
times themselves are the benchmark's (`cli` figure, docs/benchmarks.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.oracle_lm import OracleLM, Scenario

BIN = Path(sys.executable).parent
# LiteLLM alone imports several times longer than dspy (thousands of pydantic models), and dspy's own
# client sends an OpenAI-compatible call without it.
MODEL_RUNTIME = ("dspy", "litellm", "openai")


def _loaded(importtime: str, packages: tuple[str, ...]) -> set[str]:
    """The ``packages`` (or any of their submodules) named in ``-X importtime`` output."""
    names = {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if line.startswith("import time:")}
    return {top for top in packages for name in names if name == top or name.startswith(top + ".")}


def _wait_for_first_call(oracle: OracleLM, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not oracle.requests() and proc.poll() is None:
        assert time.monotonic() < deadline, "no model call arrived"
        time.sleep(0.02)


@pytest.mark.parametrize("capped", [False, True], ids=["plain", "cost-capped"])
def test_run_asks_the_model_before_loading_litellm(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path, capped: bool
) -> None:
    """The first model call goes out while LiteLLM is still unloaded: nothing on the way to it (settings
    checks, provider detection, the price a cost cap needs, the client) waits for LiteLLM's import."""
    oracle.add(Scenario("how long", ["SUBMIT(len(context))"]))
    cap: list[str] = []
    if capped:  # a model the cost map prices, so the cap is accepted without a price setting
        fleet_env = {**fleet_env, "FLEET_LM_MODEL": "openai/gpt-4o-mini"}
        cap = ["--max-cost", "1"]
    oracle.state.hold = threading.Event()  # the call waits while the test reads what was imported by then
    log = tmp_path / "importtime.txt"
    cmd = [sys.executable, "-X", "importtime", str(BIN / "fleet-rlm"), "run", "how long is it?", "--text", "abcd", *cap]
    with log.open("w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, **fleet_env})
        try:
            _wait_for_first_call(oracle, proc)
            before_first_call = log.read_text()
        finally:
            oracle.state.hold.set()
            out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert out.strip() == "4"
    assert _loaded(before_first_call, MODEL_RUNTIME) == {"dspy"}


def _importtime(*args: str, env: dict) -> str:
    cmd = [sys.executable, "-X", "importtime", str(BIN / "fleet-rlm"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_read_commands_load_neither_the_model_runtime_nor_the_renderer(fleet_env: dict, oracle: OracleLM) -> None:
    """`runs`, `export`, `volumes ls` and `config list` read the store and settings: no dspy, LiteLLM,
    OpenAI SDK or httpx, and no rich (only a run's progress and `trace`'s tree draw with it)."""
    oracle.add(Scenario("how long", ["SUBMIT(len(context))"]))
    run = subprocess.run(
        [str(BIN / "fleet-rlm"), "run", "how long is it?", "--text", "abcd"],
        capture_output=True, text=True, env={**os.environ, **fleet_env}, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for args in (["runs"], ["export", "last"], ["volumes", "ls"], ["config", "list"]):
        assert _loaded(_importtime(*args, env=fleet_env), (*MODEL_RUNTIME, "httpx", "rich")) == set(), args
    assert _loaded(_importtime("trace", "last", env=fleet_env), (*MODEL_RUNTIME, "httpx")) == set()


@pytest.mark.parametrize("args", [["daytona", "smoke"], ["daytona", "gc"], ["run", "hi", "--sandbox", "daytona"]])
def test_a_missing_daytona_key_is_refused_before_the_sdk_loads(fleet_env: dict, args: list[str]) -> None:
    """The Daytona SDK takes about 3 CPU-seconds to import: a command that cannot use it says why first."""
    env = {k: v for k, v in {**os.environ, **fleet_env}.items() if k != "DAYTONA_API_KEY"}
    cmd = [sys.executable, "-X", "importtime", str(BIN / "fleet-rlm"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "error: the Daytona sandbox needs an API key" in done.stderr, done.stderr[-2000:]
    assert _loaded(done.stderr, ("daytona",)) == set()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--context", "{missing}"], "does not exist"),
        (["--context", "{empty}"], "is empty"),
        (["--session", "bad id!"], "session id 'bad id!'"),
        (["--volume", "../x"], "volume"),
        (["--text", "x"], "No model configured"),  # with FLEET_LM_MODEL unset
    ],
    ids=["missing-path", "empty-folder", "session-id", "volume-name", "no-model"],
)
def test_a_refused_run_is_refused_before_the_runtime_loads(
    fleet_env: dict, tmp_path: Path, args: list[str], said: str
) -> None:
    """A mistake in the request or the settings costs a read command's time, not dspy's import."""
    (tmp_path / "empty").mkdir()
    env = {**os.environ, **fleet_env}
    if said.startswith("No model"):
        del env["FLEET_LM_MODEL"]
    filled = [a.format(missing=tmp_path / "nope.txt", empty=tmp_path / "empty") for a in args]
    cmd = [sys.executable, "-X", "importtime", str(BIN / "fleet-rlm"), "run", "hello", *filled]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    refusal = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and refusal[0].startswith("error: ") and said in refusal[0], refusal
    assert _loaded(done.stderr, MODEL_RUNTIME) == set()
