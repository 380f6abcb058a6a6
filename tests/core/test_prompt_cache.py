"""Prompt-cache accounting over the scripted LM: the cached share of each call's prompt, what the cache
saved at the model's own cache rate, and the cache mark Anthropic models get on the stable transcript."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from dspy.clients.model_metadata import model_info

from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest, RunResult
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Request, Scenario

pytestmark = pytest.mark.anyio

THREE_STEPS = ["x = 1\nprint(x)", "x += 1\nprint(x)", "x += 1\nSUBMIT(x)"]
ANTHROPIC = "anthropic/claude-sonnet-4-5"


@pytest.fixture(autouse=True)
def _sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")


async def _run(question: str) -> tuple[RunResult, list[dict[str, Any]]]:
    async with Engine() as engine:
        result = await engine.run(RunRequest(question, context_text=["nothing here"]))
        calls = [e["data"] for e in engine.events(result.run_id) if e["kind"] == "lm.call"]
    assert result.status == "succeeded", result.error
    return result, calls


async def test_openai_cached_tokens_are_counted_and_priced_at_the_cache_rate(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_MODEL", "openai/gpt-4o-mini")  # the cost map prices its cache reads at half the input
    oracle.add(Scenario("count to three", THREE_STEPS))
    uncached, _ = await _run("count to three")
    oracle.state.cache_reads = 200
    cached, calls = await _run("count to three")

    assert [c["cached_tokens"] for c in calls] == [200, 200, 200]
    total, before = cached.usage["total"], uncached.usage["total"]
    assert total["cached_tokens"] == 600 and total["prompt_tokens"] == before["prompt_tokens"]
    rates = model_info("openai", "gpt-4o-mini")  # LiteLLM's cost map as dspy ships it
    per_token = rates["input_cost_per_token"] - rates["cache_read_input_token_cost"]
    assert per_token > 0
    assert total["saved"] == pytest.approx(600 * per_token)
    assert before["cost"] - total["cost"] == pytest.approx(600 * per_token)  # the cache made it cheaper by that
    assert before["cached_tokens"] == 0 and before["saved"] == 0
    # OpenAI caches prefixes on its own: it is never sent Anthropic's mark.
    assert "cache_control" not in json.dumps([r.messages for r in oracle.requests()])


async def test_a_set_price_bills_cached_tokens_as_input(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_PRICE_PER_MTOK_IN", "1")
    monkeypatch.setenv("FLEET_LM_PRICE_PER_MTOK_OUT", "2")
    oracle.add(Scenario("count to three", THREE_STEPS))
    oracle.state.cache_reads = 50
    result, calls = await _run("count to three")
    total = result.usage["total"]
    assert total["cached_tokens"] == 150 and total["saved"] == 0
    assert total["cost"] == pytest.approx((total["prompt_tokens"] * 1 + total["completion_tokens"] * 2) / 1e6)
    assert all(c["saved"] == 0 for c in calls)


@pytest.fixture
def anthropic_env(fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The root model is an Anthropic one, served by the oracle's messages API."""
    monkeypatch.setenv("FLEET_LM_MODEL", ANTHROPIC)
    oracle.state.models = (*oracle.state.models, ANTHROPIC.partition("/")[2])
    oracle.add(Scenario("count to three", THREE_STEPS))
    return fleet_env


def _blocks(request: Request) -> list[dict[str, Any]]:
    content = request.messages[-1]["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def _marked_prefix(request: Request) -> list[str] | None:
    """The texts of the last message's blocks up to its cache mark, or None when it carries none."""
    blocks = _blocks(request)
    marked = [i for i, b in enumerate(blocks) if "cache_control" in b]
    assert len(marked) <= 1
    return [b["text"] for b in blocks[: marked[0] + 1]] if marked else None


async def test_anthropic_cache_reads_and_writes_are_counted(anthropic_env: dict, oracle: OracleLM) -> None:
    oracle.state.cache_reads, oracle.state.cache_writes = 300, 40
    result, calls = await _run("count to three")
    assert [(c["cached_tokens"], c["cache_write_tokens"]) for c in calls] == [(300, 40)] * 3
    total = result.usage["total"]
    assert total["cached_tokens"] == 900 and total["cache_write_tokens"] == 120
    assert total["prompt_tokens"] > 900 + 120  # Anthropic's own input count leaves them out; the total does not
    rates = model_info(*ANTHROPIC.split("/"))
    base, read, write = (
        rates[k] for k in ("input_cost_per_token", "cache_read_input_token_cost", "cache_creation_input_token_cost")
    )
    expected = 900 * (base - read) + 120 * (base - write)  # reads save more than writes cost above the input rate
    assert total["saved"] == pytest.approx(expected) and expected > 0


async def test_anthropic_transcript_prefix_is_marked_cacheable(anthropic_env: dict, oracle: OracleLM) -> None:
    result, _ = await _run("count to three")
    assert result.answer == "3"
    roots = oracle.requests("root")
    assert len(roots) == 3 and _marked_prefix(roots[0]) is None  # the first step has no stable part yet
    for earlier, later in itertools.pairwise(roots[1:]):
        written = _marked_prefix(earlier)
        assert written  # each later call marks its stable part ...
        assert [b["text"] for b in _blocks(later)[: len(written)]] == written  # ... which the next repeats verbatim


async def test_anthropic_cache_mark_can_be_turned_off(
    anthropic_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_PROMPT_CACHE", "false")
    await _run("count to three")
    assert len(oracle.requests("root")) == 3
    assert "cache_control" not in json.dumps([r.messages for r in oracle.requests()])
