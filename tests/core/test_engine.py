"""The runtime end to end over the scripted LM server: answers, events, budgets, children,
sessions, errors and cancellation."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from fleet_rlm.config import ConfigError, load_settings
from fleet_rlm.core.context import ContextError
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.trace import build_trace
from fleet_rlm.errors import Unavailable
from fleet_rlm.types import RunRequest
from fleet_rlm.volumes import VolumeError
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS, write_haystack

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _sandbox(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's logic runs on the fast in-process sandbox; tests marked real_sandbox (isolation,
    killing, cancelling C-level sleeps, end to end) run on the real one."""
    if request.node.get_closest_marker("real_sandbox") is None:
        fake_sandbox.register()
        monkeypatch.setenv("FLEET_SANDBOX", "fake")


@pytest.mark.real_sandbox
async def test_needle_answer_events_and_trace(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    hay = write_haystack(tmp_path / "hay.txt", 1_000_000, "K7Q2")
    async with Engine() as engine:
        result = await engine.run(RunRequest("What is the secret code?", context_paths=[str(hay)]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    assert result.answer == "K7Q2"
    assert result.iterations == len(NEEDLE_STEPS)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["kind"] == "run.started" and events[-1]["kind"] == "run.finished"
    trace = build_trace(events)
    steps = trace["nodes"]["root"]["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    subcalls = steps[1]["subcalls"]
    assert len(subcalls) == result.llm_calls - len(NEEDLE_STEPS)
    assert any(s["response_preview"] == "K7Q2" for s in subcalls)
    # The haystack never travels in a prompt: only previews and the needle chunk do.
    biggest = max(len(json.dumps(r.messages)) for r in oracle.requests())
    assert biggest < 200_000


async def test_prompt_is_append_only(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("count to three", ["x = 1\nprint(x)", "x += 1\nprint(x)", "x += 1\nSUBMIT(x)"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("count to three", context_text=["nothing here"]))
    assert result.answer == "3"
    roots = [r.messages for r in oracle.requests("root")]
    assert len(roots) == 3
    assert all([m["role"] for m in r] == ["system", "user"] for r in roots)  # one message, however long the run
    texts = ["\n".join(m["content"] for m in r) for r in roots]
    assert all(t.isascii() for t in texts)  # what the runtime adds keeps the client's ASCII fast paths
    for earlier, later in itertools.pairwise(texts):
        transcript, reminder = earlier.rsplit("\n\nRespond with", 1)
        assert later.startswith(transcript) and len(reminder) < 300  # all but the format reminder: prefix caches hit


async def test_print_and_trailing_value_both_shown(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("show both", ["print('hello from print')\n40 + 2", "SUBMIT('done')"]))
    async with Engine() as engine:
        await engine.run(RunRequest("show both", context_text=["x"]))
    second = json.dumps(oracle.requests("root")[1].messages[-1])
    assert "hello from print" in second and "Out: 42" in second


async def test_batched_subcalls_reach_configured_concurrency(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_CONCURRENCY", "8")
    oracle.state.latency = 0.1
    oracle.add(Scenario("fan out", [
        "answers = llm_query_batched([f'item {i}' for i in range(64)])\nprint(len(answers))",
        "SUBMIT(str(len(answers)))",
    ]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("fan out", context_text=["x"]))
    assert result.answer == "64"
    assert oracle.max_in_flight == 8  # reached, never exceeded
    assert result.llm_calls == 2 + 64


async def test_step_limit_extracts_best_answer(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("never done", ["print('still looking')"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("never done", context_text=["x"], max_iters=2))
        events = engine.events(result.run_id)
    assert result.status == "partial"  # a budget stop's answer never reads as a clean success
    assert result.answer == "extracted"  # the oracle's reply to the extract predictor
    assert result.stop_reason == "step limit of 2 reached"
    assert any(e["kind"] == "warning" and "extracting" in e["data"]["message"] for e in events)


async def test_call_budget_fails_slots_not_the_batch(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("tight budget", [
        "r = llm_query_batched(['a', 'b', 'c', 'd', 'e'])\n"
        "print('errors=%d' % sum(x.startswith('[ERROR]') for x in r))",
        "SUBMIT('ok')",
    ]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("tight budget", context_text=["x"], max_llm_calls=5))
    # 1 root call + 4 sub-calls fit; the fifth slot fails alone, then the next step cannot start.
    assert "errors=1" in json.dumps(oracle.requests("root")[1].messages[-1])
    assert result.stop_reason == "model call limit of 5 reached"
    assert result.answer == "extracted" and result.status == "partial"


@pytest.mark.real_sandbox
async def test_children_run_in_own_repl_and_share_budget(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("delegate", [
        "secret_in_parent = 1\n"
        "r = rlm_query_batched(['child task one', 'child task two'], ['alpha', 'gamma'])\nprint(r)",
        "SUBMIT(' & '.join(r))",
    ]))
    oracle.add(Scenario("child task", [
        "print('secret_in_parent' in globals(), len(context))",
        "SUBMIT(context.upper())",
    ]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("delegate", context_text=["x"]))
        trace = build_trace(engine.events(result.run_id))
    assert result.answer == "ALPHA & GAMMA"
    children = trace["nodes"]["root"]["steps"][0]["children"]
    assert sorted(children) == ["root.1", "root.2"]
    for child in children:
        node = trace["nodes"][child]
        assert node["parent"] == "root" and node["depth"] == 1 and node["status"] == "succeeded"
        assert "False 5" in node["steps"][0]["output"]  # own namespace, own context
    assert result.llm_calls == 2 + 2 * 2  # children's model calls count against the run


async def test_depth_limit_falls_back_to_plain_call(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("too deep", ["r = rlm_query('The secret code is DEEP1')\nSUBMIT(r)"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("too deep", context_text=["x"], max_depth=0))
        events = engine.events(result.run_id)
    assert result.answer == "DEEP1"
    assert any(e["kind"] == "warning" and "max_depth" in e["data"]["message"] for e in events)
    assert not any(e["kind"] == "child.started" for e in events)


async def test_session_keeps_repl_state(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("remember", ["section = context.split()[2]\nSUBMIT(section)"]))
    oracle.add(Scenario("recall", ["SUBMIT(section + ' again, context has ' + str(len(context)))"]))
    async with Engine() as engine:
        sid = await engine.open_session("t")
        first = await engine.run(RunRequest("remember", context_text=["one two three four"], session_id=sid))
        second = await engine.run(RunRequest("recall", session_id=sid))
    assert first.answer == "three"
    assert second.answer == "three again, context has 18"


async def test_user_errors_are_clear_and_create_no_run(
    fleet_env: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with Engine() as engine:
        with pytest.raises(ContextError, match="does not exist"):
            await engine.start_run(RunRequest("q", context_paths=[str(tmp_path / "missing.txt")]))
        with pytest.raises(ValueError, match="question is empty"):
            await engine.start_run(RunRequest("  "))
        assert engine.list_runs() == []
    monkeypatch.delenv("FLEET_LM_MODEL")
    async with Engine(load_settings()) as engine:
        with pytest.raises(ConfigError, match="FLEET_LM_MODEL"):
            await engine.start_run(RunRequest("q"))


async def test_unreachable_model_fails_run_with_fix(fleet_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_LM_API_BASE", "http://127.0.0.1:9/v1")
    async with Engine() as engine:
        with pytest.raises(Unavailable) as info:  # checked before a run exists: nothing recorded
            await engine.run(RunRequest("q", context_text=["x"]))
        assert engine.list_runs() == []
    assert "cannot reach" in info.value.message and "FLEET_LM_API_BASE" in info.value.message


@pytest.mark.real_sandbox
async def test_cancel_stops_sandbox_work(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow", ["import time\ntime.sleep(60)\nSUBMIT('late')"]))
    async with Engine() as engine:
        run_id = await engine.start_run(RunRequest("slow", context_text=["x"]))
        async for event in engine.subscribe(run_id):
            if event["kind"] == "lm.call":
                break
        await asyncio.sleep(0.3)
        assert await engine.cancel(run_id)
        result = await engine.wait(run_id)
        events = engine.events(run_id)
    assert result.status == "cancelled"
    assert events[-1]["kind"] == "run.finished" and events[-1]["data"]["status"] == "cancelled"


@pytest.mark.real_sandbox
async def test_secrets_never_reach_the_store(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("leak", [
        "import os\nprint(sorted(os.environ))\nSUBMIT(os.environ.get('FLEET_LM_API_KEY', 'none'))"
    ]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("leak", context_text=["x"]))
        store_path = engine.settings.store_path
    assert result.answer == "none"
    blob = b"".join(p.read_bytes() for p in store_path.parent.glob("fleet.db*"))
    assert fleet_env["FLEET_LM_API_KEY"].encode() not in blob
    assert all(r.auth == f"Bearer {fleet_env['FLEET_LM_API_KEY']}" for r in oracle.requests())


async def test_volume_is_mounted_and_durable(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("take notes", [
        "import pathlib\np = pathlib.Path(volumes['notes']) / 'memory' / 'finding.md'\n"
        "p.write_text('the answer is 42')\nprint(sorted(volumes))",
        "SUBMIT(open(p).read())",
    ]))
    async with Engine() as engine:
        engine.volumes.ensure("other")
        result = await engine.run(RunRequest("take notes", context_text=["x"], volume="notes"))
        stored = engine.volumes.read_text("notes", "memory/finding.md")
    assert result.answer == "the answer is 42" and stored == "the answer is 42"
    assert "['notes']" in json.dumps(oracle.requests("root")[1].messages[-1])  # only the asked-for volume


async def test_a_new_volume_quota_applies_without_a_restart(fleet_env: dict) -> None:
    async with Engine(load_settings()) as engine:
        engine.volumes.write("notes", "memory/a", b"x" * 2 * 1024 * 1024)  # within the default quota
        engine.apply_settings(load_settings(volume_quota_mb=1))
        with pytest.raises(VolumeError, match="refused"):
            engine.volumes.write("notes", "memory/b", b"x")


async def test_rejected_key_fails_with_the_fix(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.state.fail_next = [401]
    async with Engine() as engine:
        result = await engine.run(RunRequest("q", context_text=["x"]))
    assert result.status == "failed"
    assert "rejected the API key" in result.error and "FLEET_LM_API_KEY" in result.error
    assert fleet_env["FLEET_LM_API_KEY"] not in result.error


async def test_wall_time_budget_stops_and_extracts(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow steps", ["import time\ntime.sleep(1.5)\nprint('partial')"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("slow steps", context_text=["x"], max_seconds=1.0))
    assert result.stop_reason == "wall time limit of 1 s reached"
    assert result.answer == "extracted" and result.iterations == 1 and result.status == "partial"


async def test_folder_context_reports_sources(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("first doc")
    (docs / "sub" / "b.log").write_text("second doc")
    (docs / "blob.bin").write_bytes(b"\x00\x01binary")
    oracle.add(Scenario("which docs", ["SUBMIT(','.join(s['name'] for s in sources))"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("which docs", context_paths=[str(docs)]))
        loaded = next(e for e in engine.events(result.run_id) if e["kind"] == "context.loaded")
    assert result.answer == f"{docs}/a.md,{docs}/sub/b.log"
    assert loaded["data"]["sources"] == 2 and any("blob.bin: binary" in s for s in loaded["data"]["skipped"])


async def test_malformed_reply_costs_a_step_not_the_run(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("sloppy model", ["RAW:I think the answer is probably 4.", "SUBMIT('4')"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("sloppy model", context_text=["x"]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded" and result.answer == "4" and result.iterations == 2
    assert any(e["kind"] == "warning" and "format" in e["data"]["message"] for e in events)
    assert result.llm_calls == 2 and result.usage["total"]["calls"] == 2  # the bad reply was paid for, once
    assert "could not be read" in json.dumps(oracle.requests("root")[-1].messages[-1])


async def test_volume_paths_as_context(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("from volume", ["SUBMIT(sources[0]['name'] + '=' + context)"]))
    async with Engine() as engine:
        engine.volumes.write("notes", "memory/plan.md", "ship it")
        result = await engine.run(RunRequest("from volume", context_paths=["vol:notes/memory"]))
    assert result.answer == "vol:notes/memory/plan.md=ship it"


async def test_cost_is_metered_and_capped(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_MODEL", "openai/gpt-4o-mini")  # LiteLLM knows its price
    oracle.add(Scenario("pricey", ["r = llm_query_batched(['word ' * 20000] * 4)\nprint(len(r))", "SUBMIT('x')"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("pricey", context_text=["x"], max_cost=0.005))
    assert result.usage["total"]["cost"] > 0.005
    assert result.stop_reason == "cost limit of $0.005 reached"
    assert result.iterations == 1 and result.status == "partial"


async def test_session_warns_when_its_repl_was_lost(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("set it", ["v = 7\nSUBMIT(str(v))"]))
    oracle.add(Scenario("get it", ["SUBMIT(str(globals().get('v')))"]))
    async with Engine() as engine:
        first = await engine.run(RunRequest("set it", context_text=["x"], session_id="work"))
    async with Engine() as engine:  # a new process holds the session now
        second = await engine.run(RunRequest("get it", session_id="work"))
        warnings = [e["data"]["message"] for e in engine.events(second.run_id) if e["kind"] == "warning"]
    assert first.answer == "7" and second.answer == "None"
    assert any("REPL state is gone" in w for w in warnings)


@pytest.mark.slow
async def test_transient_errors_are_retried(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_RETRIES", "2")
    oracle.add(Scenario("flaky", ["SUBMIT('made it')"]))
    oracle.state.fail_next = [503, 429]
    async with Engine() as engine:
        result = await engine.run(RunRequest("flaky", context_text=["x"]))
    assert result.answer == "made it"
    assert len(oracle.requests("root")) == 3  # two failures, then the retry that worked


async def test_step_timeout_is_shown_and_the_run_goes_on(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_EXEC_TIMEOUT", "1")
    oracle.add(Scenario("spin", ["n = 1\nwhile True:\n    n += 1", "SUBMIT('recovered, n kept: ' + str(n > 1))"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("spin", context_text=["x"]))
    assert result.answer == "recovered, n kept: True"
    assert "timeout" in json.dumps(oracle.requests("root")[1].messages[-1]).lower()


@pytest.mark.real_sandbox
async def test_crashed_sandbox_fails_the_run_clearly(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("crash", ["import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"]))
    async with Engine() as engine:
        result = await asyncio.wait_for(engine.run(RunRequest("crash", context_text=["x"])), 60)
    assert result.status == "failed"
    assert "sandbox" in result.error.lower() and "signal 9" in result.error


async def test_context_roots_confine_host_paths(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = tmp_path / "shared"
    allowed.mkdir()
    (allowed / "ok.txt").write_text("fine")
    (tmp_path / "private.txt").write_text("secret")
    (allowed / "link.txt").symlink_to(tmp_path / "private.txt")
    monkeypatch.setenv("FLEET_CONTEXT_ROOTS", str(allowed))
    oracle.add(Scenario("read it", ["SUBMIT(context)"]))
    async with Engine() as engine:
        assert (await engine.run(RunRequest("read it", context_paths=[str(allowed / "ok.txt")]))).answer == "fine"
        for outside in (tmp_path / "private.txt", allowed / "link.txt", allowed / ".." / "private.txt"):
            with pytest.raises(ContextError, match="outside FLEET_CONTEXT_ROOTS"):
                await engine.start_run(RunRequest("read it", context_paths=[str(outside)]))
        # A folder inside the roots does not leak what its links point at.
        result = await engine.run(RunRequest("read it", context_paths=[str(allowed)]))
    assert "secret" not in (result.answer or "") and "fine" in result.answer


async def test_reasoning_models_work_with_defaults(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LM_MODEL", "openai/gpt-5-mini")
    oracle.add(Scenario("think", ["SUBMIT('thought')"]))
    async with Engine() as engine:
        assert (await engine.run(RunRequest("think", context_text=["x"]))).answer == "thought"
    monkeypatch.setenv("FLEET_LM_MAX_TOKENS", "4000")
    async with Engine(load_settings()) as engine:
        with pytest.raises(ConfigError, match="FLEET_LM_MAX_TOKENS"):
            await engine.start_run(RunRequest("think", context_text=["x"]))


@pytest.mark.real_sandbox
@pytest.mark.parametrize(("kind", "fix"), [("cloud", "FLEET_SANDBOX=local"), ("daytona", "DAYTONA_API_KEY")])
async def test_unavailable_sandbox_is_refused_not_swapped(
    fleet_env: dict, monkeypatch: pytest.MonkeyPatch, kind: str, fix: str
) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", kind)  # unknown, or Daytona without a key
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    async with Engine(load_settings()) as engine:
        with pytest.raises(ConfigError, match=fix):
            await engine.start_run(RunRequest("q", context_text=["x"]))
        assert engine.list_runs() == []


async def test_the_model_list_is_read_once_however_many_runs_start_at_once(fleet_env: dict, oracle: OracleLM) -> None:
    # Each read is a new HTTP client (with its TLS context, ~20 ms of the event loop's time): a
    # burst of runs on a fresh server, or the run after it (the sub model went unmarked), must not repeat it.
    oracle.add(Scenario("burst", ["SUBMIT('ok')"]))
    async with Engine() as engine:
        first = await asyncio.gather(*(engine.start_run(RunRequest(question=f"burst {i}")) for i in range(8)))
        later = await engine.start_run(RunRequest(question="burst again"))
        results = [await engine.wait(run_id) for run_id in [*first, later]]
    assert [r.answer for r in results] == ["ok"] * 9
    assert oracle.state.models_listed == 1


def test_ids_made_in_the_same_moment_differ_from_their_start() -> None:
    """A person tells runs apart by an id's first characters (`trace r3fa9`), so those are random."""
    from fleet_rlm.core.engine import new_id

    ids = [new_id("r") for _ in range(64)]
    assert len({i[:5] for i in ids}) >= 56  # a time-first id shares its first 8 characters for years
    assert len(set(ids)) == 64


@pytest.mark.real_sandbox
async def test_a_session_whose_sandbox_failed_to_start_gets_a_new_one(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet_rlm.sandbox import local

    oracle.add(Scenario("start over", ["SUBMIT('started')"]))
    local.detect_isolation()  # probed with the real interpreter first (the probe is kept per process)
    real_python = local._python
    monkeypatch.setattr(local, "_python", lambda: "/no/such/python")  # the worker cannot be started
    async with Engine() as engine:
        sid = await engine.open_session()
        failed = await engine.run(RunRequest("start over", context_text=["x"], session_id=sid))
        monkeypatch.setattr(local, "_python", real_python)
        again = await engine.run(RunRequest("start over", context_text=["x"], session_id=sid))
    assert failed.status == "failed" and "sandbox" in (failed.error or ""), failed.error
    assert again.status == "succeeded" and again.answer == "started", again.error
