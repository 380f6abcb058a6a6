"""Optimizations end to end in process: real Engine and store, the scripted model over HTTP, the
fast fake sandbox. A candidate that really scores better is saved, promoted and used by the next
run (proved by what that run sends to the model); the gate, cancel and resume, the cap, events."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import Conflict
from fleet_rlm.optimize import datasets, runner, versions
from fleet_rlm.optimize.runner import OptimizeRequest
from fleet_rlm.optimize.views import DatasetDetail
from fleet_rlm.types import PAYLOADS, RunRequest
from tests.optimize.conftest import INSTRUCTION
from tests.support.oracle_lm import OracleLM

pytestmark = pytest.mark.anyio


async def _dataset(engine: Engine, path: Path, name: str = "shout") -> DatasetDetail:
    rows = datasets.parse_jsonl(path.read_text().splitlines(), path.parent)
    return await datasets.create(engine.workspace, name, rows, source="jsonl")


async def _optimize(engine: Engine, optimizer: str, **options: Any) -> Any:
    opt_id, _ = await runner.start(engine, OptimizeRequest(dataset="shout", optimizer=optimizer, metric="exact",
                                                           **options))  # fmt: skip
    return await runner.wait(engine, opt_id)


def _sent(oracle: OracleLM, marker: str) -> str:
    """Everything the last root request containing ``marker`` sent the model."""
    texts = ["\n".join(str(m.get("content")) for m in r.messages) for r in oracle.requests("root")]
    return next(t for t in reversed(texts) if marker in t)


async def _ask(engine: Engine, word: str) -> Any:
    return await engine.run(RunRequest(f"Shout the word in the context ({word})", context_text=[f"Word: {word}"]))


async def test_bootstrap_candidate_is_saved_promoted_and_used_by_the_next_run(
    fake_env: dict, shout: OracleLM, shout_file: Path
) -> None:
    async with Engine() as engine:
        store = engine.workspace.store
        await _dataset(engine, shout_file)
        final = await _optimize(engine, "bootstrap")
        assert final.status == "succeeded" and final.version_id
        s = final.scores
        assert s.n_train == 8 and s.n_holdout == 2
        assert s.train_before is not None and s.train_before < 1.0 and s.train_after == 1.0
        assert s.holdout_after is not None and s.holdout_before is not None and s.holdout_after >= s.holdout_before
        assert final.gate["passed"] is True
        # The version holds the demos it added: whole successful runs of Exemplar rows.
        detail = versions.show(engine.workspace, final.version_id)
        demos = detail.changes["act"]["demos"]["after"]
        assert demos and all("Exemplar" in d["transcript"] and "SUBMIT" in d["code"] for d in demos)
        assert "instructions" not in detail.changes["act"]
        # Replays were real runs of kind eval under the optimization, kept out of the run list.
        evals = store.runs.list(kind="eval", limit=1000)
        assert evals and {r.parent_run_id for r in evals} == {final.id}
        assert store.runs.list() == []

        before = await _ask(engine, "plum")
        assert before.answer == "plum" and store.runs.get(before.run_id).program_version is None
        await versions.promote(engine.workspace, final.version_id)
        after = await _ask(engine, "quince")
        assert after.answer == "QUINCE"
        assert store.runs.get(after.run_id).program_version == final.version_id
        sent = _sent(shout, "(quince)")
        # The field appears in the system message's format, once per demo and once for this run.
        assert "Exemplar:" in sent and sent.count("[[ ## transcript ## ]]") == 2 + len(demos)

        assert await versions.rollback(engine.workspace) == "builtin"
        again = await _ask(engine, "rowan")
        assert again.answer == "rowan" and store.runs.get(again.run_id).program_version is None
        assert "Exemplar:" not in _sent(shout, "(rowan)")


async def test_gepa_proposes_an_instruction_that_the_next_run_sends(
    fake_env: dict, shout: OracleLM, shout_file: Path
) -> None:
    async with Engine() as engine:
        await _dataset(engine, shout_file)
        final = await _optimize(engine, "gepa", trials=2)
        assert final.status == "succeeded", final.error
        assert final.scores.train_after == 1.0 and final.scores.train_before < 1.0
        change = versions.show(engine.workspace, final.version_id).changes["act"]["instructions"]
        assert change["after"] == INSTRUCTION and change["before"] != INSTRUCTION
        # The reflection model was asked (its request named GEPA's proposal field).
        assert any("new_instruction" in str(r.messages[0]["content"]) for r in shout.requests("root"))
        await versions.promote(engine.workspace, final.version_id)
        result = await _ask(engine, "sloe")
        assert result.answer == "SLOE"
        assert INSTRUCTION in str(next(r for r in reversed(shout.requests("root"))
                                       if "(sloe)" in str(r.messages)).messages[0]["content"])  # fmt: skip
        diff = versions.compare(engine.workspace, "builtin", final.version_id)
        assert f"+{INSTRUCTION}" in diff.instructions["act"]


@pytest.mark.slow
async def test_mipro_finds_the_better_instruction(fake_env: dict, shout: OracleLM, shout_file: Path) -> None:
    async with Engine() as engine:
        await _dataset(engine, shout_file)
        final = await _optimize(engine, "mipro", trials=2)
        assert final.status == "succeeded", final.error
        assert final.scores.train_after == 1.0 > final.scores.train_before
        assert len(final.trials) >= 2


async def test_the_gate_refuses_a_candidate_that_is_no_better_unless_overridden(
    fake_env: dict, shout: OracleLM, tmp_path: Path
) -> None:
    path = tmp_path / "easy.jsonl"
    path.write_text("".join(
        f'{{"question": "Shout the word in the context ({w})", "context": "Exemplar: {w}", "answer": "{w}"}}\n'
        for w in ("KIWI", "LIME", "MANGO", "PEAR")
    ))  # fmt: skip
    async with Engine() as engine:
        store = engine.workspace.store
        await _dataset(engine, path)
        final = await _optimize(engine, "bootstrap")
        assert final.scores.train_before == final.scores.train_after == 1.0
        assert final.gate["passed"] is False
        with pytest.raises(Conflict, match="does not pass the promotion gate: train score did not improve"):
            await versions.promote(engine.workspace, final.version_id)
        assert versions.active(engine.workspace) is None
        await versions.promote(engine.workspace, final.version_id, override="demos help new users")
        assert versions.active(engine.workspace) == final.version_id
        assert store.optimize.activations()[0].reason == "override: demos help new users"


@pytest.mark.slow
async def test_cancel_then_resume_skips_every_finished_evaluation(
    fake_env: dict, shout: OracleLM, shout_file: Path
) -> None:
    shout.state.latency = 0.05  # time to cancel mid-way
    async with Engine() as engine:
        store = engine.workspace.store
        await _dataset(engine, shout_file)
        opt_id, _ = await runner.start(engine, OptimizeRequest(dataset="shout", optimizer="bootstrap", metric="exact"))
        seen = 0
        async for event in engine.subscribe(opt_id):
            seen += event["kind"] == "optimize.eval"
            if seen == 5 and event["kind"] == "optimize.eval":
                assert await engine.cancel(opt_id)
        cancelled = runner.state(engine.workspace, opt_id)
        assert cancelled.status == "cancelled" and cancelled.version_id is None
        assert engine.events(opt_id)[-1]["kind"] == "run.finished"
        replays = store.runs.list(kind="eval", limit=1000)
        assert not [(r.id, r.status) for r in replays if r.status in ("queued", "running")], "a replay outlived it"
        finished = len(store.read("SELECT 1 FROM eval_cache"))  # what the cache holds
        assert finished >= 5

        asked = len(shout.requests("root"))
        opt2, _ = await runner.start(engine, OptimizeRequest(dataset="", optimizer="", resume=opt_id))
        resumed = await runner.wait(engine, opt2)
        assert resumed.status == "succeeded" and resumed.scores.train_after == 1.0
        assert resumed.cached >= finished
        replays = len([r for r in store.runs.list(kind="eval", limit=1000) if r.parent_run_id == opt2])
        assert len(shout.requests("root")) - asked == replays  # one model call per replay: cached ones made none
        assert replays == resumed.evaluations - resumed.cached


async def test_the_call_cap_stops_an_optimization(fake_env: dict, shout: OracleLM, shout_file: Path) -> None:
    async with Engine() as engine:
        await _dataset(engine, shout_file)
        final = await _optimize(engine, "bootstrap", max_llm_calls=3)
        assert final.status == "failed" and "cap of 3 model calls" in (final.error or "")
        assert final.version_id is None


async def test_optimization_events_match_their_payload_types(fake_env: dict, shout: OracleLM, shout_file: Path) -> None:
    async with Engine() as engine:
        await _dataset(engine, shout_file)
        final = await _optimize(engine, "bootstrap")
        events = engine.events(final.id)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run.started" and kinds[1] == "optimize.started" and kinds[-2:] == [
        "optimize.finished", "run.finished"]  # fmt: skip
    assert kinds.count("optimize.scored") == 4
    for event in events:
        TypeAdapter(PAYLOADS[event["kind"]]).validate_python(event["data"], strict=False)
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_a_bad_request_is_refused_before_anything_is_recorded(fake_env: dict, shout: OracleLM) -> None:
    from fleet_rlm.errors import NotFound, UserError

    async with Engine() as engine:
        with pytest.raises(NotFound, match="no dataset 'nope'"):
            await runner.start(engine, OptimizeRequest(dataset="nope", optimizer="gepa"))
        with pytest.raises(UserError, match="unknown optimizer 'sgd'"):
            await runner.start(engine, OptimizeRequest(dataset="nope", optimizer="sgd"))
        with pytest.raises(UserError, match="unknown metric 'bleu'"):
            await runner.start(engine, OptimizeRequest(dataset="nope", optimizer="gepa", metric="bleu"))
        assert engine.workspace.store.runs.list(kind=None) == []
    await asyncio.sleep(0)
