"""Prompts: ready-made requests that steer the model to call ``run`` with the right arguments."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

if TYPE_CHECKING:
    from mcp.server import MCPServer

CITE = (
    "Ask the run to quote the exact lines it relies on, with the file name and line number or "
    "section for each quote, and keep those citations in your reply as [file:line] after each claim. "
    "If the run's answer is unsure or has no quote for a claim, say so rather than guessing; you can "
    "check how it found the answer with inspect_trace(run_id)."
)


def split_paths(paths: str) -> list[str]:
    """Prompt arguments are strings: accept paths one per line or separated by commas."""
    return [p.strip() for p in re.split(r"[\n,]", paths) if p.strip()]


def _call(question: str, paths: list[str]) -> str:
    return json.dumps({"question": question, "context_paths": paths}, ensure_ascii=False, indent=2)


def register(server: MCPServer[Any]) -> None:
    @server.prompt(title="Analyze a document", description="Answer a question about one large document.")
    def analyze_document(
        path: Annotated[str, Field(description="Absolute path of the document (or vol:<volume>/<path>).")],
        question: Annotated[str, Field(description="What you want to know about it.")],
    ) -> str:
        q = f"{question.strip()}\nQuote the passages that support the answer, with their line numbers."
        return (
            f"Answer this question about the document at {path}:\n\n{question.strip()}\n\n"
            "Do not open or read the document yourself: it may be far larger than your context. "
            "Call the fleet-rlm `run` tool with these arguments:\n\n"
            f"{_call(q, [path])}\n\n{CITE}"
        )

    @server.prompt(title="Triage logs", description="Find what went wrong in a large log file or folder.")
    def triage_logs(
        path: Annotated[str, Field(description="Absolute path of the log file or folder of logs.")],
        focus: Annotated[
            str, Field(description="What to look for, e.g. 'the first error after the deploy'.")
        ] = "errors, crashes and anomalies",
    ) -> str:
        q = (
            f"Triage these logs, focusing on: {focus.strip()}. Group related entries, give each group's "
            "first and last timestamp and count, the most likely root cause, and quote the key log "
            "lines with file and line number."
        )
        return (
            f"Triage the logs at {path} (focus: {focus.strip()}).\n\n"
            "Logs are usually too big to read directly. Call the fleet-rlm `run` tool with:\n\n"
            f"{_call(q, [path])}\n\n"
            "Then summarise: what happened, when, the likely cause, and what to check next. " + CITE
        )

    @server.prompt(title="Answer with citations", description="Answer a question from several files, citing each.")
    def answer_with_citations(
        paths: Annotated[str, Field(description="Absolute paths, one per line or comma-separated.")],
        question: Annotated[str, Field(description="The question to answer from those files.")],
    ) -> str:
        files = split_paths(paths)
        q = (
            f"{question.strip()}\nAnswer only from the given files. For every claim, quote the "
            "supporting text and give its source file and line number."
        )
        return (
            f"Answer from these {len(files)} file(s) only: {', '.join(files)}\n\n"
            f"Question: {question.strip()}\n\n"
            "Call the fleet-rlm `run` tool (it reads the files in a sandbox, so their size does not "
            f"matter) with:\n\n{_call(q, files)}\n\n{CITE}"
        )
