"""inspect_trace: page through how a run reached its answer without flooding the caller."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.types import ToolAnnotations
from pydantic import Field

from fleet_rlm.mcp.models import TraceView
from fleet_rlm.mcp.views import user_errors

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
            return engine.workspace.trace_page(
                run_id, node=node, step=step, detail=detail, offset=offset, limit=limit
            )
