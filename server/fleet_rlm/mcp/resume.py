"""Resumable SSE streams over HTTP for 2025-era clients (SEP-1699).

Every SSE stream a POST opens starts with a priming event (an event id, empty data and a
``retry:`` delay), and every message on it carries an id. A client whose connection drops
during a long call (a ``run`` takes minutes) reconnects with ``GET`` and ``Last-Event-ID`` and
receives what it missed, then the rest of the call. Events are kept in memory, bounded by
count and bytes, oldest dropped first; a client that comes back after its events were dropped
gets nothing replayed (and can still read the run with ``get_run``).

The SDK shares one event store among all sessions and names a stream by its request id, which
sessions reuse (every client's first call has a small id), so a plain store would replay one
session's messages to another. Here every event is tagged with its session and a replay only
ever sends the asking session's own events. The session comes from the HTTP request through a
context variable set by ``SessionScope``, the ASGI wrapper of the MCP app: a request's handlers
see it directly, and a session's message router (a task started while the session's opening
request was served) shares that request's scope object, which learns the new session id from
the response's ``Mcp-Session-Id`` header.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import JSONRPCMessage
from starlette.types import ASGIApp, Message, Receive, Scope, Send

RETRY_MS = 2000  # the reconnect delay suggested to clients in the priming event
MAX_EVENTS = 4096
MAX_BYTES = 64 * 1024 * 1024
SESSION_HEADER = b"mcp-session-id"


@dataclass
class _RequestScope:
    session: str | None  # None until the opening request's response names the new session


_SCOPE: ContextVar[_RequestScope | None] = ContextVar("fleet_mcp_request_scope", default=None)


class SessionScope:
    """ASGI wrapper: tells the event store which session each request (and its tasks) serve."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(SESSION_HEADER)
        box = _RequestScope(given.decode("latin-1") if given else None)

        async def send_learning_session(message: Message) -> None:
            if message["type"] == "http.response.start" and box.session is None:
                box.session = next(
                    (v.decode("latin-1") for k, v in message.get("headers", []) if k.lower() == SESSION_HEADER), None
                )
            await send(message)

        token = _SCOPE.set(box)
        try:
            await self.app(scope, receive, send_learning_session)
        finally:
            _SCOPE.reset(token)


@dataclass(frozen=True)
class _Event:
    session: str
    stream: StreamId
    message: JSONRPCMessage | None  # None: a priming event
    size: int


class SessionEvents(EventStore):
    """A bounded in-memory event log whose replays never cross sessions."""

    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> None:
        self.max_events, self.max_bytes = max_events, max_bytes
        self._events: OrderedDict[int, _Event] = OrderedDict()
        self._ids = itertools.count(1)
        self._bytes = 0

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = next(self._ids)
        session = _current_session()
        if session is None:  # outside a known session (its opening request): nothing can resume it
            return str(event_id)
        size = len(message.model_dump_json(by_alias=True, exclude_unset=True)) if message is not None else 0
        self._events[event_id] = _Event(session, stream_id, message, size)
        self._bytes += size
        while self._events and (len(self._events) > self.max_events or self._bytes > self.max_bytes):
            _, dropped = self._events.popitem(last=False)
            self._bytes -= dropped.size
        return str(event_id)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        try:
            after = int(last_event_id)
        except ValueError:
            return None
        first = self._events.get(after)
        session = _current_session()
        if first is None or session is None or first.session != session:
            return None  # unknown, dropped, or another session's event: nothing to replay
        later = [(i, e) for i, e in self._events.items() if i > after]
        for event_id, event in later:
            if event.session == session and event.stream == first.stream and event.message is not None:
                await send_callback(EventMessage(event.message, str(event_id)))
        return first.stream


def _current_session() -> str | None:
    scope = _SCOPE.get()
    return scope.session if scope else None
