"""The program's pieces that need no model: code extraction, output capping, prompt rendering, and
reading replies in each form a model may write."""

from __future__ import annotations

import json

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError
from hypothesis import given
from hypothesis import strategies as st

from fleet_rlm.core.program import (
    RLMAction,
    RLMExtract,
    RLMProgram,
    RootPredict,
    Step,
    TranscriptAdapter,
    extract_code,
    render_step,
    render_transcript,
)
from fleet_rlm.core.replies import noting_reply_forms
from fleet_rlm.sandbox.base import cap_middle


def test_extract_code_fences() -> None:
    assert extract_code("```python\nx = 1\n```") == "x = 1"
    assert extract_code("first\n```py\na = 1\n```\nthen\n```\nb = 2\n```") == "a = 1\nb = 2"
    assert extract_code("print(1)") == "print(1)"
    with pytest.raises(SyntaxError, match="bash"):
        extract_code("```bash\nls\n```")


@given(st.text(max_size=500), st.integers(min_value=20, max_value=200))
def test_cap_middle_keeps_head_and_tail(text: str, limit: int) -> None:
    capped = cap_middle(text, limit)
    if len(text) <= limit:
        assert capped == text
    else:
        half = limit // 2
        assert capped.startswith(text[:half]) and capped.endswith(text[-half:])
        assert f"[{len(text) - 2 * half:,} characters omitted]" in capped


def test_predictors_are_tunable() -> None:
    names = [name for name, _ in RLMProgram().named_predictors()]
    assert names == ["act", "extract"]


def test_transcript_adapter_renders_like_chat_adapter() -> None:
    cached = TranscriptAdapter()
    for n in range(1, 4):  # the same adapter over a growing transcript, as in a run
        inputs = {"transcript": "task" + "".join(render_step(i, Step("o", "r", "c"), "out") for i in range(n))}
        expected = dspy.ChatAdapter().format(RLMAction, [], dict(inputs))
        assert cached.format(RLMAction, [], dict(inputs)) == expected
        assert [m["role"] for m in expected] == ["system", "user"]  # one message, however long the run


def test_transcript_only_grows() -> None:
    """Each step's transcript extends the last one, as the loop builds it step by step."""
    steps = [Step(f"out {i}", f"why {i}", f"```python\nx = {i}\n```") for i in range(5)]
    built = steps[0].observation
    for n in range(1, 5):
        later = render_transcript(steps[:n], steps[n].observation)
        assert later.startswith(render_transcript(steps[: n - 1], steps[n - 1].observation))
        built += render_step(n, steps[n - 1], steps[n].observation)
        assert later == built
    assert built.count("=== Step ") == 4 and "why 3" in built and "out 4" in built


def test_a_version_made_for_another_prompt_layout_is_refused() -> None:
    state = RLMProgram().dump_state()
    state["act"]["signature"]["fields"].insert(0, {"prefix": "History:", "description": "Earlier steps."})
    with pytest.raises(ValueError, match="earlier prompt layout"):
        RLMProgram().load_state(state)
    assert RLMProgram().load_state(RLMProgram().dump_state())  # the current layout loads


@pytest.mark.anyio
async def test_root_predict_runs_in_a_thread_with_the_callers_settings() -> None:
    """The synchronous model path runs off the event loop, with dspy.context's LM and adapter."""
    lm = dspy.utils.DummyLM([{"reasoning": "look first", "code": "print(len(context))"}])
    adapter = TranscriptAdapter()
    with dspy.context(lm=lm, adapter=adapter):
        prediction = await RootPredict(RLMAction).acall(transcript="start")
    assert prediction.code == "print(len(context))"
    assert adapter._system  # the run's adapter built the prompt, in the worker thread


# -- replies that stray from the field headers ------------------------------------------------------

HEADERS = "[[ ## reasoning ## ]]\nLook first.\n\n[[ ## code ## ]]\n```python\nprint(1)\n```\n\n[[ ## completed ## ]]"


def _read(signature: type[dspy.Signature], reply: str) -> tuple[dict, list[str]]:
    with noting_reply_forms() as forms:
        return TranscriptAdapter().parse(signature, reply), forms


@pytest.mark.parametrize(
    ("reply", "form"),
    [
        (HEADERS, "fields"),
        (HEADERS.removesuffix("\n\n[[ ## completed ## ]]"), "fields_unclosed"),
        ('{"reasoning": "Look first.", "code": "```python\\nprint(1)\\n```"}', "json"),
        ('```json\n{"reasoning": "Look first.", "code": "print(1)"}\n```\nAnything else?', "json"),
        ("Look first.\n\n```python\nprint(1)\n```", "prose_code"),
        ("Look first.\n```\nprint(1)\n```\nThe output will tell.", "prose_code"),
        ("Look first.\n```python\nprint(1)\n```\nAgain:\n```python\nprint(1)\n```", "prose_code"),  # one block, twice
        ("[[ ## reasoning ## ]]\nLook first.\n```py\nprint(1)\n```", "prose_code"),  # the code header left out
        ("<reasoning>Look first.</reasoning>\n<code>\n```python\nprint(1)\n```\n</code>", "xml"),
    ],
)
def test_each_unambiguous_act_reply_is_read_without_another_call(reply: str, form: str) -> None:
    fields, forms = _read(RLMAction, reply)
    assert extract_code(fields["code"]) == "print(1)"
    assert fields["reasoning"].startswith("Look first.") and "[[" not in fields["reasoning"]
    assert forms == [form]


@pytest.mark.parametrize(
    "reply",
    [
        "Try this:\n```python\nprint(1)\n```\nor this:\n```python\nprint(2)\n```",  # two different blocks
        "I think the answer is probably 4.",  # no code at all
        '{"reasoning": "Look first."}',  # JSON without the code field
        "Look first.\n```bash\nls\n```",  # no Python block
    ],
)
def test_ambiguous_act_replies_are_refused_for_format_help(reply: str) -> None:
    with noting_reply_forms() as forms, pytest.raises(AdapterParseError):
        TranscriptAdapter().parse(RLMAction, reply)
    assert forms == ["unreadable"]


def test_the_header_form_is_tried_first() -> None:
    """Headers whose reasoning quotes JSON and tags are read as headers: the common path stays cheap."""
    quoting = HEADERS.replace("Look first.", 'Look first. Not {"reasoning": "x", "code": "y"} nor <code>z</code>.')
    fields, forms = _read(RLMAction, quoting)
    assert forms == ["fields"] and extract_code(fields["code"]) == "print(1)"


@pytest.mark.parametrize(
    ("reply", "form"),
    [
        ("[[ ## answer ## ]]\nforty-two\n\n[[ ## completed ## ]]", "fields"),
        ('{"answer": "forty-two"}', "json"),
        ('```json\n{"answer": "forty-two"}\n```', "json"),
        ("<answer>forty-two</answer>", "xml"),
        ("forty-two", "plain_text"),
    ],
)
def test_each_extract_reply_form_is_read(reply: str, form: str) -> None:
    fields, forms = _read(RLMExtract, reply)
    assert fields == {"answer": "forty-two"} and forms == [form]


def test_json_values_of_text_fields_stay_json() -> None:
    fields, _ = _read(RLMExtract, '{"answer": {"total": 3, "names": ["a"]}}')
    assert json.loads(fields["answer"]) == {"total": 3, "names": ["a"]}
