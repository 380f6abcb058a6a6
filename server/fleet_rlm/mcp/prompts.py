"""Prompts: ready-made requests that steer the model to call ``run`` with the right arguments.

``prompts/get`` for an unknown prompt, a missing required argument or an argument the prompt
does not take is answered with JSON-RPC -32602 (invalid params) and one sentence naming what
is wrong, in both protocol eras; the SDK alone would answer code 0 or -32603 and log a
traceback for what is the caller's mistake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from mcp.types import INVALID_PARAMS
from pydantic import Field

from mcp import MCPError

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

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


async def prompt_arguments(server: MCPServer[Any], name: Any) -> dict[str, bool]:
    """The arguments of prompt ``name`` (name -> required); -32602 when there is no such prompt."""
    prompts = {p.name: p for p in await server.list_prompts()}
    prompt = prompts.get(name) if isinstance(name, str) else None
    if prompt is None:
        raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}: this server has {', '.join(sorted(prompts))}")
    return {a.name: bool(a.required) for a in prompt.arguments or []}


Middleware = Callable[["ServerRequestContext[Any, Any]", "CallNext"], Awaitable["HandlerResult"]]


def _checker(server: MCPServer[Any]) -> Middleware:
    async def check_prompt_call(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "prompts/get" and ctx.request_id is not None:
            params = ctx.params if isinstance(ctx.params, Mapping) else {}
            name = params.get("name")
            takes = await prompt_arguments(server, name)
            given = params.get("arguments") or {}
            if not isinstance(given, Mapping):
                raise MCPError(INVALID_PARAMS, f"prompt {name!r}: arguments must be an object of strings")
            missing = [a for a, required in takes.items() if required and a not in given]
            unknown = [a for a in given if a not in takes]
            if missing or unknown:
                problems = [f"missing required argument(s) {', '.join(missing)}"] if missing else []
                problems += [f"unknown argument(s) {', '.join(unknown)}"] if unknown else []
                raise MCPError(
                    INVALID_PARAMS, f"prompt {name!r}: {'; '.join(problems)} (it takes {', '.join(takes) or 'none'})"
                )
        return await call_next(ctx)

    return check_prompt_call


def register(server: MCPServer[Any]) -> None:
    server.middleware.append(_checker(server))

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

    @server.prompt(
        title="Follow up in a session", description="Ask a follow-up question in the REPL of an earlier session."
    )
    def follow_up(
        session_id: Annotated[str, Field(description="The session to continue (its REPL keeps context, variables).")],
        question: Annotated[str, Field(description="The follow-up question.")],
    ) -> str:
        args = json.dumps({"question": question.strip(), "session_id": session_id}, ensure_ascii=False, indent=2)
        return (
            f"Continue session {session_id}: its REPL still holds the context and the variables of the "
            "earlier runs, so do not pass the files again. Call the fleet-rlm `run` tool with:\n\n"
            f"{args}\n\n{CITE}"
        )
