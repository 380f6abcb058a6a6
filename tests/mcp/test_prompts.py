"""Prompts steer the model to the run tool with the right arguments and a citation rule."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from mcp import Client

pytestmark = pytest.mark.anyio


def run_arguments(text: str) -> dict[str, Any]:
    """The JSON block of `run` arguments a prompt embeds."""
    match = re.search(r"\{\n.*?\n\}", text, re.DOTALL)
    assert match, text
    return json.loads(match.group(0))


async def test_prompt_listing(client: Client) -> None:
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == {"analyze_document", "triage_logs", "answer_with_citations"}
    args = {name: [(a.name, a.required) for a in p.arguments or []] for name, p in prompts.items()}
    assert args == {
        "analyze_document": [("path", True), ("question", True)],
        "triage_logs": [("path", True), ("focus", False)],
        "answer_with_citations": [("paths", True), ("question", True)],
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
