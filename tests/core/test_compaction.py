"""Runs longer than a window (issue 38): the root transcript compacts before it passes the root model's
context window, the full history staying in the REPL as ``history``; a token budget ends a run partial;
a sub-call prompt larger than the sub model's window raises in the REPL, unsent. Through the scripted
model server (tests/support/oracle_lm.py) and the Engine, as a face calls it."""

from __future__ import annotations

import itertools
import json

import pytest
from pydantic import TypeAdapter

from fleet_rlm.core.engine import Engine
from fleet_rlm.types import HistoryCompactedData, RunRequest, RunResult
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Request, Scenario, default_sub

pytestmark = pytest.mark.anyio

STEPS = 60
# Every step is the same code: the REPL's own state decides when to submit, so the answer proves the
# variables survived every compaction; at the last step `history` must hold each step before it.
COUNTING = f"""\
try:
    counter += 1
except NameError:
    counter = 1
if counter == {STEPS}:
    every_step = [h["step"] for h in history] == list(range(1, {STEPS}))
    SUBMIT(f"{{counter}} {{every_step}} {{'counter' in history[0]['code']}}")
print("step", counter, "-" * 200)
"""
SUMMARY = "SUMMARY: a counter was incremented once per step and printed."
REMINDER = "\n\nRespond with the corresponding output fields"


def _summarise(prompt: str) -> str:
    return SUMMARY if "Summarise" in prompt else default_sub(prompt)


@pytest.fixture(autouse=True)
def _sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")


def _transcript(request: Request) -> str:
    """The transcript field of a root request: its last message up to the closing format reminder."""
    content = request.messages[-1]["content"]
    text = content if isinstance(content, str) else "".join(b["text"] for b in content)
    return text.split(REMINDER)[0]


