"""A run's events as Server-Sent Events: ``id:`` is the event's ``seq``, ``event:`` its kind,
``data:`` its envelope as JSON. The stream opens with ``retry:``, sends keep-alive comments while
quiet, resumes after ``Last-Event-ID`` (what a browser's EventSource sends when it reconnects) or
``?after=N``, and ends after ``run.finished``. Runs of other processes (CLI, MCP) stream too:
``Engine.subscribe`` tails the store for them. A client that leaves closes its subscription.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from fleet_rlm.errors import UserError
from fleet_rlm.web.api import Call

RETRY_MS = 2000
SEND_TIMEOUT = 30.0  # a client that stops reading for this long is dropped


class EventsQuery(BaseModel):
    after: int | None = Field(None, ge=0, description="Replay events after this seq (Last-Event-ID wins).")


def resume_point(call: Call) -> int:
    header = call.request.headers.get("last-event-id", "").strip()
    if header:
        if not header.isdigit():
            raise UserError(f"Last-Event-ID must be an event seq (a whole number), not {header!r}")
        return int(header)
    return call.query.after or 0


async def stream_events(call: Call) -> EventSourceResponse:
    run_id = call.engine.workspace.resolve_run(call.path["run_id"])  # an unknown run: a 404 before the stream
    after = resume_point(call)
    engine = call.engine

    async def frames() -> AsyncIterator[ServerSentEvent]:
        yield ServerSentEvent(retry=RETRY_MS)
        async with contextlib.aclosing(engine.subscribe(run_id, after)) as events:
            async for event in events:
                data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
                yield ServerSentEvent(data=data, event=event["kind"], id=str(event["seq"]))

    return EventSourceResponse(
        frames(),
        ping=call.state.sse_ping,
        send_timeout=SEND_TIMEOUT,
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )
