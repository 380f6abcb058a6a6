"""The program's pieces that need no model: code extraction, output capping, prompt rendering."""

from __future__ import annotations

import dspy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_rlm.core.program import RLMAction, RLMProgram, RootPredict, TranscriptAdapter, extract_code
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
    turns = [{"observation": f"out {i}", "reasoning": f"why {i}", "code": f"x = {i}"} for i in range(5)]
    cached = TranscriptAdapter()
    for n in range(1, 6):  # the same adapter over a growing transcript, as in a run
        inputs = {"observation": "now", "history": dspy.History(messages=turns[:n])}
        expected = dspy.ChatAdapter().format(RLMAction, [], dict(inputs))
        assert cached.format(RLMAction, [], dict(inputs)) == expected


@pytest.mark.anyio
async def test_root_predict_runs_in_a_thread_with_the_callers_settings() -> None:
    """The synchronous model path runs off the event loop, with dspy.context's LM and adapter."""
    lm = dspy.utils.DummyLM([{"reasoning": "look first", "code": "print(len(context))"}])
    adapter = TranscriptAdapter()
    with dspy.context(lm=lm, adapter=adapter):
        prediction = await RootPredict(RLMAction).acall(observation="start", history=dspy.History(messages=[]))
    assert prediction.code == "print(len(context))"
    assert adapter._system  # the run's adapter built the prompt, in the worker thread
