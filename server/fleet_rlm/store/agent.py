"""The workspace agent's tables: conversations, turns, messages, approvals with their audit log, the runs
and uploads of a conversation, and the workflows' checkpoints (schema: ``store/db.py``, migrations 6 and 7).

``store.agent``: every write runs on the store's one writer thread (``writer.run``), reads use its
read connection (``read``); rows come back as frozen dataclasses. Decisions that must happen once are single
conditional UPDATEs in one transaction (an approval is decided once, a paused turn is resumed by one
process, an approved call runs once), so two faces, or two processes, answering the same approval
cannot both win. Free text a person or a model wrote is masked by ``redact`` on the way in, except an
approval's summary and arguments: a person must see those exactly, so only configured secret values
are masked there (``redact_known``); a call holding one is recorded ``blocked`` (``agent.approvals``),
and a blocked approval is never approved. Checkpoints are the framework's encoded state and are
deleted when their turn ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fleet_rlm.errors import Conflict
from fleet_rlm.redaction import redact, redact_known
from fleet_rlm.store.rows import Database, dumps, record, row_values, table_columns

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Tx

ACTIVE_TURNS = ("running", "paused")


@dataclass(frozen=True)
class Conversation:
    """A conversation with the workspace agent; ``session_id`` is the RLM session its runs share."""

    id: str
    title: str
    session_id: str
    volume: str
    grants: list[str]  # tools the user allowed always here
    mcp_servers: list[dict[str, Any]]
    created_at: float
    updated_at: float
    pending: int | None = None  # approvals waiting for a decision (counted by ``list_conversations`` only)


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: the user's message and what the agent did with it."""

    id: str
    conversation_id: str
    status: str  # running | paused | done | failed | interrupted | expired
    error: str | None
    owner_pid: int | None
    owner_host: str | None
    owner_start: str | None
    created_at: float
    finished_at: float | None


@dataclass(frozen=True)
class ChatMessage:
    """A message of a conversation; ``af`` is the framework's form of it (``Message.to_dict()``)."""

    id: int
    conversation_id: str
    turn_id: str
    role: str
    kind: str  # text | tool_call | tool_result
    text: str | None
    call_id: str | None
    tool: str | None
    arguments: Any  # a tool call's arguments (None for other messages)
    af: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class Approval:
    """A call that waits for (or got) a person's decision before it runs."""

    id: str
    conversation_id: str
    turn_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    summary: str
    blocked: str | None
    status: str  # pending | approved | rejected | expired
    decided_by: str | None
    reason: str | None
    always: bool
    created_at: float
    expires_at: float
    decided_at: float | None
    executed_at: float | None


@dataclass(frozen=True)
class AuditEntry:
    """One line of the approval audit log."""

    id: int
    conversation_id: str
    approval_id: str | None
    action: str  # requested | approved | auto_approved | rejected | expired | executed | refused
    tool: str
    summary: str
    actor: str
    reason: str | None
    created_at: float


@dataclass(frozen=True)
class LinkedRun:
    """An RLM run the agent started in a conversation, with the run's status and question (if it is kept)."""

    run_id: str
    turn_id: str
    created_at: float
    status: str | None
    question: str | None


@dataclass(frozen=True)
class Attachment:
    """An upload attached to a conversation."""

    upload_id: str
    name: str
    size: int


@dataclass(frozen=True)
class Checkpoint:
    """A turn's workflow state, in the framework's encoded form (``agent.checkpoints``)."""

    id: str
    workflow_name: str
    created_at: float
    data: dict[str, Any]


_CONV = table_columns(Conversation, json=("grants", "mcp_servers"), computed=("pending",))
_TURN = table_columns(Turn)
_MSG = table_columns(ChatMessage, json=("arguments", "af"))
_APPROVAL = table_columns(Approval, json=("arguments",))
_AUDIT = table_columns(AuditEntry)
_CHECKPOINT = table_columns(Checkpoint, json=("data",))


class DecisionRefused(Conflict):
    """An approval cannot be decided (unknown, already decided, expired); the message says which."""


def _approval(row: tuple[Any, ...]) -> Approval:
    """An approval row (``rows.record``), with its ``always`` as a bool."""
    out = record(_APPROVAL, row)
    return Approval(**{**out, "always": bool(out["always"])})


def _select(table: str, columns: tuple[str, ...]) -> str:
    return f"SELECT {', '.join(columns)} FROM {table}"


