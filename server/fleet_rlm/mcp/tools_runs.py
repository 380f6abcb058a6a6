"""Tools that start, follow, list and stop runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import anyio
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import Field

from fleet_rlm.core import operations
from fleet_rlm.limits import MAX_COST, MAX_DEPTH, MAX_ITERS, MAX_LLM_CALLS, MAX_SECONDS, MAX_TOKENS
from fleet_rlm.mcp.models import (
    CancelResult,
    ForkOutput,
    ReplayOutput,
    RunList,
    RunOutput,
    RunState,
    RunSummary,
    StartedRun,
    run_uri,
    trace_uri,
)
from fleet_rlm.mcp.views import run_output, run_state, user_errors
from fleet_rlm.types import RunRequest, RunResult, RunStatus

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.mcp.provider import EngineProvider


Question = Annotated[
    str,
    Field(
        min_length=1,
        description="The question or task, stated fully: the run sees nothing of this conversation.",
    ),
]
ContextPaths = Annotated[
    list[str],
    Field(
        description=(
            "Files or folders to work over: absolute paths on this machine, or volume references "
            "'vol:<volume>/<path>'. Any size: the text is loaded into a sandboxed Python REPL and "
            "read with code, never pasted into a prompt."
        ),
    ),
]
ContextText = Annotated[
    str | None,
    Field(description="Text to work over when it is not in a file (e.g. a long paste)."),
]
ContextUrls = Annotated[
    list[str],
    Field(
        description=(
            "Web pages to work over (http:// or https://), fetched by the server as text (HTML and PDFs "
            "converted), at most 20: public addresses only, unless the server's fetch_allowed_hosts allows "
            "a private one."
        ),
    ),
]
RepoUrl = Annotated[
    str | None,
    Field(description="A git repository (http:// or https://) to work over: cloned shallowly, its files staged."),
]
RepoRef = Annotated[
    str | None,
    Field(description="The repository's branch or tag (e.g. v1.2.0); unset: its default branch."),
]
SessionId = Annotated[
    str | None,
    Field(
        description="Name a session (letters, digits, '_', '.', '-') to keep the REPL across runs: a new name "
        "starts one, the same name later continues with the variables and context of earlier runs."
    ),
]
VolumeName = Annotated[
    str | None,
    Field(
        description=(
            "Mount only this volume (created if new) in the REPL, where the run can keep notes in memory/ "
            "and write results to artifacts/. Default: every volume is mounted."
        ),
    ),
]
McpServers = Annotated[
    list[str],
    Field(
        description=(
            "Configured MCP servers (FLEET_MCP_SERVERS) whose tools the REPL gets as plain functions "
            "(server.tool(...)), called from the host. Default: none."
        ),
    ),
]
AllowTools = Annotated[
    list[str],
    Field(
        description=(
            "Tools ('server.tool', or 'server.*') the REPL may call although their server does not mark them "
            "read-only; others are refused. Default: none."
        ),
    ),
]
# The schema advertises each limit's declared bounds; RunRequest checks them, with the message every face gives.
MaxIters = Annotated[int | None, MAX_ITERS]
MaxDepth = Annotated[int | None, MAX_DEPTH]
MaxCalls = Annotated[int | None, MAX_LLM_CALLS]
MaxSeconds = Annotated[float | None, MAX_SECONDS]
MaxCost = Annotated[float | None, MAX_COST]
MaxTokens = Annotated[int | None, MAX_TOKENS]
RunId = Annotated[
    str,
    Field(
        min_length=1,
        description="A run id as returned by run or start_run, a unique start or end of one, or last / last~N.",
    ),
]

RUN_DESCRIPTION = """\
Answer a question over inputs too large for your context window: long documents, big logs,
whole folders, many files. A recursive language model writes and runs Python over the input in
a sandbox, fanning out sub-queries over chunks, and submits one answer; the input never enters
your context. Prefer this over reading a large file yourself.

