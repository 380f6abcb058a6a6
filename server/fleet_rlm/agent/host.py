"""The workspace agent's host: conversations, turns and approvals over one Engine. Every face calls this.

``AgentHost.of(engine)`` is the one host of an engine. A turn runs as a background task of the engine
(a face that stops listening does not stop it) and streams ``TurnEvent`` dicts to whoever follows its
``Feed``. When the agent wants a tool that needs approval, the turn records the approvals and pauses:
its state is the workflow's checkpoint in the store, so it outlives this process. Deciding the last
pending approval (``answer``, from any face, in any process) resumes the turn exactly there. Expired
approvals are closed out whenever the host is asked anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from agent_framework import Content, Message

from fleet_rlm.agent import views
from fleet_rlm.agent.approvals import approval_card, policy_decision
from fleet_rlm.agent.tools import TurnContext
from fleet_rlm.agent.turn import history, run_segment
from fleet_rlm.errors import Conflict, FleetError, NotFound, UserError
from fleet_rlm.redaction import redact_text
from fleet_rlm.store import Approval
from fleet_rlm.store.owners import owner_alive, process_start

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.store import AuditEntry, Conversation, Turn

log = logging.getLogger(__name__)
EXPIRED_RESULT = "Not done: nobody approved this call before its approval expired."
_HOSTS: weakref.WeakKeyDictionary[Engine, AgentHost] = weakref.WeakKeyDictionary()
TITLE_CHARS = 60  # what a list of conversations shows on one line
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:)?')  # a JSON string, and the colon after a key


def conversation_title(text: str, limit: int = TITLE_CHARS) -> str:
    """A readable title from a conversation's first message: the words of a JSON message (its string values,
    not its braces, keys and quotes), whitespace collapsed, cut at a word boundary with an ellipsis."""
    if text.lstrip()[:1] in ("{", "["):
        text = " ".join(_unquote(s) for s, key in _JSON_STRING.findall(text) if not key) or text
    words = " ".join(text.split())
    if len(words) <= limit:
        return words
    cut = words[: limit + 1].rsplit(" ", 1)[0]
    if len(cut) < limit // 2:  # one very long word: cut inside it rather than keep almost nothing
        cut = words[:limit]
    return cut.rstrip(" ,.;:") + "…"


def _unquote(literal: str) -> str:
    try:
        return str(json.loads(f'"{literal}"'))
    except ValueError:  # not valid JSON (a bad escape, a raw line break): its text as written
        return literal


class Feed:
    """The events of one turn segment, kept until it ends; any number of followers, each from the start."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.done = False
        self._changed = asyncio.Event()

    def put(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._wake()

    def close(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        seen = 0
        while True:
            waiting = self._changed
            while seen < len(self.events):
                seen += 1
                yield self.events[seen - 1]
            if self.done:
                return
            await waiting.wait()

    async def outcome(self) -> views.TurnOutcome:
        """Wait for the end of the segment; its ``turn.finished`` event as a model."""
        last: dict[str, Any] = {}
        async for event in self.follow():
            last = event
        return outcome_of(last)


def outcome_of(event: dict[str, Any]) -> views.TurnOutcome:
    return views.TurnOutcome(**{k: v for k, v in event.items() if k != "kind"})


class AgentHost:
    """Use ``AgentHost.of(engine)``; the engine must be open."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        pid = os.getpid()
        self._owner = (pid, socket.gethostname(), process_start(pid))
        self._live: dict[str, Feed] = {}  # conversation id -> the segment running here now
        self.store.agent.interrupt_turns(self._gone)

    @classmethod
    def of(cls, engine: Engine) -> AgentHost:
        host = _HOSTS.get(engine)
        if host is None or host.store is not engine.workspace.store:  # a reopened engine: a fresh host
            host = _HOSTS[engine] = cls(engine)
        return host

    @property
    def store(self) -> Any:
        return self.engine.workspace.store

    @property
    def settings(self) -> Any:
        return self.engine.settings  # the server may apply saved settings to its engine at any time

    def _gone(self, turn: Turn) -> bool:
        if turn.owner_host != self._owner[1] or turn.owner_pid is None:
            return False
        if turn.owner_pid == self._owner[0] and turn.owner_start == self._owner[2]:
            return turn.conversation_id not in self._live  # ours, but no task runs it any more
        return not owner_alive(turn.owner_pid, turn.owner_start)

    def expire(self) -> list[views.Approval]:
        """Close out approvals nobody answered in time (each call gets a 'not done' result)."""

        def result(approval: Approval) -> dict[str, Any]:
            content = Content.from_function_result(approval.call_id, result=EXPIRED_RESULT)
            return Message(role="tool", contents=[content]).to_dict()

        return [_approval_view(a) for a in self.store.agent.expire_approvals(result)]

    def _tidy(self) -> None:
        self.expire()
        self.store.agent.interrupt_turns(self._gone)

    # -- conversations ------------------------------------------------------------------------------

    async def create_conversation(self, title: str | None = None, volume: str | None = None) -> views.Conversation:
        from fleet_rlm.core.engine import new_id

        volume = volume or self.settings.agent_volume
        self.engine.workspace.check_volume_name(volume)
        conversation_id = new_id("c")
        title = conversation_title(title or "") or "New conversation"
        await self.store.write(
            self.store.agent.create_conversation, conversation_id, title, f"chat-{conversation_id}", volume
        )
        return self.conversation(conversation_id)

    def _row(self, conversation_id: str) -> Conversation:
        row = self.store.agent.get_conversation(conversation_id)
        if row is None:
            raise NotFound(
                f"no conversation '{conversation_id}': list them with GET /api/conversations, "
                "the MCP tool conversations, or `fleet --agent --list`"
            )
        return row

    def list_conversations(self, limit: int = 50, offset: int = 0) -> views.ConversationList:
        self.expire()
        rows = self.store.agent.list_conversations(limit=limit, offset=offset)
        return views.ConversationList(
            conversations=[views.ConversationSummary.model_validate(r, from_attributes=True) for r in rows],
            pending_approvals=self.pending_approvals(),
        )

    def conversation(self, conversation_id: str) -> views.Conversation:
        self._tidy()
        row = self._row(conversation_id)
        active = self.store.agent.active_turn(conversation_id)
        store = self.store
        return views.Conversation(
            id=row.id,
            title=row.title,
            session_id=row.session_id,
            volume=row.volume,
            created_at=row.created_at,
            updated_at=row.updated_at,
            status=active.status if active else "idle",
            grants=row.grants or [],
            mcp_servers=row.mcp_servers or [],
            messages=[
                views.ChatMessage.model_validate(m, from_attributes=True) for m in store.agent.messages(conversation_id)
            ],
            approvals=[_approval_view(a) for a in store.agent.list_approvals(conversation_id=conversation_id)],
            runs=[
                views.LinkedRun.model_validate(r, from_attributes=True)
                for r in store.agent.conversation_runs(conversation_id)
            ],
            attachments=[
                views.Attachment.model_validate(a, from_attributes=True)
                for a in store.agent.attachments(conversation_id)
            ],
            audit=[_audit_view(e) for e in store.agent.audit(conversation_id)],
        )

    async def attach(self, conversation_id: str, upload_ids: list[str]) -> None:
        """Attach uploaded files (``POST /api/uploads``) to a conversation: its runs read them."""
        from fleet_rlm.core.uploads import upload_paths

        self._row(conversation_id)
        upload_paths(self.store, self.settings, upload_ids)  # NotFound names an unknown upload
        await self.store.write(self.store.agent.attach, conversation_id, list(dict.fromkeys(upload_ids)))

    def approvals(
        self, *, status: str | None = None, conversation_id: str | None = None, turn_id: str | None = None
    ) -> list[views.Approval]:
        """Approvals, oldest first: all of them, or those with this status, conversation or turn."""
        rows = self.store.agent.list_approvals(status=status, conversation_id=conversation_id, turn_id=turn_id)
        return [_approval_view(a) for a in rows]

    def pending_approvals(self) -> list[views.Approval]:
        return self.approvals(status="pending")

    def audit(self, conversation_id: str | None = None, limit: int = 200) -> views.AuditLog:
        self.expire()
        return views.AuditLog(entries=[_audit_view(e) for e in self.store.agent.audit(conversation_id, limit)])

    # -- turns --------------------------------------------------------------------------------------

    async def send(self, conversation_id: str, text: str, upload_ids: list[str] | None = None) -> Feed:
        """Start a turn with the user's message; follow the returned feed for its events."""
        from fleet_rlm.core.engine import new_id

        if not text.strip():
            raise UserError("the message is empty: say what you want")
        await asyncio.to_thread(self._tidy)  # store writes: they wait for the writer, off the event loop
        conv = self._row(conversation_id)
        if upload_ids:
            await self.attach(conversation_id, upload_ids)
        _check_model(self.engine)
        turn_id = new_id("t")
        feed = self._reserve(conversation_id)
        try:
            await self.store.write(self.store.agent.create_turn, turn_id, conversation_id, self._owner)
            rows = self.store.agent.messages(conversation_id)
            message = Message(role="user", contents=[text])
            await self.store.write(
                self.store.agent.add_message, conversation_id, turn_id, "user", "text", message.to_dict(), text=text
            )
        except BaseException as exc:
            self._live.pop(conversation_id, None)
            if isinstance(exc, ValueError):  # create_turn: a turn of this conversation runs or waits
                raise self._busy(conversation_id, str(exc)) from None
            raise
        return self._start(conv, turn_id, [*history(rows), message], feed)

    async def answer(
        self, approval_id: str, approve: bool, *, reason: str | None = None, always: bool = False, actor: str
    ) -> tuple[views.Approval, Feed | None]:
        """Decide an approval; when it was the turn's last pending one, the turn resumes (follow the feed)."""
        await asyncio.to_thread(self.expire)
        known = self.store.agent.get_approval(approval_id)
        if known is None:
            raise NotFound(f"no approval '{approval_id}': answer one of the conversation's pending approvals")
        # Reserved first: once the store says the turn is ours to resume, nothing may take it for dead.
        feed = self._reserve(known.conversation_id)
        try:
            row, claimed = await self.store.write(
                self.store.agent.decide_approval,
                approval_id,
                approve,
                actor,
                (reason or "").strip() or None,
                always,
                self._owner,
            )
        except BaseException:
            self._live.pop(known.conversation_id, None)
            raise
        approval = _approval_view(row)
        if not claimed:
            self._live.pop(approval.conversation_id, None)
            return approval, None
        return approval, self._start(self._row(approval.conversation_id), approval.turn_id, None, feed)

    async def chat(self, conversation_id: str, text: str) -> views.TurnOutcome:
        """``send`` and wait for the turn to end or pause."""
        return await (await self.send(conversation_id, text)).outcome()

    def _reserve(self, conversation_id: str) -> Feed:
        """The feed of the conversation's next segment in this process; Conflict if one runs here now."""
        if conversation_id in self._live:
            raise self._busy(conversation_id, "a turn is running")
        feed = self._live[conversation_id] = Feed()
        return feed

    def _busy(self, conversation_id: str, why: str) -> Conflict:
        pending = self.store.agent.list_approvals(status="pending", conversation_id=conversation_id)
        fix = f"answer approval {pending[0].id} first" if pending else "wait for it to finish"
        return Conflict(f"this conversation is busy ({why}): {fix}")

    def _start(self, conv: Conversation, turn_id: str, messages: list[Message] | None, feed: Feed) -> Feed:
        feed.put({"kind": "turn.started", "turn_id": turn_id, "conversation_id": conv.id})
        self.engine.start_task(f"agent-{turn_id}-{time.monotonic_ns()}", self._drive(conv, turn_id, feed, messages))
        return feed

    async def _drive(self, conv: Conversation, turn_id: str, feed: Feed, messages: list[Message] | None) -> None:
        """Run segments until the agent answers, fails, or waits for a person."""
        tc = TurnContext(self.engine, conv, turn_id, feed.put)
        end: dict[str, Any] = {
            "kind": "turn.finished",
            "conversation_id": conv.id,
            "turn_id": turn_id,
            "status": "failed",
            "reply": "",
            "error": None,
            "pending": [],
            "runs": tc.runs,
        }
        try:
            while True:
                segment = await run_segment(tc, new_messages=messages)
                messages = None
                if segment.error:
                    end["error"] = segment.error
                    break
                if not segment.pending:
                    end.update(status="done", reply=segment.reply)
                    break
                waiting = await self._record(tc, segment.pending)
                if waiting:
                    end.update(status="paused", pending=[a.model_dump(mode="json") for a in waiting])
                    break
        except asyncio.CancelledError:
            end.update(status="interrupted", error="the turn was stopped (the server shut down?)")
            raise
        except FleetError as exc:
            end["error"] = exc.message
        except Exception as exc:  # a bug or an outage: the turn fails, the conversation goes on
            log.warning("agent turn %s failed", turn_id, exc_info=True)
            end["error"] = f"the agent failed: {type(exc).__name__}: {exc}"
        finally:
            end["error"] = redact_text(end["error"]) if end["error"] else None  # it reaches every face
            if end["status"] != "paused":
                with contextlib.suppress(Exception):
                    await self.store.write(self.store.agent.finish_turn, turn_id, end["status"], end["error"])
            self._live.pop(conv.id, None)
            feed.put(end)
            feed.close()

    async def _record(self, tc: TurnContext, requests: list[Content]) -> list[views.Approval]:
        """Record an approval per paused call (policy-decided ones approved at once) and pause the turn when a
        person must decide; returns what waits for a person."""
        conv = self._row(tc.conversation.id)
        now = time.time()
        rows: list[Approval] = []
        for request in requests:
            call = request.function_call
            args = call.parse_arguments() or {} if call is not None else {}
            tool = str(call.name) if call is not None else "unknown"
            # The card looks at the file a note would replace: volume I/O, off the event loop.
            card = await asyncio.to_thread(approval_card, tool, args, self.engine, conv.volume)
            actor = policy_decision(tool, args, conv.grants or [], card, self.engine)
            rows.append(
                Approval(
                    id=str(request.id),
                    conversation_id=conv.id,
                    turn_id=tc.turn_id,
                    call_id=str(call.call_id) if call is not None else "",
                    tool=tool,
                    arguments=args,
                    summary=card.summary,
                    blocked=card.blocked,
                    status="approved" if actor else "pending",
                    decided_by=actor,
                    reason=None,
                    always=False,
                    created_at=now,
                    expires_at=now + self.settings.agent_approval_ttl_seconds,
                    decided_at=now if actor else None,
                    executed_at=None,
                )
            )
        recorded = [
            _approval_view(r) for r in await self.store.write(self.store.agent.record_approvals, tc.turn_id, rows)
        ]
        for approval in recorded:
            kind = "approval.requested" if approval.status == "pending" else "approval.decided"
            tc.emit({"kind": kind, "approval": approval.model_dump(mode="json")})
        return [a for a in recorded if a.status == "pending"]


def _approval_view(approval: Approval) -> views.Approval:
    return views.Approval.model_validate(approval, from_attributes=True)


def _audit_view(entry: AuditEntry) -> views.AuditEntry:
    return views.AuditEntry.model_validate(entry, from_attributes=True)


def _check_model(engine: Engine) -> None:
    """Fail before a turn exists when the agent has no usable model (one sentence with the fix)."""
    from fleet_rlm.core.lm import build_lm

    build_lm(engine.settings, role="agent")
