"""Runs, their traces, events, feedback and uploads; sessions. Each handler is one core call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive

from fleet_rlm.core import housekeeping, html_export, operations, uploads, views
from fleet_rlm.core.rerun import ReplayReport
from fleet_rlm.core.views import CancelResult
from fleet_rlm.errors import UserError
from fleet_rlm.types import RunRequest
from fleet_rlm.web import models as m
from fleet_rlm.web.api import Call, Routes
from fleet_rlm.web.sse import EventsQuery, stream_events

routes = Routes("runs")
MAX_FILES = 20
CHUNK = 1024 * 1024


@routes.add("GET", "/api/runs", "List runs, newest first, paged and searchable", query=m.RunsQuery,
            response=views.RunList)  # fmt: skip
async def list_runs(call: Call) -> views.RunList:
    q: m.RunsQuery = call.query
    return call.engine.workspace.list_runs(
        limit=q.limit, offset=q.offset, status=q.status, session_id=q.session_id, q=q.q
    )


@routes.add("POST", "/api/runs", "Start a run; it goes on in the background", body=m.RunStart,
            response=m.RunStarted, status=202)  # fmt: skip
async def start_run(call: Call) -> m.RunStarted:
    body: m.RunStart = call.body
    await call.state.refresh_settings()  # saved settings apply to this run
    fields = body.model_dump(exclude={"upload_ids"})
    run_id = await uploads.start_run(call.engine, RunRequest(**fields), body.upload_ids)
    return m.RunStarted(run_id=run_id, status="queued")


@routes.add("DELETE", "/api/runs", "Delete finished runs older than some days, with their uploads",
            query=m.DeleteRunsQuery, response=m.Deleted)  # fmt: skip
async def delete_old_runs(call: Call) -> m.Deleted:
    engine, days = call.engine, call.query.older_than_days
    count = await asyncio.to_thread(housekeeping.delete_runs_older_than, engine.workspace, engine.settings, days)
    return m.Deleted(deleted=count)


@routes.add("GET", "/api/runs/{run_id}", "A run as it is now", response=views.RunState)
async def get_run(call: Call) -> views.RunState:
    return call.engine.workspace.run_state(call.path["run_id"])


@routes.add("DELETE", "/api/runs/{run_id}", "Delete a finished run with its events, feedback and uploads",
            status=204, errors=(400, 404, 409))  # fmt: skip
async def delete_run(call: Call) -> None:
    engine = call.engine
    await asyncio.to_thread(housekeeping.delete_run, engine.workspace, engine.settings, call.path["run_id"])


@routes.add("POST", "/api/runs/{run_id}/replay", "Replay a finished run from its record (no model calls)",
            response=m.RunStarted, status=202, errors=(400, 404, 409))  # fmt: skip
async def replay_run(call: Call) -> m.RunStarted:
    return m.RunStarted(run_id=await call.engine.replay(call.path["run_id"]), status="queued")


@routes.add("GET", "/api/runs/{run_id}/replay", "How a replay compares with the run it replays",
            response=ReplayReport)  # fmt: skip
async def replay_report(call: Call) -> ReplayReport:
    return call.engine.workspace.replay_report(call.path["run_id"])


@routes.add("POST", "/api/runs/{run_id}/fork", "Fork a finished run at a step: earlier steps from its record, "
            "then live", body=m.ForkStart, response=m.RunStarted, status=202, errors=(400, 404, 409))  # fmt: skip
async def fork_run(call: Call) -> m.RunStarted:
    body: m.ForkStart = call.body
    await call.state.refresh_settings()  # saved settings apply to its live steps
    fork_id = await call.engine.fork(
        call.path["run_id"], body.at, code=body.code, instruction=body.instruction, max_iters=body.max_iters
    )
    return m.RunStarted(run_id=fork_id, status="queued")


@routes.add("POST", "/api/runs/{run_id}/cancel", "Stop a run of this server", response=CancelResult)
async def cancel_run(call: Call) -> CancelResult:
    return await operations.cancel_run(call.engine, call.path["run_id"])


@routes.add("POST", "/api/runs/{run_id}/pin", "Pin a run (retention keeps it) or unpin it", body=m.PinIn,
            response=views.RunSummary, errors=(400, 404))  # fmt: skip
async def pin_run(call: Call) -> views.RunSummary:
    body: m.PinIn = call.body
    return await asyncio.to_thread(operations.pin_run, call.engine.workspace, call.path["run_id"], body.pinned)


@routes.add("GET", "/api/runs/{run_id}/trace", "One node of a run's trace, paged; or one step in full",
            query=m.TraceQuery, response=views.TraceView)  # fmt: skip
async def trace(call: Call) -> views.TraceView:
    q: m.TraceQuery = call.query
    return call.engine.workspace.trace_page(
        call.path["run_id"], node=q.node, step=q.step, detail=q.detail, offset=q.offset, limit=q.limit
    )


@routes.add("GET", "/api/runs/{run_id}/tree", "The whole run as a tree with timestamps", response=m.TraceTree)
async def tree(call: Call) -> dict[str, object]:
    return call.engine.workspace.trace(call.path["run_id"])


@routes.add("GET", "/api/runs/{run_id}/export", "Every event of the run as JSON lines",
            media_type="application/x-ndjson")  # fmt: skip
async def export(call: Call) -> StreamingResponse:
    ws = call.engine.workspace
    run_id = ws.resolve_run(call.path["run_id"])  # a 404 before the stream starts

    def lines() -> Iterator[str]:  # a sync iterator: Starlette reads it off the event loop
        for event in ws.export(run_id):
            yield json.dumps(event, ensure_ascii=False) + "\n"

    disposition = f'attachment; filename="{run_id}.jsonl"'
    return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"content-disposition": disposition})


@routes.add("GET", "/api/runs/{run_id}/export.html", "The run as one self-contained HTML page (works offline)",
            media_type="text/html")  # fmt: skip
async def export_html(call: Call) -> Response:
    ws = call.engine.workspace
    row = ws.run(call.path["run_id"])
    page = await asyncio.to_thread(lambda: html_export.run_html(row.id, ws.events(row.id)))  # off the event loop
    disposition = f'attachment; filename="{row.id}.html"'  # a download: never rendered in the app's origin
    return Response(page.html, media_type="text/html; charset=utf-8", headers={"content-disposition": disposition})


@routes.add("GET", "/api/runs/{run_id}/events", "The run's events as Server-Sent Events (resumable)",
            query=EventsQuery, media_type="text/event-stream")  # fmt: skip
async def events(call: Call) -> object:
    return await stream_events(call)


@routes.add("POST", "/api/runs/{run_id}/feedback", "Judge the run's answer (kept for optimization)",
            body=m.FeedbackIn, response=views.Feedback, status=201, errors=(400, 404, 409))  # fmt: skip
async def add_feedback(call: Call) -> views.Feedback:
    body: m.FeedbackIn = call.body
    return await call.engine.workspace.add_feedback(call.path["run_id"], body.correct, body.expected, body.comment)


@routes.add("GET", "/api/runs/{run_id}/feedback", "The run's feedback, oldest first", response=m.FeedbackList)
async def list_feedback(call: Call) -> m.FeedbackList:
    return m.FeedbackList(feedback=call.engine.workspace.feedback(call.path["run_id"]))


# -- uploads ------------------------------------------------------------------------------------


def _counting(receive: Receive, limit: int, fail: Exception) -> Receive:
    """``receive`` that refuses a body past ``limit`` bytes as it arrives (chunked bodies have no length)."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise fail
        return message

    return counted


