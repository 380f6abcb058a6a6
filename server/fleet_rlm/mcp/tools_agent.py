"""The workspace agent over MCP: ``chat``, ``approve`` and ``conversations``.

When a turn pauses for an approval, ``chat`` asks the person through the client's elicitation where the
client supports it: mid-tool on the 2025-11-25 era (a request to the client while the call waits), and on
2026-07-28 by answering ``InputRequiredResult``, with which the client calls again carrying the answers
(the request state is sealed with this process's key, so after a restart the old request cannot be
resumed: the approval is answered from any face instead). Otherwise, or when the person dismisses the
question, the result says how to approve: the ``approve`` tool, the web Workbench's Chat mode, or
`fleet --agent`. Declining is a rejection; the agent reads the reason.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from fleet_rlm.agent.approvals import YesNo
from fleet_rlm.agent.views import Approval, TurnOutcome
from fleet_rlm.mcp.views import user_errors
from mcp import types

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.agent import AgentHost
    from fleet_rlm.mcp.provider import EngineProvider

INPUT_REQUIRED_ERA = "2026-07-28"
PENDING_FIELDS = {"id", "tool", "summary", "blocked", "expires_at"}
HOW_TO_APPROVE = (
    "The agent waits for approval {ids}. Approve or reject with the approve tool (approval_id, approve, reason), "
    "in the web Workbench's Chat mode (`fleet web`), or in the terminal with `fleet --agent`."
)


class ApprovalForm(BaseModel):
    """What the person answers (flat, as elicitation requires)."""

    approve: YesNo = Field(description="Let the agent do this?")
    reason: str = Field("", description="Why (the agent reads it).")
    always: YesNo = Field(False, description="Allow this tool without asking for the rest of the conversation.")


class PendingApproval(BaseModel):
    id: str
    tool: str
    summary: str
    blocked: str | None = Field(None, description="Why it cannot be approved, only rejected (see Approval).")
    expires_at: float


class ChatOutput(BaseModel):
    conversation_id: str
    turn_id: str
    status: str = Field(description="done | paused (waiting for an approval) | failed | interrupted")
    reply: str
    error: str | None = None
    pending: list[PendingApproval] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list, description="RLM runs started in this turn (inspect_trace them).")
    how_to_approve: str | None = Field(None, description="Set while the turn waits for an approval.")


class ApproveOutput(BaseModel):
    approval_id: str
    status: str = Field(description="approved | rejected")
    turn: ChatOutput | None = Field(None, description="The resumed turn; null while other approvals still wait.")


class ConversationsOutput(BaseModel):
    conversations: list[dict[str, Any]] = Field(description="id, title, updated_at, pending approvals.")
    pending_approvals: list[PendingApproval]
    conversation: dict[str, Any] | None = Field(
        None, description="The one asked for: messages, approvals, audit log (newest first), linked runs."
    )


def _output(outcome: TurnOutcome) -> ChatOutput:
    pending = [PendingApproval(**a.model_dump(include=PENDING_FIELDS)) for a in outcome.pending]
    how = HOW_TO_APPROVE.format(ids=", ".join(p.id for p in pending)) if pending else None
    return ChatOutput(**outcome.model_dump(exclude={"pending"}), pending=pending, how_to_approve=how)


def _question(approval: Approval) -> types.ElicitRequest:
    ask = f"It cannot be approved ({approval.blocked}): reject it?" if approval.blocked else "Approve?"
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message=f"The fleet-rlm agent asks to {approval.summary}. {ask}",
            requested_schema=render_elicitation_schema(ApprovalForm),
        )
    )


async def _decide(
    host: AgentHost, approval: Approval, action: str, content: dict[str, Any] | None
) -> TurnOutcome | None:
    """Apply one elicitation answer; the resumed turn's outcome, or None (dismissed, or others still wait)."""
    if action == "cancel":
        return None  # dismissed: it stays pending, answerable from any face
    form = ApprovalForm.model_validate(content or {}) if action == "accept" else None
    approve = bool(form and form.approve)
    if approve and approval.blocked:
        return None  # it cannot be approved: it stays pending, and the result lists it with the reason
    reason = (form.reason if form else "") or (None if approve else "declined in the MCP client")
    _, feed = await host.answer(approval.id, approve, reason=reason, always=bool(form and form.always), actor="mcp")
    return await feed.outcome() if feed else None


async def _settle(host: AgentHost, outcome: TurnOutcome, ctx: Context) -> ChatOutput | types.InputRequiredResult:
    """Ask the person about each pending approval while the client can be asked; then the outcome."""
    caps = ctx.client_capabilities
    while outcome.status == "paused" and caps is not None and caps.elicitation is not None:
        if ctx.protocol_version == INPUT_REQUIRED_ERA:
            state = json.dumps({"conversation_id": outcome.conversation_id, "turn_id": outcome.turn_id})
            return types.InputRequiredResult(
                input_requests={a.id: _question(a) for a in outcome.pending}, request_state=state
            )
        resumed = None
        for approval in outcome.pending:
            answer = await ctx.session.elicit_form(
                _question(approval).params.message,
                render_elicitation_schema(ApprovalForm),
                related_request_id=ctx.request_id,
            )
            resumed = await _decide(host, approval, answer.action, answer.content) or resumed
        if resumed is None:
            break
        outcome = resumed
    return _output(outcome)


