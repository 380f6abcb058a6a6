"""What every face shows of the workspace agent: conversations, messages, approvals, the audit log, and
the outcome of a turn. MCP returns these models, the web API serializes them, the CLI draws them.

A turn streams ``TurnEvent`` dicts while it runs (``kind`` first, then the fields of that kind):

* ``turn.started`` (turn_id, conversation_id); ``text`` (text: a piece of the reply as it streams)
* ``tool.call`` (call_id, tool, arguments); ``tool.result`` (call_id, tool, result: a preview)
* ``run.started`` / ``run.progress`` (message) / ``run.finished`` (status): an RLM run the agent started
* ``approval.requested`` / ``approval.decided`` (approval: an ``Approval``)
* ``turn.finished`` (turn_id, status: done | paused | failed | interrupted, reply, error, pending): last
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

TurnStatus = Literal["running", "paused", "done", "failed", "interrupted", "expired"]
ApprovalStatus = Literal["pending", "approved", "rejected", "expired"]
PREVIEW = 2000


class Approval(BaseModel):
    """A call that waits for (or got) a person's decision before it runs."""

    id: str = Field(description="Pass it to approve (MCP), POST /api/approvals/{id}, or answer the CLI prompt.")
    conversation_id: str
    turn_id: str
    tool: str
    arguments: dict[str, Any]
    summary: str = Field(description="Exactly what the call will do: commands, arguments and paths as they are.")
    blocked: str | None = Field(
        None,
        description="Why it cannot be approved: the summary cannot show the call exactly (a configured secret, "
        "control characters, too long). Only a rejection is taken.",
    )
    status: ApprovalStatus
    decided_by: str | None = None
    reason: str | None = None
    always: bool = False
    created_at: float
    expires_at: float
    decided_at: float | None = None
    executed_at: float | None = None


class AuditEntry(BaseModel):
    """One line of the approval audit log: requested, approved, auto_approved, rejected, expired, executed,
    refused (its card no longer held when it ran)."""

    id: int
    conversation_id: str
    approval_id: str | None
    action: str
    tool: str
    summary: str
    actor: str
    reason: str | None = None
    created_at: float


class ChatMessage(BaseModel):
    """A message of a conversation: the user's or the agent's text, a tool call or a tool result."""

    id: int
    turn_id: str
    role: Literal["user", "assistant", "tool"]
    kind: Literal["text", "tool_call", "tool_result"]
    text: str | None = None
    call_id: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    created_at: float


class LinkedRun(BaseModel):
    """An RLM run the agent started in this conversation (its trace: /api/runs/{run_id}/trace)."""

    run_id: str
    turn_id: str
    status: str | None = None
    question: str | None = None


class Attachment(BaseModel):
    upload_id: str
    name: str
    size: int


class ConversationSummary(BaseModel):
    id: str
    title: str
    created_at: float
    updated_at: float
    pending: int = Field(0, description="Approvals waiting for a decision.")


class ConversationList(BaseModel):
    conversations: list[ConversationSummary]
    pending_approvals: list[Approval] = Field(description="Every pending approval, in any conversation.")


class Conversation(BaseModel):
    """A conversation with everything in it; ``session_id`` is the RLM session (REPL) its runs share."""

    id: str
    title: str
    session_id: str
    volume: str
    created_at: float
    updated_at: float
    status: Literal["idle", "running", "paused"]
    grants: list[str] = Field(description="Tools the user allowed always in this conversation.")
    mcp_servers: list[dict[str, Any]]
    messages: list[ChatMessage]
    approvals: list[Approval]
    runs: list[LinkedRun]
    attachments: list[Attachment]
    audit: list[AuditEntry] = Field(description="Newest first.")


class AuditLog(BaseModel):
    entries: list[AuditEntry]


class TurnOutcome(BaseModel):
    """How a turn (or its resumption after an approval) ended."""

    conversation_id: str
    turn_id: str
    status: TurnStatus
    reply: str = Field(description="The agent's answer text (empty while it waits for an approval).")
    error: str | None = None
    pending: list[Approval] = Field(default_factory=list, description="Approvals it waits for, if paused.")
    runs: list[str] = Field(default_factory=list, description="RLM runs started in this turn.")


class AnswerOutcome(BaseModel):
    """The result of deciding an approval: the decision, and the resumed turn when it went on."""

    approval: Approval
    turn: TurnOutcome | None = Field(None, description="Null while other approvals of the turn still wait.")
