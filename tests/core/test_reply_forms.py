"""Models that stray from the field headers, through the program: every unambiguous form of a reply
is read without another model call, for the act step, the extraction and child RLMs alike, and
each run counts the forms its replies came in (usage and trace)."""

from __future__ import annotations

import json

import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.core.trace import build_trace
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

COUNT = ["x = 1\nprint(x)", "x += 1\nprint(x)", "x += 1\nSUBMIT(x)"]
# The oracle's reply style -> the form the runtime reads it as.
FORMS = {
    "fields": "fields",
    "fields_unclosed": "fields_unclosed",
    "json": "json",
    "json_fenced": "json",
    "prose_code": "prose_code",
    "xml": "xml",
}


async def _run(req: RunRequest) -> tuple[object, dict]:
    async with Engine() as engine:
        result = await engine.run(req)
        trace = build_trace(engine.events(result.run_id))
    return result, trace


@pytest.mark.parametrize("style", list(FORMS))
async def test_each_reply_form_answers_in_as_many_steps_as_headers(
    fleet_env: dict, oracle: OracleLM, style: str
) -> None:
    oracle.add(Scenario("count to three", COUNT, style=style))
    result, trace = await _run(RunRequest("count to three", context_text=["x"]))
    assert result.status == "succeeded" and result.answer == "3", result.error
    assert result.iterations == len(COUNT)
    assert len(oracle.requests("root")) == len(COUNT)  # no second call to repair a reply
    assert result.usage["reply_forms"] == {FORMS[style]: len(COUNT)}
    assert trace["run"]["usage"]["reply_forms"] == {FORMS[style]: len(COUNT)}
    assert [s["lm"]["reply_form"] for s in trace["nodes"]["root"]["steps"]] == [FORMS[style]] * len(COUNT)


async def test_an_ambiguous_reply_costs_a_step_with_format_help(fleet_env: dict, oracle: OracleLM) -> None:
    two_blocks = "RAW:Try this:\n```python\nprint(1)\n```\nor this:\n```python\nprint(2)\n```"
    oracle.add(Scenario("pick one", [two_blocks, "SUBMIT('done')"]))
    result, _ = await _run(RunRequest("pick one", context_text=["x"]))
    assert result.answer == "done" and result.iterations == 2
    assert result.usage["reply_forms"] == {"unreadable": 1, "fields": 1}
    assert "could not be read" in json.dumps(oracle.requests("root")[-1].messages[-1])


@pytest.mark.parametrize(("style", "forms"), [
    ("json", {"json": 2}),
    ("xml", {"xml": 2}),
    ("prose_code", {"prose_code": 1, "plain_text": 1}),
])  # fmt: skip
async def test_the_extraction_reads_each_form(fleet_env: dict, oracle: OracleLM, style: str, forms: dict) -> None:
    oracle.add(Scenario("never submits", ["print('still looking')"], style=style))
    result, _ = await _run(RunRequest("never submits", context_text=["x"], max_iters=1))
    assert result.answer == "extracted", result.error  # the step limit ran out; the extraction answered
    assert result.usage["reply_forms"] == forms
    assert len(oracle.requests("root")) == 2


async def test_a_child_rlm_reads_json_replies(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("ask a child", ["a = rlm_query('child task: say hi')\nprint(a)", "SUBMIT('root got ' + a)"]))
    oracle.add(Scenario("child task", ["SUBMIT('hi')"], style="json"))
    result, trace = await _run(RunRequest("ask a child", context_text=["x"]))
    assert result.answer == "root got hi", result.error
    assert result.usage["reply_forms"] == {"fields": 2, "json": 1}
    assert [s["lm"]["reply_form"] for s in trace["nodes"]["root.1"]["steps"]] == ["json"]
