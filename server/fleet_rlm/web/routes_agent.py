"""The workspace agent over HTTP: conversations, turns, approvals and the audit log. Each handler is one
``AgentHost`` call.

A turn (``POST .../turns``) and an approval (``POST /api/approvals/{id}``) answer JSON once the turn ends
or pauses; with ``Accept: text/event-stream`` they stream the turn's events instead (``event:`` the kind,
``data:`` the event as JSON), ending with ``turn.finished``. Deciding an approval that another one of its
turn still waits for resumes nothing: the JSON says so, the stream sends one ``approval.decided``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from fleet_rlm.agent import AgentHost, Feed
from fleet_rlm.agent import views as v
from fleet_rlm.agent.approvals import YesNo
from fleet_rlm.web.api import Call, Routes
from fleet_rlm.web.models import MAX_OFFSET, Strict
from fleet_rlm.web.sse import SEND_TIMEOUT

routes = Routes("agent")


class ConversationsQuery(BaseModel):
    limit: int = Field(50, ge=1, le=500)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


class ConversationCreate(Strict):
    title: str | None = Field(None, max_length=200)
    volume: str | None = Field(None, max_length=64, description="Its volume (memory, buffers); unset: agent_volume.")


class TurnIn(Strict):
    message: str = Field(min_length=1, max_length=200_000)
    upload_ids: list[str] = Field(default_factory=list, description="Files sent with POST /api/uploads to attach.")


class Decision(Strict):
    approve: YesNo = Field(description="true or false (or exactly yes or no); nothing else is taken for yes.")
    reason: str | None = Field(None, max_length=2000, description="Why; the agent reads it.")
    always: YesNo = Field(False, description="Also allow this tool without asking for the rest of the conversation.")


class ApprovalsQuery(BaseModel):
    status: v.ApprovalStatus | None = "pending"
    conversation_id: str | None = Field(None, max_length=200)


class ApprovalList(BaseModel):
    approvals: list[v.Approval]


class AuditQuery(BaseModel):
    conversation_id: str | None = Field(None, max_length=200)
    limit: int = Field(200, ge=1, le=2000)


def _host(call: Call) -> AgentHost:
    return AgentHost.of(call.engine)


def _wants_stream(call: Call) -> bool:
    return "text/event-stream" in call.request.headers.get("accept", "")


def _stream(call: Call, events: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    async def frames() -> AsyncIterator[ServerSentEvent]:
        async for event in events:
            yield ServerSentEvent(data=json.dumps(event, ensure_ascii=False), event=event["kind"])

    return EventSourceResponse(
        frames(),
        ping=call.state.sse_ping,
        send_timeout=SEND_TIMEOUT,
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def _one(event: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield event


@routes.add(
    "GET",
    "/api/conversations",
    "Conversations with the agent, and every pending approval",
    query=ConversationsQuery,
    response=v.ConversationList,
)
async def list_conversations(call: Call) -> v.ConversationList:
    return await asyncio.to_thread(_host(call).list_conversations, limit=call.query.limit, offset=call.query.offset)


@routes.add(
    "POST",
    "/api/conversations",
    "Start a conversation with the workspace agent",
    body=ConversationCreate,
    response=v.Conversation,
    status=201,
)
async def create_conversation(call: Call) -> v.Conversation:
    return await _host(call).create_conversation(call.body.title, call.body.volume)


@routes.add(
    "GET",
    "/api/conversations/{conversation_id}",
    "A conversation: messages, tool calls, approvals, audit log, linked runs",
    response=v.Conversation,
)
async def get_conversation(call: Call) -> v.Conversation:
    return await asyncio.to_thread(_host(call).conversation, call.path["conversation_id"])


@routes.add(
    "POST",
    "/api/conversations/{conversation_id}/turns",
    "Send a message; JSON when the turn ends or pauses, or its events (Accept: text/event-stream)",
    body=TurnIn,
    response=v.TurnOutcome,
    errors=(400, 404, 409),
)
async def send(call: Call) -> object:
    await call.state.refresh_settings()
    feed = await _host(call).send(call.path["conversation_id"], call.body.message, call.body.upload_ids)
    return _stream(call, feed.follow()) if _wants_stream(call) else await feed.outcome()


@routes.add(
    "GET", "/api/approvals", "Approvals (pending by default), oldest first", query=ApprovalsQuery, response=ApprovalList
)
async def list_approvals(call: Call) -> ApprovalList:
    host, q = _host(call), call.query
    await asyncio.to_thread(host.expire)
    return ApprovalList(approvals=host.approvals(status=q.status, conversation_id=q.conversation_id))


@routes.add(
    "POST",
    "/api/approvals/{approval_id}",
    "Approve or reject; the paused turn resumes (JSON outcome, or its events with Accept: text/event-stream)",
    body=Decision,
    response=v.AnswerOutcome,
    errors=(400, 404, 409),
)
async def decide(call: Call) -> object:
    body: Decision = call.body
    approval, feed = await _host(call).answer(
        call.path["approval_id"], body.approve, reason=body.reason, always=body.always, actor="web"
    )
    if _wants_stream(call):
        decided = {"kind": "approval.decided", "approval": approval.model_dump(mode="json")}
        return _stream(call, _prepend(decided, feed) if feed else _one(decided))
    return v.AnswerOutcome(approval=approval, turn=await feed.outcome() if feed else None)


async def _prepend(first: dict[str, Any], feed: Feed) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for event in feed.follow():
        yield event


@routes.add("GET", "/api/audit", "The approval audit log, newest first", query=AuditQuery, response=v.AuditLog)
async def audit(call: Call) -> v.AuditLog:
    return await asyncio.to_thread(_host(call).audit, call.query.conversation_id, call.query.limit)