def _audit(tx: Tx, approval: Approval, action: str, actor: str, reason: str | None, now: float) -> None:
    tx.conn.execute(
        "INSERT INTO agent_audit (conversation_id, approval_id, action, tool, summary, actor, reason, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            approval.conversation_id,
            approval.id,
            action,
            approval.tool,
            approval.summary,
            actor,
            redact(reason),
            now,
        ),
    )


class AgentTables:
    """Conversations, turns, messages, approvals, audit, checkpoints (``store.agent``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- conversations ----------------------------------------------------------------------------

    def create_conversation(self, conversation_id: str, title: str, session_id: str, volume: str) -> Conversation:
        now = time.time()
        values = (conversation_id, redact(title), session_id, volume, "[]", "[]", now, now)

        def insert(tx: Tx) -> None:
            tx.conn.execute(
                f"INSERT INTO agent_conversations ({', '.join(_CONV)}) VALUES ({', '.join('?' * 8)})", values
            )

        self._db.writer.run(insert)
        return Conversation(**record(_CONV, values))

    def get_conversation(self, conversation_id: str) -> Conversation | None:
        rows = self._db.read(_select("agent_conversations", _CONV) + " WHERE id = ?", (conversation_id,))
        return Conversation(**record(_CONV, rows[0])) if rows else None

    def list_conversations(self, limit: int = 50, offset: int = 0) -> list[Conversation]:
        """Most recently active first, each with its count of pending approvals."""
        pending = (
            "(SELECT COUNT(*) FROM agent_approvals a WHERE a.conversation_id = agent_conversations.id"
            " AND a.status = 'pending')"
        )
        sql = (
            f"SELECT {', '.join(_CONV)}, {pending} FROM agent_conversations"
            " ORDER BY updated_at DESC, id DESC LIMIT ? OFFSET ?"
        )
        return [Conversation(**record(_CONV, r[:-1]), pending=r[-1]) for r in self._db.read(sql, (limit, offset))]

    def set_mcp_servers(self, conversation_id: str, servers: list[dict[str, Any]]) -> None:
        def update(tx: Tx) -> None:
            tx.conn.execute(
                "UPDATE agent_conversations SET mcp_servers_json = ?, updated_at = ? WHERE id = ?",
                (dumps(servers), time.time(), conversation_id),
            )

        self._db.writer.run(update)

    # -- turns ------------------------------------------------------------------------------------

    def create_turn(self, turn_id: str, conversation_id: str, owner: tuple[int, str, str | None]) -> None:
        """Record a running turn; ValueError if the conversation has a turn running or paused already."""
        now = time.time()

        def insert(tx: Tx) -> None:
            busy = tx.conn.execute(
                f"SELECT id, status FROM agent_turns WHERE conversation_id = ? AND status IN {ACTIVE_TURNS}",
                (conversation_id,),
            ).fetchone()
            if busy is not None:
                raise ValueError(f"turn {busy[0]} is {busy[1]}")
            tx.conn.execute(
                f"INSERT INTO agent_turns ({', '.join(_TURN)}) VALUES (?, ?, 'running', NULL, ?, ?, ?, ?, NULL)",
                (turn_id, conversation_id, *owner, now),
            )
            tx.conn.execute("UPDATE agent_conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))

        self._db.writer.run(insert)

    def finish_turn(self, turn_id: str, status: str, error: str | None = None) -> None:
        """Set a turn's status; a final one (not running or paused) also drops its checkpoints."""
        final = status not in ACTIVE_TURNS
        now = time.time()

        def update(tx: Tx) -> None:
            tx.conn.execute(
                "UPDATE agent_turns SET status = ?, error = ?, finished_at = ? WHERE id = ?",
                (status, redact(error), now if final else None, turn_id),
            )
            if final:
                tx.conn.execute("DELETE FROM agent_checkpoints WHERE workflow_name = ?", (workflow_name(turn_id),))

        self._db.writer.run(update)

    def get_turn(self, turn_id: str) -> Turn | None:
        rows = self._db.read(_select("agent_turns", _TURN) + " WHERE id = ?", (turn_id,))
        return Turn(*rows[0]) if rows else None

    def active_turn(self, conversation_id: str) -> Turn | None:
        sql = _select("agent_turns", _TURN) + f" WHERE conversation_id = ? AND status IN {ACTIVE_TURNS}"
        rows = self._db.read(sql, (conversation_id,))
        return Turn(*rows[0]) if rows else None

    def interrupt_turns(self, gone: Callable[[Turn], bool]) -> list[str]:
        """Close out running turns whose process is ``gone`` (a paused turn waits in the store, not a process)."""
        rows = [Turn(*r) for r in self._db.read(_select("agent_turns", _TURN) + " WHERE status = 'running'")]
        dead = [t.id for t in rows if gone(t)]
        for turn_id in dead:
            self.finish_turn(turn_id, "interrupted", "the process running this turn stopped")
        return dead

    # -- messages ---------------------------------------------------------------------------------

    def add_message(
        self,
        conversation_id: str,
        turn_id: str,
        role: str,
        kind: str,
        af: dict[str, Any],
        *,
        text: str | None = None,
        call_id: str | None = None,
        tool: str | None = None,
        arguments: Any = None,
    ) -> ChatMessage:
        """Append one message; ``af`` is the framework's form of it (``Message.to_dict()``)."""
        now = time.time()
        values = [
            conversation_id,
            turn_id,
            role,
            kind,
            redact(text),
            call_id,
            tool,
            None if arguments is None else dumps(redact(arguments)),
            dumps(redact(af)),
            now,
        ]

        def insert(tx: Tx) -> int:
            cur = tx.conn.execute(
                f"INSERT INTO agent_messages ({', '.join(_MSG[1:])}) VALUES ({', '.join('?' * 10)})", values
            )
            tx.conn.execute("UPDATE agent_conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            return int(cur.lastrowid or 0)

        message_id = self._db.writer.run(insert)
        return ChatMessage(**record(_MSG, (message_id, *values)))

    def messages(self, conversation_id: str) -> list[ChatMessage]:
        sql = _select("agent_messages", _MSG) + " WHERE conversation_id = ? ORDER BY id"
        return [ChatMessage(**record(_MSG, r)) for r in self._db.read(sql, (conversation_id,))]

    # -- approvals and the audit log ----------------------------------------------------------------

    def record_approvals(self, turn_id: str, approvals: list[Approval]) -> list[Approval]:
        """Record the approvals of a turn's paused calls (pending, or approved at once by a policy) with
        their audit entries, and mark the turn paused if any waits for a person, in one transaction: an
        answer can never come before the turn is resumable. Returns them as stored (masked, not executed)."""
        records = [
            replace(
                a,
                summary=redact_known(a.summary),
                arguments=redact_known(a.arguments),
                reason=redact(a.reason),
                executed_at=None,
            )
            for a in approvals
        ]

        def insert(tx: Tx) -> list[Approval]:
            for rec in records:
                tx.conn.execute(
                    f"INSERT INTO agent_approvals ({', '.join(_APPROVAL)}) VALUES ({', '.join('?' * len(_APPROVAL))})",
                    row_values(rec, _APPROVAL),  # sqlite stores the bool `always` as 0 or 1
                )
                _audit(tx, rec, "requested", "agent", None, rec.created_at)
                if rec.status == "approved":
                    _audit(tx, rec, "auto_approved", rec.decided_by or "policy", None, rec.created_at)
            if any(rec.status == "pending" for rec in records):
                tx.conn.execute("UPDATE agent_turns SET status = 'paused' WHERE id = ?", (turn_id,))
            return records

        return self._db.writer.run(insert)

    def get_approval(self, approval_id: str) -> Approval | None:
        rows = self._db.read(_select("agent_approvals", _APPROVAL) + " WHERE id = ?", (approval_id,))
        return _approval(rows[0]) if rows else None

    def list_approvals(
        self, *, status: str | None = None, conversation_id: str | None = None, turn_id: str | None = None
    ) -> list[Approval]:
        where, params = [], []
        for column, value in (("status", status), ("conversation_id", conversation_id), ("turn_id", turn_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = _select("agent_approvals", _APPROVAL) + (f" WHERE {' AND '.join(where)}" if where else "")
        return [_approval(r) for r in self._db.read(sql + " ORDER BY created_at, id", tuple(params))]

    def decide_approval(
        self, approval_id: str, approve: bool, actor: str, reason: str | None, always: bool, owner: tuple[Any, ...]
    ) -> tuple[Approval, bool]:
        """Decide a pending approval once, with its audit entry; "always" also grants the tool for the
        conversation. Returns the approval and whether the caller now owns resuming its turn (no other
        approval of the turn is pending, and the paused turn was claimed for this process).
        DecisionRefused when it is unknown, decided already, or expired, or asked to approve a blocked one."""
        now = time.time()

        def decide(tx: Tx) -> tuple[Approval, bool]:
            row = tx.conn.execute(_select("agent_approvals", _APPROVAL) + " WHERE id = ?", (approval_id,)).fetchone()
            if row is None:
                raise DecisionRefused(f"no approval '{approval_id}'")
            approval = _approval(row)
            if approval.status == "pending" and approval.expires_at <= now:
                raise DecisionRefused(f"approval '{approval_id}' expired before it was answered")
            if approval.status != "pending":
                raise DecisionRefused(f"approval '{approval_id}' is {approval.status} already")
            if approve and approval.blocked:
                raise DecisionRefused(f"approval '{approval_id}' cannot be approved ({approval.blocked}): reject it")
            status = "approved" if approve else "rejected"
            tx.conn.execute(
                "UPDATE agent_approvals SET status = ?, decided_by = ?, reason = ?, always = ?, decided_at = ?"
                " WHERE id = ? AND status = 'pending'",
                (status, actor, redact(reason), int(always and approve), now, approval_id),
            )
            _audit(tx, approval, status, actor, reason, now)
            if always and approve:
                (grants_json,) = tx.conn.execute(
                    "SELECT grants_json FROM agent_conversations WHERE id = ?", (approval.conversation_id,)
                ).fetchone()
                grants = sorted({*json.loads(grants_json), approval.tool})
                tx.conn.execute(
                    "UPDATE agent_conversations SET grants_json = ? WHERE id = ?",
                    (dumps(grants), approval.conversation_id),
                )
            waiting = tx.conn.execute(
                "SELECT COUNT(*) FROM agent_approvals WHERE turn_id = ? AND status = 'pending'", (approval.turn_id,)
            ).fetchone()[0]
            claimed = False
            if not waiting:
                cur = tx.conn.execute(
                    "UPDATE agent_turns SET status = 'running', owner_pid = ?, owner_host = ?, owner_start = ?"
                    " WHERE id = ? AND status = 'paused'",
                    (*owner, approval.turn_id),
                )
                claimed = cur.rowcount == 1
            decided = replace(
                approval, status=status, decided_by=actor, reason=reason, always=always and approve, decided_at=now
            )
            return decided, claimed

        return self._db.writer.run(decide)

    def expire_approvals(self, result_af: Callable[[Approval], dict[str, Any]]) -> list[Approval]:
        """Expire pending approvals past their time, with audit entries. A paused turn left with nothing
        pending ends as ``expired`` and each expired call gets the tool result ``result_af(approval)``,
        so the conversation's history stays whole."""
        now = time.time()

        def expire(tx: Tx) -> list[Approval]:
            rows = tx.conn.execute(
                _select("agent_approvals", _APPROVAL) + " WHERE status = 'pending' AND expires_at <= ?", (now,)
            ).fetchall()
            expired = []
            for approval in map(_approval, rows):
                tx.conn.execute(
                    "UPDATE agent_approvals SET status = 'expired', decided_at = ? WHERE id = ?", (now, approval.id)
                )
                _audit(tx, approval, "expired", "system", "nobody answered in time", now)
                af = result_af(approval)
                tx.conn.execute(
                    f"INSERT INTO agent_messages ({', '.join(_MSG[1:])}) VALUES (?, ?, 'tool', 'tool_result', ?, ?,"
                    " ?, NULL, ?, ?)",
                    (
                        approval.conversation_id,
                        approval.turn_id,
                        "not run: the approval expired",
                        approval.call_id,
                        approval.tool,
                        dumps(af),
                        now,
                    ),
                )
                expired.append(replace(approval, status="expired"))
            for turn_id in {a.turn_id for a in expired}:
                waiting = tx.conn.execute(
                    "SELECT COUNT(*) FROM agent_approvals WHERE turn_id = ? AND status = 'pending'", (turn_id,)
                ).fetchone()[0]
                if not waiting:
                    tx.conn.execute(
                        "UPDATE agent_turns SET status = 'expired', finished_at = ? WHERE id = ? AND status = 'paused'",
                        (now, turn_id),
                    )
                    tx.conn.execute("DELETE FROM agent_checkpoints WHERE workflow_name = ?", (workflow_name(turn_id),))
            return expired

        return self._db.writer.run(expire)

    def claim_execution(self, approval_id: str) -> Approval | None:
        """Mark an approved call as executing, once: the approval when this caller may run the tool,
        None when it is not approved or ran already (a replayed checkpoint must not run it twice)."""
        now = time.time()

        def claim(tx: Tx) -> Approval | None:
            cur = tx.conn.execute(
                "UPDATE agent_approvals SET executed_at = ?"
                " WHERE id = ? AND status = 'approved' AND executed_at IS NULL",
                (now, approval_id),
            )
            if cur.rowcount != 1:
                return None
            approval = _approval(
                tx.conn.execute(_select("agent_approvals", _APPROVAL) + " WHERE id = ?", (approval_id,)).fetchone()
            )
            _audit(tx, approval, "executed", "agent", None, now)
            return approval

        return self._db.writer.run(claim)

    def refuse_execution(self, approval_id: str, reason: str) -> None:
        """Audit an approved call the gate refused to run, and why (its card no longer holds)."""
        now = time.time()

        def refuse(tx: Tx) -> None:
            row = tx.conn.execute(_select("agent_approvals", _APPROVAL) + " WHERE id = ?", (approval_id,)).fetchone()
            if row is not None:
                _audit(tx, _approval(row), "refused", "system", reason, now)

        self._db.writer.run(refuse)

    def audit(self, conversation_id: str | None = None, limit: int = 200) -> list[AuditEntry]:
        """Newest first."""
        where = " WHERE conversation_id = ?" if conversation_id else ""
        params: tuple[Any, ...] = (conversation_id, limit) if conversation_id else (limit,)
        sql = _select("agent_audit", _AUDIT) + where + " ORDER BY id DESC LIMIT ?"
        return [AuditEntry(*r) for r in self._db.read(sql, params)]

    # -- runs and attachments -----------------------------------------------------------------------

    def link_run(self, conversation_id: str, run_id: str, turn_id: str) -> None:
        def insert(tx: Tx) -> None:
            tx.conn.execute(
                "INSERT OR IGNORE INTO agent_runs (conversation_id, run_id, turn_id, created_at) VALUES (?, ?, ?, ?)",
                (conversation_id, run_id, turn_id, time.time()),
            )

        self._db.writer.run(insert)

    def conversation_runs(self, conversation_id: str) -> list[LinkedRun]:
        sql = (
            "SELECT c.run_id, c.turn_id, c.created_at, r.status, r.question FROM agent_runs c"
            " LEFT JOIN runs r ON r.id = c.run_id WHERE c.conversation_id = ? ORDER BY c.created_at"
        )
        return [LinkedRun(*r) for r in self._db.read(sql, (conversation_id,))]

    def attach(self, conversation_id: str, upload_ids: list[str]) -> None:
        now = time.time()

        def insert(tx: Tx) -> None:
            tx.conn.executemany(
                "INSERT OR IGNORE INTO agent_attachments (conversation_id, upload_id, created_at) VALUES (?, ?, ?)",
                [(conversation_id, u, now) for u in upload_ids],
            )

        self._db.writer.run(insert)

    def attachments(self, conversation_id: str) -> list[Attachment]:
        sql = (
            "SELECT a.upload_id, u.name, u.size FROM agent_attachments a JOIN uploads u ON u.id = a.upload_id"
            " WHERE a.conversation_id = ? ORDER BY a.created_at, a.upload_id"
        )
        return [Attachment(*r) for r in self._db.read(sql, (conversation_id,))]

    # -- checkpoints (agent.checkpoints.StoreCheckpointStorage) --------------------------------------

    def save_checkpoint(self, checkpoint_id: str, workflow: str, data: dict[str, Any]) -> None:
        payload = dumps(data)

        def upsert(tx: Tx) -> None:
            tx.conn.execute(
                "INSERT OR REPLACE INTO agent_checkpoints (id, workflow_name, created_at, data_json)"
                " VALUES (?, ?, ?, ?)",
                (checkpoint_id, workflow, time.time(), payload),
            )

        self._db.writer.run(upsert)

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        rows = self._db.read(_select("agent_checkpoints", _CHECKPOINT) + " WHERE id = ?", (checkpoint_id,))
        return Checkpoint(**record(_CHECKPOINT, rows[0])) if rows else None

    def workflow_checkpoints(self, workflow: str) -> list[Checkpoint]:
        """Oldest first."""
        sql = _select("agent_checkpoints", _CHECKPOINT) + " WHERE workflow_name = ? ORDER BY created_at, rowid"
        return [Checkpoint(**record(_CHECKPOINT, r)) for r in self._db.read(sql, (workflow,))]

    def delete_checkpoint(self, checkpoint_id: str) -> bool:
        def delete(tx: Tx) -> bool:
            return tx.conn.execute("DELETE FROM agent_checkpoints WHERE id = ?", (checkpoint_id,)).rowcount == 1

        return self._db.writer.run(delete)


def workflow_name(turn_id: str) -> str:
    """The workflow of one turn: its checkpoints are found (and dropped) by this name."""
    return f"fleet-agent-turn:{turn_id}"
