"""A model per sub-call (issue 38): named models in settings (FLEET_MODELS), picked in the REPL with
``llm_query(prompt, model="fast")``. Two scripted OpenAI-compatible servers stand for the run's sub model
and the named one; each is judged by what it received: how many calls, and the Authorization header
each carried. The runs use the real local sandbox, so the name crosses the worker's host-call bridge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_rlm.config import ConfigError, load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import UserError
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario, default_sub

pytestmark = pytest.mark.anyio

ROOT_KEY = "sk-test-oracle-0000"
FAST_KEY = "sk-test-fast-7777"

STEPS = [
    # The default sub model, then the named one, then an unknown name: its exception is what the code sees
    # (a host function's ValueError crosses the bridge as a RuntimeError carrying "ValueError: ...", as any).
    "a = llm_query('The secret code is SUB1')\n"
    "b = llm_query('The secret code is FAST1', model='fast')\n"
    "c = llm_query_batched(['The secret code is FAST2', 'The secret code is FAST3'], model='fast')\n"
    "try:\n    llm_query('x', model='fasst')\nexcept Exception as exc:\n    err = f'{type(exc).__name__}: {exc}' \n"
    "print(a, b, c, err)",
    "SUBMIT(' '.join([a, b, *c, err]))",
]
UNKNOWN = "no model named 'fasst'; configured: fast, vision"


@pytest.fixture
def fast() -> Iterator[OracleLM]:
    """The named model's own server: it answers sub-queries marked as its own."""
    with OracleLM(Scenario("never a root here", ["SUBMIT('x')"], sub=lambda p: "fast:" + default_sub(p))) as lm:
        yield lm


