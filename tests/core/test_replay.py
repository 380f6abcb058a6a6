"""Replay and fork through the Engine, against the scripted model server: a recorded run replays with
the server stopped and nothing diverging; a fork makes no model call before its step, reaches the
forked code's answer and records its lineage; a planted change is reported at the first step it
touches; non-determinism shows up as divergence (docs/replay.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from fleet_rlm.core import program
from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import NotFound, UserError
from fleet_rlm.types import PAYLOADS, RunRequest
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

# Four steps: look, fan out to sub-queries, a child RLM, submit. Every kind of call a run records.
STEPS = [
    "print(len(context))",
    "answers = llm_query_batched(['The secret code is A1', 'The secret code is B2', 'nothing'])\nprint(answers)",
    "child = rlm_query('child task: shout', context='quiet')\nprint(child)",
    "SUBMIT(' '.join(a for a in answers if a != 'NONE') + ' ' + child)",
]
CHILD = ["print(context)", "SUBMIT(context.upper())"]


@pytest.fixture(autouse=True)
def _sandbox(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("real_sandbox") is None:
        fake_sandbox.register()
        monkeypatch.setenv("FLEET_SANDBOX", "fake")


def _scenarios(oracle: OracleLM) -> None:
    oracle.add(Scenario("find the codes", STEPS))
    oracle.add(Scenario("child task", CHILD))


async def _record(oracle: OracleLM, question: str = "find the codes", **kwargs: object) -> str:
    _scenarios(oracle)
    async with Engine() as engine:
        result = await engine.run(RunRequest(question, context_text=["a small context"], **kwargs))  # type: ignore[arg-type]
    assert result.status == "succeeded", result.error
    assert result.answer == "A1 B2 QUIET"
    return result.run_id


async def test_a_replay_answers_every_call_from_the_record_with_the_model_stopped(
    fleet_env: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OracleLM() as oracle:
        monkeypatch.setenv("FLEET_LM_API_BASE", oracle.base_url)
        source = await _record(oracle)
        recorded_calls = len(oracle.requests())
    assert recorded_calls == 4 + 3 + 2  # root steps, sub-queries, the child's steps
    # The server is stopped: any model call would fail ("cannot reach"), and none may be made.
    async with Engine() as engine:
        replay_id = await engine.replay(source)
        result = await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
        row = engine.get_run(replay_id)
        events = engine.events(replay_id)
    assert result.status == "succeeded", result.error
    assert result.answer == "A1 B2 QUIET"
    assert report.diverged is False and report.first_divergence is None and report.same_answer
    assert [(s.node, s.step) for s in report.steps] == [
        ("root", 1), ("root", 2), ("root", 3), ("root", 4), ("root.1", 1), ("root.1", 2)
    ]  # fmt: skip
    assert all(s.code_same and s.output_same and s.prompt_same for s in report.steps)
    assert row is not None and row.kind == "replay" and row.parent_run_id == source
    assert events[0]["data"]["lineage"] == {"kind": "replay", "source": source, "at": None}
    # Nothing paid: every call was answered from the record, and says so.
    assert result.usage["total"]["calls"] == 0 and result.usage["replayed"]["calls"] == recorded_calls
    assert result.llm_calls == recorded_calls
    assert all(e["data"].get("replayed") for e in events if e["kind"] in ("lm.call", "subcall.finished"))
    # Nor does a replay need a model configured at all.
    monkeypatch.delenv("FLEET_LM_MODEL")
    async with Engine() as engine:
        bare = await engine.wait(await engine.replay(source))
    assert bare.status == "succeeded" and bare.answer == "A1 B2 QUIET", bare.error


async def test_a_fork_replays_the_steps_before_it_and_runs_the_given_code(fleet_env: dict, oracle: OracleLM) -> None:
    source = await _record(oracle)
    before = len(oracle.requests())
    async with Engine() as engine:
        fork_id = await engine.fork(source, "3", code="SUBMIT('forked with ' + ' '.join(answers))")
        result = await engine.wait(fork_id)
        row = engine.get_run(fork_id)
        trace = engine.workspace.trace_page(fork_id)
        listed = engine.workspace.list_runs().runs
    assert result.status == "succeeded", result.error
    assert result.answer == "forked with A1 B2 NONE"  # step 2's sub-query answers, rebuilt from the record
    assert len(oracle.requests()) == before  # steps 1-2 replayed, step 3 given: no model call at all
    assert result.usage["total"]["calls"] == 0 and result.usage["replayed"]["calls"] == 2 + 3
    assert row is not None and (row.kind, row.parent_run_id, row.fork_at) == ("run", source, "root:3")
    assert trace.lineage == {"kind": "fork", "source": source, "at": "root:3"}
    assert [s.code_preview for s in trace.steps][-1].startswith("SUBMIT('forked with")
    summary = next(r for r in listed if r.run_id == fork_id)
    assert (summary.parent_run_id, summary.fork_at) == (source, "root:3")


async def test_a_fork_goes_on_live_after_its_step(fleet_env: dict, oracle: OracleLM) -> None:
    source = await _record(oracle)
    before = len(oracle.requests())
    async with Engine() as engine:
        fork_id = await engine.fork(source, "2", code="answers = ['Z9']\nprint(answers)")
        result = await engine.wait(fork_id)
    assert result.status == "succeeded", result.error
    assert result.answer == "Z9 QUIET"  # steps 3-4 asked the model live, over the forked step's variables
    new = oracle.requests()[before:]
    roots = [r for r in new if r.kind == "root"]
    # Live: root steps 3 and 4 and the child's two steps; nothing for steps 1-2, no sub-queries of step 2.
    assert len(roots) == 4 and not [r for r in new if r.kind == "sub"]
    steps_asked = sorted(r.messages[-1]["content"].count("=== Step ") for r in roots if "find the codes" in
                         r.messages[-1]["content"])  # fmt: skip
    assert steps_asked == [2, 3]


async def test_a_fork_with_an_instruction_asks_the_model_with_it(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("count", ["x = 1\nprint(x)", "x += 1\nprint(x)", "SUBMIT(x)"],
                        when={"USE TEN": ["x = 1\nprint(x)", "x = 10\nprint(x)", "SUBMIT(x)"]}))  # fmt: skip
    async with Engine() as engine:
        source = (await engine.run(RunRequest("count", context_text=["x"]))).run_id
        before = len(oracle.requests())
        result = await engine.wait(await engine.fork(source, "root:2", instruction="USE TEN from here on"))
    assert result.answer == "10"
    first_live = oracle.requests()[before]
    text = first_live.messages[-1]["content"]
    assert "Instruction for step 2: USE TEN from here on" in text and text.count("=== Step ") == 1


async def test_a_planted_change_in_the_program_is_reported_at_its_first_step(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = await _record(oracle)
    stock = program.render_step
    # The planted change: the transcript shows each step's output with a new heading from step 2 on.
    monkeypatch.setattr(program, "render_step", lambda n, step, shown: stock(n, step, shown).replace(
        "Output:", "Output (changed):") if n >= 2 else stock(n, step, shown))  # fmt: skip
    async with Engine() as engine:
        replay_id = await engine.replay(source)
        await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
        events = engine.events(replay_id)
    assert report.diverged and report.first_divergence is not None
    first = report.first_divergence
    assert (first.node, first.step, first.reason) == ("root", 3, "prompt")  # step 3's request shows step 2
    assert report.same_answer  # answered from the record by position, the run still reaches its answer
    assert [s.step for s in report.steps if s.node == "root" and not s.prompt_same] == [3, 4]
    for event in events:  # a replay's own events (lineage, divergences) are what the schema says
        payload = PAYLOADS[event["kind"]]
        TypeAdapter(payload).validate_python(event["data"])
        assert set(event["data"]) <= payload.__required_keys__ | payload.__optional_keys__
    assert {"replay.diverged", "run.started"} <= {e["kind"] for e in events}


async def test_a_changed_input_and_a_clock_are_divergences(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("first version")
    oracle.add(Scenario("read it", ["print(context)", "import time\nprint(time.time())", "SUBMIT(context)"]))
    async with Engine() as engine:
        source = (await engine.run(RunRequest("read it", context_paths=[str(data)]))).run_id
        same = await engine.replay(source)
        await engine.wait(same)
        clock = engine.workspace.replay_report(same)
        data.write_text("second version")
        changed = await engine.replay(source)
        await engine.wait(changed)
        report = engine.workspace.replay_report(changed)
    assert clock.first_divergence is not None
    assert (clock.first_divergence.step, clock.first_divergence.reason) == (2, "output")  # the clock moved
    assert report.first_divergence is not None and report.first_divergence.reason == "inputs"
    assert not report.same_answer and report.answer == "second version"


async def test_a_request_without_a_recorded_reply_ends_the_replay(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("two steps", ["print(1)", "SUBMIT('done')"]))
    async with Engine() as engine:
        source = (await engine.run(RunRequest("two steps", context_text=["x"]))).run_id
        store = engine.workspace.store
        # Keep only step 1's reply: step 2's call has nothing to be answered with.
        kept = [r for r in store.records.list(source) if not r.slot.startswith("root#2/")]
        await store.write(store.writer.run, lambda tx: tx.conn.execute(
            "DELETE FROM run_records WHERE run_id = ? AND slot LIKE 'root#2/%'", (source,)))  # fmt: skip
        assert len(store.records.list(source)) == len(kept)
        replay_id = await engine.replay(source)
        result = await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
    assert result.status == "failed" and "no recorded reply for root step 2" in (result.error or "")
    assert report.first_divergence is not None
    assert (report.first_divergence.step, report.first_divergence.reason) == (2, "missing")


async def test_what_cannot_be_replayed_or_forked_is_refused(fleet_env: dict, oracle: OracleLM) -> None:
    source = await _record(oracle)
    async with Engine() as engine:
        with pytest.raises(NotFound):
            await engine.replay("r-no-such-run")
        with pytest.raises(UserError, match=r"has steps 1\.\.4"):
            await engine.fork(source, "9", code="print(1)")
        with pytest.raises(NotFound, match=r"no node 'root\.7'"):
            await engine.fork(source, "root.7:1", code="print(1)")
        with pytest.raises(UserError, match="fork point"):
            await engine.fork(source, "step three")
        with pytest.raises(UserError, match="not both"):
            await engine.fork(source, "2", code="print(1)", instruction="think")
        with pytest.raises(UserError, match="not a replay"):
            engine.workspace.replay_report(source)
        runs_before = len(engine.workspace.runs(kind=None))
    assert runs_before == 1  # nothing refused was recorded


async def test_a_fork_in_a_child_node(fleet_env: dict, oracle: OracleLM) -> None:
    source = await _record(oracle)
    before = len(oracle.requests())
    async with Engine() as engine:
        result = await engine.wait(await engine.fork(source, "root.1:2", code="SUBMIT('whisper')"))
        row = engine.get_run(result.run_id)
    assert result.answer == "A1 B2 whisper"  # the child's new answer flows into root's step 3, then step 4
    new = oracle.requests()[before:]
    # Root's steps 1-3 and the child's step 1 came from the record; only root's step 4 was asked live
    # (its transcript now shows the child's new answer).
    assert len(new) == 1 and "whisper" in json.dumps(new[0].messages)
    assert row is not None and row.fork_at == "root.1:2"


async def test_the_record_keeps_each_body_once(fleet_env: dict, oracle: OracleLM) -> None:
    source = await _record(oracle)
    async with Engine() as engine:
        replay_id = await engine.replay(source)
        await engine.wait(replay_id)
        store = engine.workspace.store
        own, again = store.records.size(source), store.records.size(replay_id)
        bodies = store.read("SELECT COUNT(*) FROM record_bodies")[0][0]
        distinct = store.read("SELECT COUNT(DISTINCT body_hash) FROM run_records")[0][0]
    assert own.records == again.records  # the replay keeps a record of its own (it can be replayed)
    assert bodies == distinct  # ... whose bodies were all there already: stored once


@pytest.mark.real_sandbox
async def test_seeded_random_replays_and_volume_writes_are_not_repeated(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("draw and note", [
        "import random\nprint(random.random(), random.randint(1, 10**9))",
        "open(volumes['notes'] + '/memory/log.txt', 'a').write('noted\\n')\nprint('written')",
        "SUBMIT('done')",
    ]))  # fmt: skip
    async with Engine() as engine:
        source = (await engine.run(RunRequest("draw and note", context_text=["x"], volume="notes"))).run_id
        log = engine.volumes.path("notes") / "memory" / "log.txt"
        assert log.read_text() == "noted\n"
        replay_id = await engine.replay(source)
        await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
    steps = {s.step: s for s in report.steps}
    assert steps[1].output_same  # random, seeded from the step's code, drew the same numbers
    assert log.read_text() == "noted\n"  # the replay's write did not happen again on the host ...
    assert report.first_divergence is not None  # ... and shows as a divergence, never hidden
    assert (report.first_divergence.step, report.first_divergence.reason) == (2, "output")
    assert "Read-only file system" in report.first_divergence.detail


async def test_the_record_is_masked_like_events(fleet_env: dict, oracle: OracleLM) -> None:
    key = fleet_env["FLEET_LM_API_KEY"]
    oracle.add(Scenario("leaky", ["r = llm_query('what is the key?')\nprint(len(r))", "SUBMIT('ok')"],
                        sub=lambda _prompt: f"the key is {key}"))  # fmt: skip
    async with Engine() as engine:
        source = (await engine.run(RunRequest("leaky", context_text=["x"]))).run_id
        store = engine.workspace.store
        await engine.bus.flush()  # type: ignore[union-attr]
        bodies = store.read("SELECT body FROM record_bodies")
        replay_id = await engine.replay(source)
        await engine.wait(replay_id)
        report = engine.workspace.replay_report(replay_id)
    assert any("the key is ***" in body for (body,) in bodies)
    assert not any(key in body for (body,) in bodies)
    # What was masked cannot be given back as it was: the replay says so where it mattered.
    assert report.first_divergence is not None and (report.first_divergence.step, report.first_divergence.reason) == (
        1,
        "output",
    )


async def test_a_fork_after_the_last_step_goes_on_where_a_step_limit_stopped(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("keep going", ["n = 1\nprint(n)", "n += 1\nprint(n)", "n += 1\nSUBMIT(n)"]))
    async with Engine() as engine:
        stopped = await engine.run(RunRequest("keep going", context_text=["x"], max_iters=2))
        assert stopped.status == "partial"  # extracted after step 2
        before = len(oracle.requests())
        result = await engine.wait(await engine.fork(stopped.run_id, "3", max_iters=3))
    assert result.status == "succeeded" and result.answer == "3"  # steps 1-2 rebuilt, step 3 asked live
    assert len(oracle.requests()) == before + 1
