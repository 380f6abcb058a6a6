"""Prompts steer the model to the run tool with the right arguments and a citation rule;
a wrong call is -32602 with one sentence, never a traceback."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from mcp.types import INVALID_PARAMS

from mcp import Client, MCPError

pytestmark = pytest.mark.anyio


def run_arguments(text: str) -> dict[str, Any]:
    """The JSON block of `run` arguments a prompt embeds."""
    match = re.search(r"\{\n.*?\n\}", text, re.DOTALL)
    assert match, text
    return json.loads(match.group(0))


async def test_prompt_listing(client: Client) -> None:
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == {"analyze_document", "triage_logs", "answer_with_citations", "follow_up"}
    args = {name: [(a.name, a.required) for a in p.arguments or []] for name, p in prompts.items()}
    assert args == {
        "analyze_document": [("path", True), ("question", True)],
        "triage_logs": [("path", True), ("focus", False)],
        "answer_with_citations": [("paths", True), ("question", True)],
        "follow_up": [("session_id", True), ("question", True)],
    }
    assert all(p.description and all(a.description for a in p.arguments or []) for p in prompts.values())


async def test_analyze_document(client: Client) -> None:
    result = await client.get_prompt("analyze_document", {"path": "/data/contract.pdf.txt", "question": "Who signs?"})
    assert len(result.messages) == 1 and result.messages[0].role == "user"
    text = result.messages[0].content.text  # type: ignore[union-attr]
    assert "`run` tool" in text and "Do not open or read the document yourself" in text
    args = run_arguments(text)
    assert args["context_paths"] == ["/data/contract.pdf.txt"]
    assert args["question"].startswith("Who signs?") and "line numbers" in args["question"]
    assert "[file:line]" in text


async def test_triage_logs_default_and_custom_focus(client: Client) -> None:
    default = (await client.get_prompt("triage_logs", {"path": "/var/log/app"})).messages[0].content.text  # type: ignore[union-attr]
    assert "errors, crashes and anomalies" in run_arguments(default)["question"]
    custom = await client.get_prompt("triage_logs", {"path": "/var/log/app", "focus": "timeouts after 14:00"})
    args = run_arguments(custom.messages[0].content.text)  # type: ignore[union-attr]
    assert args["context_paths"] == ["/var/log/app"] and "timeouts after 14:00" in args["question"]


async def test_answer_with_citations_splits_paths(client: Client) -> None:
    result = await client.get_prompt(
        "answer_with_citations", {"paths": "/a/one.md, /b/two.md\n/c/three.md\n", "question": "What changed?"}
    )
    text = result.messages[0].content.text  # type: ignore[union-attr]
    args = run_arguments(text)
    assert args["context_paths"] == ["/a/one.md", "/b/two.md", "/c/three.md"]
    assert "source file and line number" in args["question"] and "3 file(s)" in text


async def test_follow_up_continues_the_session(client: Client) -> None:
    result = await client.get_prompt("follow_up", {"session_id": "s-incident", "question": "And the second outage?"})
    text = result.messages[0].content.text  # type: ignore[union-attr]
    assert run_arguments(text) == {"question": "And the second outage?", "session_id": "s-incident"}
    assert "do not pass the files again" in text


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("no_such_prompt", {}, "unknown prompt 'no_such_prompt': this server has analyze_document, "),
        ("analyze_document", {"path": "/a.txt"}, "prompt 'analyze_document': missing required argument(s) question"),
        ("triage_logs", {"path": "/l", "colour": "red"}, "prompt 'triage_logs': unknown argument(s) colour"),
    ],
)
async def test_wrong_prompt_calls_are_invalid_params(
    client: Client, caplog: pytest.LogCaptureFixture, name: str, arguments: dict[str, str], message: str
) -> None:
    with caplog.at_level(logging.DEBUG), pytest.raises(MCPError) as raised:
        await client.get_prompt(name, arguments)
    assert raised.value.error.code == INVALID_PARAMS
    assert raised.value.error.message.startswith(message)
    # The caller's mistake is not the server's error: nothing logged with a traceback.
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