@pytest.fixture
def named_env(fleet_env: dict, oracle: OracleLM, fast: OracleLM, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("FLEET_SANDBOX", "local")
    models = {
        "fast": {"model": "openai/gpt-4o-mini", "api_base": fast.base_url, "api_key": FAST_KEY},
        "vision": {"model": "openai/oracle", "api_base": oracle.base_url},  # the root's endpoint: its key
    }
    monkeypatch.setenv("FLEET_MODELS", json.dumps(models))
    oracle.add(Scenario("two models", STEPS))
    return fleet_env | {"FLEET_MODELS": json.dumps(models), "FLEET_SANDBOX": "local"}


def _expected(answer: str | None) -> bool:
    """The answer of STEPS: each sub-call's reply, then the unknown name's error as the code caught it."""
    return (
        answer is not None
        and answer.startswith("SUB1 fast:FAST1 fast:FAST2 fast:FAST3 ")
        and answer.endswith(f"ValueError: {UNKNOWN}")
    )


async def test_each_sub_call_reaches_the_model_it_names(named_env: dict, oracle: OracleLM, fast: OracleLM) -> None:
    async with Engine() as engine:
        result = await engine.run(RunRequest("two models", context_text=["ctx"]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", "\n".join(e["data"]["output"] for e in events if e["kind"] == "code.executed")
    assert _expected(result.answer), result.answer
    # Counted at the servers: the named model's calls went to its own, the default sub-call to the run's.
    assert [r.kind for r in fast.requests()] == ["sub"] * 3
    assert {r.model for r in fast.requests()} == {"gpt-4o-mini"}
    assert len(oracle.requests("sub")) == 1 and len(oracle.requests("root")) == 2
    # Each key went only to its own endpoint.
    assert {r.auth for r in fast.requests()} == {f"Bearer {FAST_KEY}"}
    assert {r.auth for r in oracle.requests()} == {f"Bearer {ROOT_KEY}"}
    # Usage per configured model, and each subcall event says which one answered.
    by_name = result.usage["by_name"]
    assert {name: part["calls"] for name, part in by_name.items()} == {"root": 2, "sub": 1, "fast": 3}
    assert by_name["fast"]["model"] == "openai/gpt-4o-mini" and by_name["fast"]["prompt_tokens"] > 0
    assert result.usage["by_model"]["openai/gpt-4o-mini"]["calls"] == 3
    subcalls = [e["data"] for e in events if e["kind"] == "subcall.finished"]
    assert sorted(d["model_name"] for d in subcalls) == ["fast", "fast", "fast", "sub"]
    # The model is told which names it may use.
    first_prompt = json.dumps(oracle.requests("root")[0].messages)
    assert "fast (openai/gpt-4o-mini), vision (openai/oracle)" in first_prompt and "model=NAME" in first_prompt


async def test_a_replay_answers_named_calls_from_the_record_with_both_servers_stopped(
    named_env: dict, oracle: OracleLM, fast: OracleLM
) -> None:
    async with Engine() as engine:
        source = await engine.run(RunRequest("two models", context_text=["ctx"]))
    assert source.status == "succeeded", source.error
    for server in (fast, oracle):  # stopped: any model call would fail ("cannot reach"), and none may be made
        server.__exit__(None, None, None)
    async with Engine() as engine:
        replay_id = await engine.replay(source.run_id)
        result = await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
    assert result.status == "succeeded", result.error
    assert _expected(result.answer), result.answer
    assert report.diverged is False
    assert result.usage["total"]["calls"] == 0 and result.usage["replayed"]["calls"] == 6


async def test_a_child_rlm_takes_a_named_model_for_its_own_steps(
    named_env: dict, oracle: OracleLM, fast: OracleLM
) -> None:
    oracle.add(Scenario("parent asks", ["SUBMIT(rlm_query('child task', context='c', model='fast'))"]))
    fast.add(Scenario("child task", ["SUBMIT(llm_query('The secret code is KID'))"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("parent asks", context_text=["ctx"]))
    assert result.status == "succeeded", result.error
    assert result.answer == "KID"  # the child's sub-call went to the run's sub model, not "fast:"
    assert [r.kind for r in fast.requests()] == ["root"]
    assert {name: part["calls"] for name, part in result.usage["by_name"].items()} == {"root": 1, "fast": 1, "sub": 1}


def test_a_named_models_key_goes_only_to_the_endpoint_given_with_it(
    named_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet_rlm.config import key_for_model

    settings = load_settings()
    assert key_for_model(settings, "fast").value == FAST_KEY
    assert key_for_model(settings, "vision").value == ROOT_KEY  # the root's own endpoint
    assert FAST_KEY not in repr(settings) and FAST_KEY not in str(settings.model_dump())
    # settings.json, which every face writes, moves the model elsewhere: the key stays behind.
    monkeypatch.setenv("FLEET_MODELS", json.dumps({"fast": {"model": "openai/gpt-4o-mini", "api_key": FAST_KEY}}))
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "settings.json").write_text(
        json.dumps({"models": {"fast": {"api_base": "http://127.0.0.1:9/v1"}}})
    )
    moved = load_settings()
    assert moved.models["fast"].api_base == "http://127.0.0.1:9/v1"
    choice = key_for_model(moved, "fast")
    assert choice.value is None and choice.note and "withheld" in choice.note and FAST_KEY not in choice.note


def test_models_are_saved_without_keys_and_checked(named_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_rlm.config import read_user_settings, save_settings

    save_settings({"models": '{"cheap": {"model": "openai/gpt-4o-mini"}}'})
    assert read_user_settings()["models"] == {"cheap": {"model": "openai/gpt-4o-mini"}}
    with pytest.raises(UserError, match="never saved to a file"):
        save_settings({"models": {"cheap": {"model": "openai/x", "api_key": "sk-secret-000000"}}})
    assert "sk-secret" not in json.dumps(read_user_settings())
    with pytest.raises(UserError, match="provider and a model name"):
        save_settings({"models": {"cheap": {"model": "gpt4"}}})
    monkeypatch.setenv("FLEET_MODELS", '{"root": {"model": "openai/x"}}')
    with pytest.raises(ConfigError, match="not root, sub or agent"):
        load_settings()


def test_the_cli_runs_with_a_named_model(named_env: dict, oracle: OracleLM, fast: OracleLM, tmp_path: Path) -> None:
    env = os.environ | named_env | {"FLEET_NO_KEYRING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    (tmp_path / "ctx.txt").write_text("ctx")
    done = subprocess.run(
        [sys.executable, "-m", "fleet_rlm.cli.main", "run", "two models", "--context", str(tmp_path / "ctx.txt")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _expected(done.stdout.strip()), done.stdout
    assert "models: root 2 (" in done.stderr and ", sub 1 (" in done.stderr and ", fast 3 (" in done.stderr
    assert FAST_KEY not in done.stdout + done.stderr
    assert [r.auth for r in fast.requests()] == [f"Bearer {FAST_KEY}"] * 3
