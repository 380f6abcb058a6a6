"""A conversation's title, derived from its first message by every face: a readable cut at a word boundary,
the words of a JSON message rather than its braces, keys and quotes."""

from __future__ import annotations

import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.core.engine import Engine

pytestmark = pytest.mark.anyio

JSON_MESSAGE = '{"request": "compare the error rates in last week\'s logs against the baseline", "format": "table"}'
PROSE = "Summarise the incident reports from the storage cluster and list every root cause that repeats"


async def test_a_json_first_message_titles_its_conversation_with_its_words(engine: Engine) -> None:
    conv = await AgentHost.of(engine).create_conversation(JSON_MESSAGE)
    assert conv.title == "compare the error rates in last week's logs against the…"
    assert AgentHost.of(engine).list_conversations().conversations[0].title == conv.title  # as stored


async def test_a_long_message_is_cut_at_a_word_boundary(engine: Engine) -> None:
    conv = await AgentHost.of(engine).create_conversation(PROSE + "\n\n" + "x" * 500)
    assert conv.title == "Summarise the incident reports from the storage cluster and…"


async def test_a_short_title_stays_as_given(engine: Engine) -> None:
    conv = await AgentHost.of(engine).create_conversation("  birds\n")
    assert conv.title == "birds"
