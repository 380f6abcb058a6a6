"""inspect_trace: page through how a run reached its answer without flooding the caller."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from fleet_rlm.core.trace import build_trace, summarize_step
from fleet_rlm.mcp.models import StepDetail, StepSummary, SubcallView, TraceView
from fleet_rlm.mcp.views import unknown_run, user_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.mcp.provider import EngineProvider

DESCRIPTION = """\
See how a run reached its answer. Default: one page of step summaries of a node (previews and
sizes of the code the model wrote and the output it saw). Then drill in: step=N shows that step
in full (code, output, and its sub-queries with previews, paged by offset/limit); node='root.1'
inspects a child RLM. Runs in progress can be inspected too."""


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    @server.tool(
        title="Inspect a run's trace",
        description=DESCRIPTION,
        annotations=ToolAnnotations(
            title="Inspect trace",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def inspect_trace(
        run_id: Annotated[str, Field(min_length=1, description="The run to inspect.")],
        node: Annotated[str, Field(description="Node id: 'root', or a child such as 'root.1'.")] = "root",
        step: Annotated[int | None, Field(ge=1, description="Show this step in full.")] = None,
        detail: Annotated[
            Literal["summary", "full"],
            Field(description="Step list: previews only, or full code and output."),
        ] = "summary",
        offset: Annotated[int, Field(ge=0, description="First step (or sub-query, with step) to return.")] = 0,
        limit: Annotated[int, Field(ge=1, le=100, description="How many steps (or sub-queries) to return.")] = 20,
    ) -> TraceView:
        with user_errors():
            engine = await provider.get()
        if engine.get_run(run_id) is None:
            raise unknown_run(run_id)
        return trace_view(run_id, build_trace(engine.events(run_id)), node, step, detail, offset, limit)


def trace_view(
    run_id: str, trace: dict[str, Any], node: str, step: int | None, detail: str, offset: int, limit: int
) -> TraceView:
    nodes = trace["nodes"]
    if node not in nodes:
        raise ToolError(f"run '{run_id}' has no node '{node}'; its nodes are: {', '.join(nodes)}")
    n = nodes[node]
    steps = sorted(n["steps"], key=lambda s: s["step"])
    run = trace["run"]
    view: dict[str, Any] = {
        "run_id": run_id,
        "run_status": run.get("status") or "running",
        "question": run.get("question"),
        "answer": run.get("answer"),
        "node": node,
        "node_status": n.get("status"),
        "parent": n.get("parent"),
        "depth": int(n.get("depth") or 0),
        "query_preview": n.get("query_preview"),
        "answer_preview": n.get("answer_preview"),
        "children": list(n.get("children") or []),
        "warnings": [str(w) for w in n.get("warnings") or []],
        "nodes": list(nodes),
        "steps_total": len(steps),
        "offset": offset,
    }
    if step is not None:
        found = next((s for s in steps if s["step"] == step), None)
        if found is None:
            have = f"steps 1..{steps[-1]['step']}" if steps else "no steps yet"
            raise ToolError(f"node '{node}' of run '{run_id}' has {have}")
        detail_view = step_detail(found, offset, limit)
        more = offset + limit < detail_view.subcalls_total
        return TraceView(**view, steps=[], step=detail_view, has_more=more)
    page = steps[offset : offset + limit]
    listed: list[StepSummary] | list[StepDetail]
    if detail == "full":
        listed = [step_detail(s, 0, 0) for s in page]
    else:
        listed = [StepSummary.model_validate(summarize_step(s)) for s in page]
    return TraceView(**view, steps=listed, step=None, has_more=offset + limit < len(steps))


def step_detail(step: dict[str, Any], offset: int, limit: int) -> StepDetail:
    """A step in full; its sub-queries paged (limit 0: counted, not listed)."""
    subcalls = step.get("subcalls") or []
    page = subcalls[offset : offset + limit] if limit else []
    return StepDetail(
        step=step["step"],
        reasoning=step.get("reasoning"),
        code=step.get("code"),
        output=step.get("output"),
        output_chars=step.get("output_chars"),
        error=step.get("error"),
        submitted=bool(step.get("submitted")),
        duration=step.get("duration"),
        lm=step.get("lm"),
        children=list(step.get("children") or []),
        subcalls_total=len(subcalls),
        subcalls_offset=offset,
        subcalls=[_subcall(offset + i, s) for i, s in enumerate(page)],
    )


def _subcall(index: int, data: dict[str, Any]) -> SubcallView:
    keys = ("prompt_preview", "prompt_chars", "response_preview", "response_chars", "error", "model", "batch")
    return SubcallView(index=index, **{k: data.get(k) for k in keys})