@routes.add("POST", "/api/uploads", "Upload files (multipart 'file' parts) to use as run context",
            body_kind="multipart", response=m.UploadList, status=201, errors=(400, 413))  # fmt: skip
async def upload(call: Call) -> m.UploadList:
    settings, workspace = call.engine.settings, call.engine.workspace
    limit, refusal = uploads.limit_bytes(settings), uploads.too_large(settings)
    declared = call.request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + 64 * 1024:  # the parts' headers are not the files
        raise refusal
    request = Request(call.request.scope, _counting(call.request.receive, limit + 64 * 1024, refusal))
    form = await request.form(max_files=MAX_FILES, max_fields=MAX_FILES)
    try:
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not files:
            raise UserError("no file in the request: send multipart/form-data with one or more parts named 'file'")
        saved = []
        for part in files:
            writer = await asyncio.to_thread(uploads.UploadWriter, settings, part.filename)
            try:
                while chunk := await part.read(CHUNK):
                    await asyncio.to_thread(writer.write, chunk)
                saved.append(m.Upload(**await asyncio.to_thread(writer.commit, workspace)))
            except BaseException:
                await asyncio.to_thread(writer.discard)
                raise
        return m.UploadList(uploads=saved)
    finally:
        await form.close()


# -- sessions -----------------------------------------------------------------------------------


@routes.add("GET", "/api/sessions", "Sessions (REPLs that outlive one run), most recently used first",
            query=m.SessionsQuery, response=views.SessionList)  # fmt: skip
async def list_sessions(call: Call) -> views.SessionList:
    return call.engine.workspace.list_sessions(include_closed=call.query.include_closed)


@routes.add("POST", "/api/sessions", "Open a session", body=m.SessionCreate, response=m.SessionCreated, status=201)
async def open_session(call: Call) -> m.SessionCreated:
    return m.SessionCreated(id=await call.engine.open_session(call.body.name))


@routes.add("DELETE", "/api/sessions/{session_id}", "Close a session and its REPL", status=204)
async def close_session(call: Call) -> None:
    session = call.engine.workspace.session(call.path["session_id"])  # a 404 for an unknown one
    await call.engine.close_session(session.id)
