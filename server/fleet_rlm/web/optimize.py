"""Datasets, optimizations and program versions over HTTP: each handler is one call into
``fleet_rlm.optimize``. An optimization's events stream like a run's (same SSE format, ids are
its event seqs), so the page draws its score chart live."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, Field
from starlette.responses import StreamingResponse

from fleet_rlm.errors import UserError
from fleet_rlm.optimize import datasets, runner, versions
from fleet_rlm.optimize import views as ov
from fleet_rlm.types import ACTIVE_STATUSES
from fleet_rlm.web.api import Call, Routes
from fleet_rlm.web.models import Strict
from fleet_rlm.web.sse import EventsQuery, stream_events

routes = Routes("optimization")


class DatasetCreate(Strict):
    name: str = Field(min_length=1, max_length=64)
    jsonl: str | None = Field(None, max_length=50_000_000, description='JSON lines: {"question", "context" or '
                              '"context_path", "answer"}.')  # fmt: skip
    folder: str | None = Field(None, max_length=4096, description="The folder relative context_path entries are "
                               "taken from (the file's folder: a browser does not send it).")  # fmt: skip
    feedback: bool = Field(False, description="Build it from runs marked right or wrong instead.")
    holdout: float = Field(datasets.DEFAULT_HOLDOUT, ge=0, lt=1, description="Share of rows kept back.")
    seed: int = Field(0, ge=0, le=2**31, description="Seed of the train/holdout split.")


class OptimizationStart(Strict):
    dataset: str = Field(min_length=1, max_length=64)
    optimizer: Literal["gepa", "mipro", "bootstrap"]
    metric: str = Field(runner.DEFAULT_METRIC, max_length=64)
    trials: int | None = Field(None, ge=1, le=100)
    max_llm_calls: int | None = Field(None, ge=1, le=10_000_000, description="Cap over all replays.")
    max_cost: float | None = Field(None, gt=0, le=100_000, description="USD cap over all replays.")
    resume: str | None = Field(None, max_length=64, description="Rerun this optimization, skipping finished replays.")


class OptimizationStarted(BaseModel):
    optimization_id: str
    status: Literal["running"]
    estimate: ov.Estimate


class Cancelled(BaseModel):
    cancelled: bool
    status: str


class Promote(Strict):
    override: str | None = Field(None, max_length=2000, description="Promote despite the gate; kept as the reason.")
    tolerance: float = Field(0.0, ge=0, lt=1, description="Holdout score drop allowed.")


class CompareQuery(BaseModel):
    a: str = Field(min_length=1, max_length=64, description="A version id, or 'builtin'.")
    b: str = Field(min_length=1, max_length=64)


# -- datasets -----------------------------------------------------------------------------------


@routes.add("GET", "/api/datasets", "Datasets for optimization", response=ov.DatasetList)
async def list_datasets(call: Call) -> ov.DatasetList:
    return datasets.list_datasets(call.engine.workspace)


@routes.add("POST", "/api/datasets", "Make a dataset from JSON lines or from judged runs", body=DatasetCreate,
            response=ov.DatasetDetail, status=201, errors=(400, 409))  # fmt: skip
async def create_dataset(call: Call) -> ov.DatasetDetail:
    body: DatasetCreate = call.body
    workspace = call.engine.workspace
    if bool(body.jsonl) == body.feedback:
        raise UserError("give jsonl (the rows) or feedback: true (runs marked right or wrong), not both")
    if body.feedback:
        return await datasets.create_from_feedback(workspace, body.name, holdout=body.holdout, seed=body.seed)
    base = datasets.folder(body.folder) if body.folder else None
    rows = datasets.parse_jsonl((body.jsonl or "").splitlines(), base)
    return await datasets.create(workspace, body.name, rows, source="jsonl", holdout=body.holdout, seed=body.seed)


@routes.add("GET", "/api/datasets/{name}", "A dataset with its rows and split", response=ov.DatasetDetail)
async def get_dataset(call: Call) -> ov.DatasetDetail:
    return datasets.detail(call.engine.workspace, call.path["name"])


@routes.add("GET", "/api/datasets/{name}/export", "A dataset as JSON lines", media_type="application/x-ndjson")
async def export_dataset(call: Call) -> StreamingResponse:
    workspace, name = call.engine.workspace, call.path["name"]
    datasets.require(workspace, name)  # a 404 before the stream starts

    def lines() -> Iterator[str]:
        yield from datasets.export_lines(workspace, name)

    disposition = f'attachment; filename="{name}.jsonl"'
    return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"content-disposition": disposition})


# -- optimizations ------------------------------------------------------------------------------


@routes.add("POST", "/api/optimizations", "Start an optimization; it goes on in the background",
            body=OptimizationStart, response=OptimizationStarted, status=202, errors=(400, 404, 409))  # fmt: skip
async def start_optimization(call: Call) -> OptimizationStarted:
    body: OptimizationStart = call.body
    await call.state.refresh_settings()
    req = runner.OptimizeRequest(**body.model_dump())
    opt_id, guess = await runner.start(call.engine, req)
    return OptimizationStarted(optimization_id=opt_id, status="running", estimate=guess)


@routes.add("GET", "/api/optimizations", "Recent optimizations, newest first", response=ov.OptimizationList)
async def list_optimizations(call: Call) -> ov.OptimizationList:
    return runner.list_optimizations(call.engine.workspace)


@routes.add("GET", "/api/optimizations/{run_id}", "An optimization as it is now (trials, scores, version)",
            response=ov.OptimizationState)  # fmt: skip
async def get_optimization(call: Call) -> ov.OptimizationState:
    return runner.state(call.engine.workspace, call.path["run_id"])


@routes.add("POST", "/api/optimizations/{run_id}/cancel", "Stop an optimization of this server",
            response=Cancelled)  # fmt: skip
async def cancel_optimization(call: Call) -> Cancelled:
    opt_id = call.path["run_id"]
    current = runner.state(call.engine.workspace, opt_id)
    cancelled = current.status in ACTIVE_STATUSES and await call.engine.cancel(opt_id)
    return Cancelled(cancelled=cancelled, status=runner.state(call.engine.workspace, opt_id).status)


@routes.add("GET", "/api/optimizations/{run_id}/events", "An optimization's events as Server-Sent Events",
            query=EventsQuery, media_type="text/event-stream")  # fmt: skip
async def optimization_events(call: Call) -> object:
    runner.state(call.engine.workspace, call.path["run_id"])  # 404 unless it is an optimization
    return await stream_events(call)


# -- program versions ---------------------------------------------------------------------------


@routes.add("GET", "/api/programs", "Program versions, the active one and the promotion history",
            response=ov.VersionList)  # fmt: skip
async def list_programs(call: Call) -> ov.VersionList:
    return versions.list_versions(call.engine.workspace)


@routes.add("GET", "/api/programs/compare", "Two versions side by side: scores, instruction diff, demos",
            query=CompareQuery, response=ov.Comparison)  # fmt: skip
async def compare_programs(call: Call) -> ov.Comparison:
    return versions.compare(call.engine.workspace, call.query.a, call.query.b)


@routes.add("GET", "/api/programs/{version_id}", "A version: scores, and the instructions and demos it changed",
            response=ov.VersionDetail)  # fmt: skip
async def get_program(call: Call) -> ov.VersionDetail:
    return versions.show(call.engine.workspace, call.path["version_id"])


@routes.add("POST", "/api/programs/{version_id}/promote", "Make a version active (behind the promotion gate)",
            body=Promote, response=ov.VersionList, errors=(400, 404, 409))  # fmt: skip
async def promote_program(call: Call) -> ov.VersionList:
    body: Promote = call.body
    workspace = call.engine.workspace
    await versions.promote(workspace, call.path["version_id"], override=body.override, tolerance=body.tolerance)
    return versions.list_versions(workspace)


@routes.add("POST", "/api/programs/rollback", "Make the previously active version active again",
            response=ov.VersionList, errors=(400, 409))  # fmt: skip
async def rollback_program(call: Call) -> ov.VersionList:
    workspace = call.engine.workspace
    await versions.rollback(workspace)
    return versions.list_versions(workspace)