async def test_a_long_run_compacts_keeps_its_repl_state_and_its_prompts_stay_append_only(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_CONTEXT_WINDOW", "3000")  # tokens: a few steps' worth beside the instructions
    oracle.add(Scenario("count the steps", [COUNTING], sub=_summarise))
    async with Engine() as engine:
        result = await engine.run(RunRequest("count the steps", context_text=["nothing"], max_iters=STEPS + 5))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    assert result.answer == f"{STEPS} True True"  # the counter, `history` with every step, its code

    compacted = [e["data"] for e in events if e["kind"] == "history.compacted"]
    assert compacted, "the run never compacted"
    for data in compacted:
        TypeAdapter(HistoryCompactedData).validate_python(data)
        assert set(data) <= HistoryCompactedData.__required_keys__ | HistoryCompactedData.__optional_keys__
        assert data["chars_after"] < data["chars_before"] and data["steps_folded"] >= 1
        assert data["prompt_tokens"] > 0  # the summary call is metered like every call
    summaries = [r for r in oracle.requests("sub") if "Summarise" in r.messages[-1]["content"]]
    assert len(summaries) == len(compacted)
    assert result.llm_calls == STEPS + len(compacted)  # counted in the budget

    roots = [_transcript(r) for r in oracle.requests("root")]
    assert len(roots) == STEPS
    opening = roots[0]
    assert all(t.startswith(opening) for t in roots)  # the opening observation stays
    breaks = [i for i, (a, b) in enumerate(itertools.pairwise(roots)) if not b.startswith(a)]
    assert len(breaks) == len(compacted)  # only a compaction breaks the prefix ...
    assert all(SUMMARY in roots[i + 1] for i in breaks)
    assert all(later - earlier > 1 for earlier, later in itertools.pairwise([*breaks, len(roots) - 1]))
    # ... and from it on, each prompt is a prefix of the next, so the provider's cache hits again.
    after_last = roots[breaks[-1] + 1 :]
    assert len(after_last) >= 2
    assert all(b.startswith(a) for a, b in itertools.pairwise(after_last))
    assert max(len(t) for t in roots) < 3000 * 4 * 0.85  # never past the threshold (4 characters a token)

    # The trace keeps every step unchanged.
    executed = [e["data"] for e in events if e["kind"] == "code.executed"]
    assert [d["step"] for d in executed] == list(range(1, STEPS + 1))


async def test_a_compacted_run_replays_from_its_record(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_CONTEXT_WINDOW", "3000")
    oracle.add(Scenario("count the steps", [COUNTING.replace(str(STEPS), "25")], sub=_summarise))
    async with Engine() as engine:
        source = await engine.run(RunRequest("count the steps", context_text=["nothing"], max_iters=30))
        assert source.status == "succeeded", source.error
        assert any(e["kind"] == "history.compacted" for e in engine.events(source.run_id))
        oracle.state.fail_kind = {"root": 500, "sub": 500}  # any live call would fail now
        replay_id = await engine.replay(source.run_id)
        replayed = await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
    assert replayed.status == "succeeded", replayed.error
    assert replayed.answer == source.answer
    assert report.diverged is False, report.first_divergence
    assert replayed.usage["total"]["calls"] == 0


async def test_a_fork_after_a_compaction_keeps_the_repl_state_of_the_replayed_steps(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_CONTEXT_WINDOW", "3000")
    oracle.add(Scenario("count the steps", [COUNTING.replace(str(STEPS), "25")], sub=_summarise))
    async with Engine() as engine:
        source = await engine.run(RunRequest("count the steps", context_text=["nothing"], max_iters=30))
        compacted = [e["data"]["step"] for e in engine.events(source.run_id) if e["kind"] == "history.compacted"]
        assert compacted and compacted[0] < 20
        live = len(oracle.requests())
        fork_id = await engine.fork(source.run_id, "20", code="SUBMIT(f'{counter} {len(history)}')")
        forked = await engine.wait(fork_id)
    assert forked.status == "succeeded", forked.error
    assert forked.answer == "19 19"  # the REPL replayed 19 steps, compaction and all, then ran the given code
    assert len(oracle.requests()) == live  # no model was asked: every call before the fork came from the record


async def test_a_failed_summary_is_a_warning_and_the_run_goes_on_uncompacted(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_CONTEXT_WINDOW", "3000")
    oracle.add(Scenario("count the steps", [COUNTING.replace(str(STEPS), "25")], sub=_summarise))
    oracle.state.fail_kind = {"sub": 500}  # the summary call is not a root step: it fails, the steps do not
    async with Engine() as engine:
        result = await engine.run(RunRequest("count the steps", context_text=["nothing"], max_iters=30))
        events = engine.events(result.run_id)
    assert result.status == "succeeded" and result.answer == "25 True True", result.error
    warnings = [e["data"]["message"] for e in events if e["kind"] == "warning"]
    assert [w for w in warnings if w.startswith("compacting the transcript failed")] == warnings and len(warnings) == 1
    assert not any(e["kind"] == "history.compacted" for e in events)
    assert len(oracle.requests("sub")) == 1  # tried once, then the node stops compacting
    roots = [_transcript(r) for r in oracle.requests("root")]
    assert all(b.startswith(a) for a, b in itertools.pairwise(roots))


async def test_the_token_budget_ends_a_run_partial(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("loop forever", ["print('again', '-' * 400)"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("loop forever", context_text=["nothing"], max_tokens=3000))
    assert result.status == "partial"
    assert result.stop_reason == "token limit of 3000 reached"
    assert 1 < result.iterations < 20
    total = result.usage["total"]
    calls = oracle.requests()
    assert total["prompt_tokens"] + total["completion_tokens"] >= 3000 and len(calls) == result.iterations + 1


async def test_a_sub_call_larger_than_the_sub_models_window_raises_in_the_repl(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_SUB_LM_CONTEXT_WINDOW", "1000")
    steps = [
        "try:\n    llm_query('x' * 8000)\nexcept ValueError as e:\n    print(e)",
        "print(llm_query_batched(['y' * 8000, 'The secret code is K7']))",
        "SUBMIT('done')",
    ]
    result, outputs = await _step_outputs(oracle, "too big", steps)
    assert result.status == "succeeded", result.error
    assert "this prompt is ~2,000 tokens; the sub model's window is 1,000 tokens: split it" in outputs[0]
    assert "[ERROR] this prompt is ~2,000 tokens" in outputs[1] and "K7" in outputs[1]
    assert oracle.requests("sub") and all(len(r.messages[-1]["content"]) < 8000 for r in oracle.requests("sub"))


async def test_history_grows_by_one_entry_a_step_and_survives_the_code_rebinding_it(
    fleet_env: dict, oracle: OracleLM
) -> None:
    steps = ["x = 1", "history = 'mine now'", "SUBMIT(str([h['step'] for h in history]))"]
    oracle.add(Scenario("rebind history", steps))
    async with Engine() as engine:
        result = await engine.run(RunRequest("rebind history", context_text=["x"]))
        warnings = [e for e in engine.events(result.run_id) if e["kind"] == "warning"]
    assert result.status == "succeeded", result.error
    assert result.answer == "[1, 2]"  # bound whole again after step 2 rebound it, then appended to
    assert warnings == []


async def test_a_named_models_own_window_caps_what_is_sent_to_it(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = {"model": "openai/gpt-4", "api_base": oracle.base_url}  # LiteLLM's map: an 8,192-token window
    monkeypatch.setenv("FLEET_MODELS", json.dumps({"small": small}))
    steps = [
        "try:\n    llm_query('x' * 40000, model='small')\nexcept Exception as e:\n    print(e)",
        "print(len(llm_query('x' * 40000)))",  # the run's sub model has no known window: sent
        "SUBMIT('done')",
    ]
    result, outputs = await _step_outputs(oracle, "window per model", steps)
    assert result.status == "succeeded", result.error
    assert "this prompt is ~10,000 tokens; openai/gpt-4's window is 8,192 tokens: split it" in outputs[0]
    assert [len(r.messages[-1]["content"]) >= 40000 for r in oracle.requests("sub")] == [True]


async def _step_outputs(oracle: OracleLM, question: str, steps: list[str]) -> tuple[RunResult, list[str]]:
    """A scripted run over a tiny context: its result and what each step printed."""
    oracle.add(Scenario(question, steps))
    async with Engine() as engine:
        result = await engine.run(RunRequest(question, context_text=["nothing"]))
        outputs = [e["data"]["output"] for e in engine.events(result.run_id) if e["kind"] == "code.executed"]
    return result, outputs
