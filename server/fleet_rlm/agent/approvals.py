"""Approvals: what a person is asked, which calls a policy may approve, and the gate every call passes.

A tool with side effects or network access is declared ``approval_mode="always_require"``, so the
framework pauses the turn before calling it. The host records an approval for each paused call (a person
decides it, or the policy below does when the user said "always" for this conversation, or an RLM run has
a cost cap within the threshold) and then resumes. The gate (a function middleware) is what makes the
record the authority: such a tool runs only when its call has an approved record that has not run yet,
claimed in one store transaction, so a rejected, expired, unknown or replayed call never runs. A
rejection is answered by the gate with the person's reason, which the model reads as the tool's result.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent_framework import FunctionInvocationContext, FunctionMiddleware

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.store import Store


def _quoted(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def summarize(tool: str, args: dict[str, Any], volume: str, settings: Settings) -> str:
    """One line saying exactly what the call will do, for the approval card and the audit log."""
    vol = args.get("volume") or volume
    if tool == "write_memory":
        text = str(args.get("text") or "")
        how = "append" if args.get("append") else "write"
        return f"{how} {len(text.encode())} bytes to vol:{vol}/memory/{args.get('path', '')}: {_quoted(text)}"
    if tool == "add_context_from_url":
        return (
            f"fetch {args.get('url')} as text into vol:{vol}/buffers/ (network access, up to "
            f"{settings.agent_fetch_max_mb} MB)"
        )
    if tool == "add_context_from_repo":
        ref = args.get("ref") or "the default branch"
        return (
            f"clone {args.get('url')} at {ref} into vol:{vol}/buffers/ (network access, up to "
            f"{settings.agent_fetch_max_mb} MB, no submodules, links skipped)"
        )
    if tool == "add_mcp_server":
        command = shlex.join([str(args.get("command") or ""), *[str(a) for a in args.get("args") or []]])
        return f"start the MCP server '{args.get('name')}' by running: {command}"
    if tool == "rlm_run":
        cap = args.get("max_cost")
        cost = "no cost cap" if cap is None else f"a cost cap of ${cap}"
        return f"start an RLM run with {cost}: {_quoted(args.get('question'))}"
    return f"call {tool}({_quoted(args, 200)})"


def policy_decision(tool: str, args: dict[str, Any], grants: list[str], settings: Settings) -> str | None:
    """Why a call needs no person (the actor recorded for it), or None to ask one."""
    if tool in grants:
        return "policy: always allowed in this conversation"
    cap = args.get("max_cost")
    if tool == "rlm_run" and isinstance(cap, int | float) and 0 < cap <= settings.agent_run_cost_threshold:
        return f"policy: cost cap ${cap} within the ${settings.agent_run_cost_threshold} threshold"
    return None


def rejected_text(approval: dict[str, Any]) -> str:
    reason = (approval.get("reason") or "").strip()
    return (
        f"Not done: the user rejected this call. Reason: {reason}"
        if reason
        else "Not done: the user rejected this call (no reason given)."
    )


class ApprovalGate(FunctionMiddleware):
    """Runs a tool that needs approval only under an approved, not yet executed record of its call."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def process(self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]) -> None:
        if getattr(context.function, "approval_mode", None) != "always_require":
            await call_next()
            return
        response = context.metadata.get("approval_response")
        approval_id = getattr(response, "id", None)
        approval = self.store.get_approval(approval_id) if approval_id else None
        if approval is None:
            context.result = "Not done: this call has no approval record, so it was not run."
            return
        if approval["status"] == "rejected":
            context.result = rejected_text(approval)
            return
        if approval["status"] != "approved":
            context.result = f"Not done: the approval is {approval['status']}."
            return
        claimed = await self.store.write(self.store.claim_execution, approval_id)
        if claimed is None:
            context.result = "Not run again: this approved call ran already."
            return
        await call_next()