async def _from_answers(host: AgentHost, ctx: Context) -> TurnOutcome:
    """The second round on 2026-07-28: apply the client's answers to the approvals we asked about."""
    state = json.loads(ctx.request_state or "{}")
    answers = ctx.input_responses or {}
    resumed = None
    asked = [a for a in host.approvals(turn_id=state.get("turn_id")) if a.id in answers]
    for approval in asked:
        answer = answers[approval.id]
        if approval.status == "pending" and isinstance(answer, types.ElicitResult):
            resumed = await _decide(host, approval, answer.action, answer.content) or resumed
    if resumed is not None:
        return resumed
    view = await anyio.to_thread.run_sync(host.conversation, state["conversation_id"])  # it may write: off the loop
    pending = [a for a in view.approvals if a.status == "pending" and a.turn_id == state.get("turn_id")]
    return TurnOutcome(
        conversation_id=view.id,
        turn_id=state.get("turn_id", ""),
        status="paused" if pending else "done",
        reply="",
        pending=pending,
    )


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    async def agent_host() -> AgentHost:
        from fleet_rlm.agent import AgentHost

        with user_errors():
            return AgentHost.of(await provider.get())

    @server.tool(
        title="Chat with the workspace agent",
        description=(
            "Talk to the fleet-rlm workspace agent: it answers from your files and volumes, decides when a "
            "question needs an RLM run, reads and updates its memory volume, and pulls in web pages or "
            "repositories. Actions with side effects wait for the user's approval: asked here when this client "
            "supports elicitation, else the result says how to approve. Omit conversation_id to start a new "
            "conversation; pass the returned one to continue it (the same RLM session and history)."
        ),
        annotations=ToolAnnotations(
            title="Chat", read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
        ),
    )
    async def chat(
        message: Annotated[str, Field(min_length=1, description="Your message to the agent.")],
        ctx: Context,
        conversation_id: Annotated[
            str | None, Field(description="Continue this conversation; omit to start one.")
        ] = None,
    ) -> ChatOutput | types.InputRequiredResult:
        host = await agent_host()
        with user_errors():
            if ctx.request_state is not None:
                outcome = await _from_answers(host, ctx)
            else:
                if conversation_id is None:
                    conversation_id = (await host.create_conversation(message)).id
                outcome = await host.chat(conversation_id, message)
            return await _settle(host, outcome, ctx)

    @server.tool(
        title="Approve or reject an agent action",
        description=(
            "Decide an action the workspace agent waits for (ids from chat's pending list or conversations). "
            "Approving runs it once and the agent's turn goes on where it stopped; rejecting tells the agent "
            "your reason. always=true also allows the tool for the rest of that conversation."
        ),
        annotations=ToolAnnotations(
            title="Approve", read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
        ),
    )
    async def approve(
        approval_id: Annotated[str, Field(min_length=1, description="The approval's id.")],
        approve: Annotated[YesNo, Field(description="true: let the agent do it; false: reject it.")],
        reason: Annotated[str | None, Field(description="Why; the agent reads it.")] = None,
        always: Annotated[YesNo, Field(description="Also allow this tool for the rest of the conversation.")] = False,
    ) -> ApproveOutput:
        host = await agent_host()
        with user_errors():
            approval, feed = await host.answer(approval_id, approve, reason=reason, always=always, actor="mcp")
            turn = _output(await feed.outcome()) if feed else None
        return ApproveOutput(approval_id=approval.id, status=approval.status, turn=turn)

    @server.tool(
        title="List agent conversations",
        description=(
            "Conversations with the workspace agent and every pending approval; with conversation_id, that "
            "conversation in full: messages, tool calls, approvals, the audit log of approvals and rejections, "
            "and the RLM runs it started."
        ),
        annotations=ToolAnnotations(
            title="Conversations",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def conversations(
        conversation_id: Annotated[str | None, Field(description="Show this conversation in full.")] = None,
    ) -> ConversationsOutput:
        host = await agent_host()
        with user_errors():  # both close out expired approvals and dead turns, store writes: off the loop
            listing = await anyio.to_thread.run_sync(host.list_conversations)
            shown = await anyio.to_thread.run_sync(host.conversation, conversation_id) if conversation_id else None
            one = shown.model_dump(mode="json") if shown else None
        pending = [PendingApproval(**a.model_dump(include=PENDING_FIELDS)) for a in listing.pending_approvals]
        return ConversationsOutput(
            conversations=[c.model_dump(mode="json") for c in listing.conversations],
            pending_approvals=pending,
            conversation=one,
        )
