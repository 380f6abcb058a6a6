"""Optimization tools (``optimize``, ``list_programs``, ``promote_program``) and a resource per
optimization (``fleet://optimizations/{id}``): adapters over ``fleet_rlm.optimize``."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from fleet_rlm.core import operations
from fleet_rlm.mcp.resources import _resource_errors
from fleet_rlm.mcp.views import user_errors
from fleet_rlm.optimize.views import Estimate, OptimizationState, VersionDetail, VersionList

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.mcp.provider import EngineProvider


def optimization_uri(opt_id: str) -> str:
    return f"fleet://optimizations/{opt_id}"


class OptimizeOutput(BaseModel):
    optimization_id: str
    status: str
    estimate: Estimate = Field(description="Replays, model calls and cost at most, computed before it started.")
    resource_uri: str = Field(description="Resource with the optimization's live state (poll it while it runs).")
    result: OptimizationState | None = Field(None, description="The final state, when wait was true.")


OPTIMIZE_DESCRIPTION = """\
Improve the RLM program on a dataset of questions with expected answers (made with `fleet-rlm
dataset import`), with a DSPy optimizer: bootstrap (demos from whole successful runs), gepa
(instructions rewritten by reflecting on failures) or mipro (instructions and demos searched
together). Every dataset row is replayed as a real run (budgets apply), before and after, on the
train and holdout splits. The result is a new program version with both scores; it is not used
until promoted (promote_program). With wait=false it returns at once: read the resource_uri for
progress. It can take minutes: each replay is a full run."""


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    async def engine() -> Engine:
        with user_errors():
            return await provider.get()

    @server.tool(
        title="Optimize the RLM program on a dataset",
        description=OPTIMIZE_DESCRIPTION,
        annotations=ToolAnnotations(
            title="Optimize", read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
        ),
    )
    async def optimize(
        dataset: Annotated[str, Field(min_length=1, description="The dataset's name.")],
        optimizer: Annotated[Literal["gepa", "mipro", "bootstrap"], Field(description="The DSPy optimizer.")],
        ctx: Context,
        metric: Annotated[str, Field(description="exact, normalised, numeric[:TOL], f1 or judge.")] = "normalised",
        trials: Annotated[
            int | None, Field(ge=1, le=100, description="GEPA full evaluations / MIPROv2 trials.")
        ] = None,
        max_llm_calls: Annotated[
            int | None, Field(ge=1, description="Cap: stop once the replays made this many model calls.")
        ] = None,
        wait: Annotated[bool, Field(description="Block until it finishes, reporting progress.")] = False,
    ) -> OptimizeOutput:
        from fleet_rlm.optimize import runner

        eng = await engine()
        req = runner.OptimizeRequest(dataset=dataset, optimizer=optimizer, metric=metric, trials=trials,
                                     max_llm_calls=max_llm_calls)  # fmt: skip
        with user_errors():
            opt_id, guess = await runner.start(eng, req)
        out = OptimizeOutput(optimization_id=opt_id, status="running", estimate=guess,
                             resource_uri=optimization_uri(opt_id))  # fmt: skip
        if not wait:
            return out
        async with operations.stopped_if_abandoned(eng, opt_id):  # a cancelled call stops it too
            await _follow(eng, opt_id, ctx)
        final = runner.state(eng.workspace, opt_id)
        return out.model_copy(update={"status": final.status, "result": final})

    @server.tool(
        title="List program versions",
        description=(
            "Versions of the RLM program made by optimize, with their train and holdout scores before "
            "and after, which one is active (new runs use it), and the promotion/rollback history."
        ),
        annotations=ToolAnnotations(
            title="List programs",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def list_programs() -> VersionList:
        from fleet_rlm.optimize import versions

        eng = await engine()
        with user_errors():
            return versions.list_versions(eng.workspace)

    @server.tool(
        title="Promote a program version",
        description=(
            "Make a program version active: new runs use it and record it. Refused unless it improved "
            "the train score without lowering the holdout score, or an override reason is given (kept). "
            "rollback=true instead makes the previously active version active again."
        ),
        annotations=ToolAnnotations(
            title="Promote program",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    async def promote_program(
        version_id: Annotated[str | None, Field(description="The version to promote (see list_programs).")] = None,
        override: Annotated[str | None, Field(description="Promote despite the gate; the reason is kept.")] = None,
        rollback: Annotated[bool, Field(description="Roll back to the previously active version instead.")] = False,
    ) -> VersionList:
        from fleet_rlm.errors import UserError
        from fleet_rlm.optimize import versions

        eng = await engine()
        workspace = eng.workspace
        with user_errors():
            if rollback == bool(version_id):
                raise UserError("give version_id to promote, or rollback=true, not both")
            if rollback:
                await versions.rollback(workspace)
            else:
                await versions.promote(workspace, str(version_id), override=override)
            return versions.list_versions(workspace)

    @server.resource(
        "fleet://optimizations/{opt_id}",
        name="optimization",
        title="An optimization",
        mime_type="application/json",
        description="An optimization's status, scores per trial, and the version it produced.",
    )
    async def optimization(opt_id: str) -> str:
        from fleet_rlm.optimize import runner

        with _resource_errors():
            eng = await provider.get()
            return json.dumps(runner.state(eng.workspace, opt_id).model_dump(mode="json"))

    @server.resource(
        "fleet://programs/{version_id}",
        name="program-version",
        title="A program version",
        mime_type="application/json",
        description="A program version: scores, and the instructions and demos it changed.",
    )
    async def program_version(version_id: str) -> str:
        from fleet_rlm.optimize import versions

        with _resource_errors():
            eng = await provider.get()
            detail: VersionDetail = versions.show(eng.workspace, version_id)
            return json.dumps(detail.model_dump(mode="json"))


async def _follow(engine: Engine, opt_id: str, ctx: Context) -> None:
    """Relay the optimization's evaluations and scores as progress until it finishes."""
    async with contextlib.aclosing(engine.subscribe(opt_id)) as events:
        async for event in events:
            data = event["data"]
            if event["kind"] == "optimize.eval":
                line = (f"trial {data['trial']} · candidate {data['candidate']} · {data['evaluations']} evaluations"
                        f" · score {data['score']:.2f}")  # fmt: skip
            elif event["kind"] == "optimize.scored":
                line = f"{data['program']}: {data['split']} score {data['score']:.3f}"
            else:
                continue
            await ctx.report_progress(event["seq"], None, line)
