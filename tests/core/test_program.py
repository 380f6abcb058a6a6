"""The program's pieces that need no model: code extraction, output capping, prompt rendering."""

from __future__ import annotations

import dspy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_rlm.core.program import (
    RLMAction,
    RLMProgram,
    RootPredict,
    Step,
    TranscriptAdapter,
    extract_code,
    render_step,
    render_transcript,
)
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