Blocks until the run finishes (usually 10 s to a few minutes), reporting progress on every step
("step 3 · 40/64 sub-queries"). Cancelling the call stops the run. If your client times out long
calls, use start_run + get_run instead. The answer is only as good as the question: say exactly
what to find and what form the answer should take (e.g. "quote the line and give its number").
Inspect how the answer was found with inspect_trace(run_id)."""


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    async def engine() -> Engine:
        with user_errors():
            return await provider.get()

    @server.tool(
        title="Answer a question over large inputs",
        description=RUN_DESCRIPTION,
        annotations=ToolAnnotations(
            title="Run an RLM",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=True,
        ),
    )
    async def run(
        question: Question,
        ctx: Context,
        context_paths: ContextPaths = [],  # noqa: B006 - pydantic copies defaults
        context_text: ContextText = None,
        context_urls: ContextUrls = [],  # noqa: B006 - pydantic copies defaults
        repo_url: RepoUrl = None,
        repo_ref: RepoRef = None,
        session_id: SessionId = None,
        volume: VolumeName = None,
        mcp_servers: McpServers = [],  # noqa: B006 - pydantic copies defaults
        allow_tools: AllowTools = [],  # noqa: B006 - pydantic copies defaults
        max_iters: MaxIters = None,
        max_depth: MaxDepth = None,
        max_llm_calls: MaxCalls = None,
        max_seconds: MaxSeconds = None,
        max_cost: MaxCost = None,
        max_tokens: MaxTokens = None,
    ) -> RunOutput:
        eng = await engine()
        req = _request(
            question,
            context_paths=context_paths,
            context_text=context_text,
            context_urls=context_urls,
            repo_url=repo_url,
            repo_ref=repo_ref,
            session_id=session_id,
            volume=volume,
            mcp_servers=mcp_servers,
            allow_tools=allow_tools,
            max_iters=max_iters,
            max_depth=max_depth,
            max_llm_calls=max_llm_calls,
            max_seconds=max_seconds,
            max_cost=max_cost,
            max_tokens=max_tokens,
        )
        with user_errors():
            run_id = await eng.start_run(req)
        return run_output(await _to_the_end(eng, run_id, ctx), eng.workspace)

    @server.tool(
        title="Start a run in the background",
        description=(
            "Like run, but returns the run id at once and keeps working in the background; poll "
            "get_run(run_id) for progress and the answer, or cancel_run(run_id) to stop it. Use this "
            "when your client cannot wait minutes for one tool call. Same inputs as run."
        ),
        annotations=ToolAnnotations(
            title="Start a run",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=True,
        ),
    )
    async def start_run(
        question: Question,
        context_paths: ContextPaths = [],  # noqa: B006 - pydantic copies defaults
        context_text: ContextText = None,
        context_urls: ContextUrls = [],  # noqa: B006 - pydantic copies defaults
        repo_url: RepoUrl = None,
        repo_ref: RepoRef = None,
        session_id: SessionId = None,
        volume: VolumeName = None,
        mcp_servers: McpServers = [],  # noqa: B006 - pydantic copies defaults
        allow_tools: AllowTools = [],  # noqa: B006 - pydantic copies defaults
        max_iters: MaxIters = None,
        max_depth: MaxDepth = None,
        max_llm_calls: MaxCalls = None,
        max_seconds: MaxSeconds = None,
        max_cost: MaxCost = None,
        max_tokens: MaxTokens = None,
    ) -> StartedRun:
        eng = await engine()
        req = _request(
            question,
            context_paths=context_paths,
            context_text=context_text,
            context_urls=context_urls,
            repo_url=repo_url,
            repo_ref=repo_ref,
            session_id=session_id,
            volume=volume,
            mcp_servers=mcp_servers,
            allow_tools=allow_tools,
            max_iters=max_iters,
            max_depth=max_depth,
            max_llm_calls=max_llm_calls,
            max_seconds=max_seconds,
            max_cost=max_cost,
            max_tokens=max_tokens,
        )
        with user_errors():
            run_id = await eng.start_run(req)
        rec = eng.get_run(run_id)
        status: RunStatus = rec.status if rec else "queued"
        return StartedRun(
            run_id=run_id,
            status=status,
            run_uri=run_uri(run_id),
            trace_uri=trace_uri(run_id),
        )

    @server.tool(
        title="Get a run's status",
        description=(
            "Status of a run: while it runs, live counters (step, sub-queries done, model calls, "
            "tokens) and the latest progress line; once finished, the answer or the error."
        ),
        annotations=ToolAnnotations(
            title="Get run",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def get_run(run_id: RunId) -> RunState:
        eng = await engine()
        with user_errors():
            return run_state(eng.workspace, run_id)

    @server.tool(
        title="Cancel a run",
        description=(
            "Stop a queued or running run started by this server; it is recorded as cancelled. "
            "Does nothing to a run that already finished."
        ),
        annotations=ToolAnnotations(
            title="Cancel run",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def cancel_run(run_id: RunId) -> CancelResult:
        eng = await engine()
        with user_errors():
            return await operations.cancel_run(eng, run_id)

    @server.tool(
        title="Pin a run",
        description=(
            "Keep a run when retention deletes old runs (pinned=false lets it go again). Returns the run's "
            "summary with its pinned flag."
        ),
        annotations=ToolAnnotations(
            title="Pin run",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def pin_run(
        run_id: RunId,
        pinned: Annotated[bool, Field(description="True keeps the run from retention; false lets it go.")] = True,
    ) -> RunSummary:
        eng = await engine()
        with user_errors():
            # Its write waits for the store's commit: in a worker thread, so the loop serves others meanwhile.
            return await anyio.to_thread.run_sync(operations.pin_run, eng.workspace, run_id, pinned)

    @server.tool(
        title="List recent runs",
        description="Recent runs, newest first, with their status and a preview of question and answer.",
        annotations=ToolAnnotations(
            title="List runs",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def list_runs(
        limit: Annotated[int, Field(ge=1, le=200, description="How many runs to return.")] = 20,
        status: Annotated[
            RunStatus | None,
            Field(description="Only runs with this status."),
        ] = None,
        offset: Annotated[int, Field(ge=0, description="Skip this many runs (paging).")] = 0,
    ) -> RunList:
        eng = await engine()
        with user_errors():
            return eng.workspace.list_runs(limit=limit, offset=offset, status=status)

    @server.tool(
        title="Replay a run from its record",
        description=(
            "Run a finished run again on the current code in a fresh sandbox, every model call answered from "
            "the run's record: no model is asked and nothing is paid. Reports per step whether the code, the "
            "output and the model's request match the record, the first step where they part and why, and "
            "whether the answer is the same (diverged: false means nothing differed). Volumes are mounted "
            "read-only. Progress on every step; cancelling the call stops the replay."
        ),
        annotations=ToolAnnotations(
            title="Replay run",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def replay_run(run_id: RunId, ctx: Context) -> ReplayOutput:
        eng = await engine()
        with user_errors():
            replay_id = await eng.replay(run_id)
        await _to_the_end(eng, replay_id, ctx)
        report = eng.workspace.replay_report(replay_id)
        return ReplayOutput(**report.model_dump(), trace_uri=trace_uri(replay_id))

    @server.tool(
        title="Fork a run from one of its steps",
        description=(
            "A new run that replays a finished run's steps before `at` from its record (no model calls, no "
            "cost), then at that step runs the given `code` instead of asking the model, or asks the model "
            "with `instruction` added to its transcript, and goes on live to its end (model calls and cost "
            "from there). Use it to try a different step without paying for the ones before it. Returns the "
            "new run's outcome with its lineage. Progress on every step; cancelling the call stops the run."
        ),
        annotations=ToolAnnotations(
            title="Fork run",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=True,
        ),
    )
    async def fork_run(
        run_id: RunId,
        at: Annotated[
            str, Field(min_length=1, description="The step to branch at: '3', or 'NODE:STEP' in a child ('root.1:2').")
        ],
        ctx: Context,
        code: Annotated[
            str | None, Field(description="Python to run at that step instead of asking the model.")
        ] = None,
        instruction: Annotated[
            str | None, Field(description="Added to the transcript before the model is asked at that step.")
        ] = None,
        max_iters: MaxIters = None,
    ) -> ForkOutput:
        eng = await engine()
        with user_errors():
            fork_id = await eng.fork(run_id, at, code=code, instruction=instruction, max_iters=max_iters)
        result = await _to_the_end(eng, fork_id, ctx)
        state = eng.workspace.run_state(fork_id)
        out = run_output(result, eng.workspace)
        return ForkOutput(**out.model_dump(), parent_run_id=run_id, fork_at=state.fork_at or at)


def _request(
    question: str,
    *,
    context_paths: list[str],
    context_text: str | None,
    context_urls: list[str],
    repo_url: str | None,
    repo_ref: str | None,
    session_id: str | None,
    volume: str | None,
    max_iters: int | None,
    max_depth: int | None,
    max_llm_calls: int | None,
    max_seconds: float | None,
    max_cost: float | None,
    max_tokens: int | None = None,
    mcp_servers: list[str] | None = None,
    allow_tools: list[str] | None = None,
) -> RunRequest:
    with user_errors():  # RunRequest checks its own fields
        return RunRequest(
            question=question,
            context_paths=list(context_paths),
            context_text=[context_text] if context_text else [],
            context_urls=list(context_urls),
            repo_url=repo_url,
            repo_ref=repo_ref,
            session_id=session_id,
            volume=volume,
            mcp_servers=list(mcp_servers or []),
            allow_tools=list(allow_tools or []),
            max_iters=max_iters,
            max_depth=max_depth,
            max_llm_calls=max_llm_calls,
            max_seconds=max_seconds,
            max_cost=max_cost,
            max_tokens=max_tokens,
        )


async def _to_the_end(engine: Engine, run_id: str, ctx: Context) -> RunResult:
    """Relay a started run's progress to the client until it finishes; a client that cancels (or goes
    away) stops the run."""
    return await operations.follow_to_end(engine, run_id, _reporter(ctx))


def _reporter(ctx: Context) -> operations.Report:
    async def report(events: int, line: str) -> None:
        await ctx.report_progress(events, None, line)  # progress must strictly increase: the event count does

    return report
