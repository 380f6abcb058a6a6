"""Approvals: what a person is asked, which calls a policy may approve, and the gate every call passes.

A tool with side effects or network access is declared ``approval_mode="always_require"``, so the
framework pauses the turn before calling it. The host records an approval for each paused call with its
card (``approval_card``: one line saying exactly what will run, commands, arguments and resolved paths
shown as they are; a call no line could show exactly, for a configured secret, control characters or
length, is blocked: it can only be rejected). A person decides it (``parse_answer`` reads the answer, on
every face), or the policy below does when the user said "always" for this conversation, or an RLM run has
an enforceable cost cap within the threshold; then the turn resumes. The gate (a function middleware) is what makes the
record the authority: such a tool runs only when its call has an approved record that has not run yet,
claimed in one store transaction, so a rejected, expired, unknown or replayed call never runs. A
rejection is answered by the gate with the person's reason, which the model reads as the tool's result.
A card that shows a file's state (``write_memory``: a new file, or the file it replaces with its size and
digest) is checked again when the call runs: the gate makes the card anew and refuses the call when it
differs, and the write itself happens only over the file the card showed (``volumes.Expect``: a new file
only where nothing is), so a change in between is refused too. A refusal is audited and says a new card
is needed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from agent_framework import FunctionInvocationContext, FunctionMiddleware
from pydantic import BaseModel, BeforeValidator

from fleet_rlm.agent.tools import SHOWN_FILE, buffer_name, memory_target, repo_folder, volume_name
from fleet_rlm.errors import FleetError, NotFound
from fleet_rlm.redaction import holds_known_secret, redact_known
from fleet_rlm.volumes import Expect, VolumeChanged

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.store import Approval, Store

SHOWN_CHARS = 500  # the longest command, argument or path a card shows whole
SHOWN_CALL_CHARS = 2000  # the longest arguments of another tool (an MCP server's) a card shows whole
DIGEST_CHARS = 16  # of a file's sha256 on a card: which version of the file a write replaces
CHECKED_WHEN_RUN = frozenset({"write_memory"})  # tools whose card shows a file's state, made anew when they run

# -- what a person answers ---------------------------------------------------------------------------

Answer = Literal["yes", "always", "no", "skip"]
_ANSWERS: dict[str, Answer] = {
    "y": "yes",
    "yes": "yes",
    "a": "always",
    "always": "always",
    "n": "no",
    "no": "no",
    "s": "skip",
    "skip": "skip",
}


def parse_answer(text: str) -> Answer | None:
    """A person's answer to an approval: exactly one of y/yes, a/always, n/no, s/skip (any case, spaces
    around it ignored). Anything else, a new message starting with one of those letters too, is no answer."""
    return _ANSWERS.get(text.strip().lower())


def yes_no(value: object) -> bool:
    """A yes/no field of a decision (the web API's and MCP's ``approve``, ``always``): a boolean, or exactly
    yes or no as ``parse_answer`` reads them; anything else ("on", 1, "a") is refused, never taken for yes."""
    if isinstance(value, bool):
        return value
    answer = parse_answer(value) if isinstance(value, str) else None
    if answer not in ("yes", "no"):
        raise ValueError("answer true or false (or exactly yes or no)")
    return answer == "yes"


YesNo = Annotated[bool, BeforeValidator(yes_no)]

# -- what a person is shown ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """What a person is shown of a call: one line saying exactly what it will do, and why it cannot be
    approved when that line cannot show the call exactly (None: it can). A card of a file write also says
    which file (``target``, ``vol:NAME/PATH``) and what the write may replace as shown (``expect``; None
    when the card says it will fail)."""

    summary: str
    blocked: str | None = None
    target: str | None = None
    expect: Expect | None = None


@dataclass
class _Shown:
    """The parts of a summary, each checked that a person sees it as the call will use it."""

    problems: list[str] = field(default_factory=list)

    def exact(self, what: str, value: Any, limit: int = SHOWN_CHARS) -> str:
        """``value`` whole and as is (a command, an argument, a path, a URL)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if holds_known_secret(text):
            self.problems.append(f"{what} contains a configured secret")
        elif any(_hidden(c) for c in text):
            self.problems.append(f"{what} contains control or invisible characters")
        elif len(text) > limit:
            self.problems.append(f"{what} is too long to show whole ({len(text)} characters)")
        return text

    def content(self, what: str, value: Any) -> str:
        """A text the call carries (a note, a question): its start, escaped, as the size is shown beside it."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if holds_known_secret(text):
            self.problems.append(f"{what} contains a configured secret")
        return repr(text if len(text) <= 80 else text[:80] + "…")

    def card(self, summary: str, target: str | None = None, expect: Expect | None = None) -> Card:
        return Card(summary, "; ".join(self.problems) or None, target, expect)


def _hidden(char: str) -> bool:
    """A character a terminal or a page would not show as itself (controls, bidi overrides, zero-width)."""
    category = unicodedata.category(char)
    return category[0] == "C" or category in ("Zl", "Zp")


def approval_card(tool: str, args: dict[str, Any], engine: Engine, volume: str) -> Card:
    """The card of a call of ``tool`` in a conversation on ``volume``: for the person, the audit log and
    the store. Paths are resolved as the tool resolves them; secrets are masked by the store."""
    shown = _Shown()
    vol = shown.exact("the volume", args.get("volume") or volume)
    if tool == "write_memory":
        return _memory_card(shown, args, engine, vol)
    if tool == "add_context_from_url":
        name = args.get("name")
        file = shown.exact("the file name", buffer_name(name, ".txt")) if name else "(named after the page)"
        return shown.card(
            f"fetch {shown.exact('the URL', args.get('url'))} as text into vol:{vol}/buffers/{file} "
            f"(network access, up to {engine.settings.agent_fetch_max_mb} MB)"
        )
    if tool == "add_context_from_repo":
        url = shown.exact("the URL", args.get("url"))
        ref = shown.exact("the ref", args["ref"]) if args.get("ref") else "the default branch"
        folder = shown.exact("the folder", repo_folder(str(url), args.get("name")))
        return shown.card(
            f"clone {url} at {ref} into vol:{vol}/buffers/{folder}/ (network access, up to "
            f"{engine.settings.agent_fetch_max_mb} MB, no submodules, links skipped)"
        )
    if tool == "add_mcp_server":
        command = [shown.exact("the command", str(args.get("command") or ""))]
        command += [shown.exact(f"argument {i}", str(a)) for i, a in enumerate(args.get("args") or [], 1)]
        name = shown.exact("the name", args.get("name"))
        return shown.card(f"start the MCP server '{name}' by running: {shlex.join(command)}")
    if tool == "rlm_run":
        return shown.card(_run_summary(shown, args, engine))
    if tool == "fork_run":
        return shown.card(_fork_summary(shown, args))
    return shown.card(f"call {tool}({shown.exact('the arguments', args, SHOWN_CALL_CHARS)})")


def _memory_card(shown: _Shown, args: dict[str, Any], engine: Engine, vol: str) -> Card:
    text = str(args.get("text") or "")
    size, preview = f"{len(text.encode())} bytes", shown.content("the note", text)
    rel = shown.exact("the path", memory_target(str(args.get("path") or "")))
    where = f"vol:{vol}/{rel}"
    try:
        name = volume_name(engine, vol, None)
        entry = engine.workspace.file_entry(name, rel)
        version = _version(engine, name, rel) if entry.type == "file" else None
    except NotFound:
        return shown.card(f"write {size} to new file {where}: {preview}", where, Expect(sha256=None))
    except FleetError as exc:  # the tool will be refused the same way
        return shown.card(f"write {size} to {where}, which will fail ({exc.message}): {preview}", where)
    if version is None:
        now, expect = f"a {entry.type} now", None
    else:
        now, expect = f"{version[0]} bytes now, sha256 {version[1][:DIGEST_CHARS]}", Expect(version[1])
    if args.get("append"):
        return shown.card(f"append {size} to {where} ({now}): {preview}", where, expect)
    return shown.card(f"overwrite {where} ({now}) with {size}: {preview}", where, expect)


def _version(engine: Engine, volume: str, rel: str) -> tuple[int, str]:
    """The size and sha256 of a regular file of a volume (opened without following a link)."""
    fd, st = engine.workspace.open_file(volume, rel)
    with os.fdopen(fd, "rb") as f:
        return st.st_size, hashlib.file_digest(f, "sha256").hexdigest()


def _run_summary(shown: _Shown, args: dict[str, Any], engine: Engine) -> str:
    cap = args.get("max_cost")
    problem = cap_problem(engine, cap)
    if cap is None:
        cost = "no cost cap"
    elif problem:
        cost = f"a cost cap of ${cap} that cannot be enforced ({problem.rstrip('.')})"
    else:
        cost = f"a cost cap of ${cap}"
    inputs = [shown.exact("a volume path", p) for p in args.get("volume_paths") or []]
    if args.get("context_text"):
        inputs.append(f"text {shown.content('the text', args['context_text'])}")
    inputs += [f"the page {shown.exact('a URL', u)} (network access)" for u in args.get("urls") or []]
    if args.get("repo_url"):
        ref = shown.exact("the branch or tag", args.get("repo_ref") or "its default branch")
        inputs.append(f"the repository {shown.exact('the repository', args['repo_url'])} at {ref} (network access)")
    over = f" over {', '.join(inputs)}" if inputs else ""
    return f"start an RLM run with {cost}{over}: {shown.content('the question', args.get('question'))}"


def _fork_summary(shown: _Shown, args: dict[str, Any]) -> str:
    run, at = shown.exact("the run id", args.get("run_id")), shown.exact("the step", args.get("at"))
    if args.get("code") is not None:
        then = f"run code there {shown.content('the code', args['code'])}"
    elif args.get("instruction"):
        then = f"ask the model there with the instruction {shown.content('the instruction', args['instruction'])}"
    else:
        then = "ask the model there again"
    return (
        f"fork run {run} at step {at}: replay the steps before it from its record, {then}, then go on live "
        "with model calls and no cost cap"
    )


def cap_problem(engine: Engine, cap: Any) -> str | None:
    """Why a run could not enforce the cost cap ``cap`` (a model without a known price), or None."""
    if not isinstance(cap, int | float):
        return None
    try:
        engine.check_cost_cap(float(cap))
    except FleetError as exc:
        return exc.message
    return None


def policy_decision(tool: str, args: dict[str, Any], grants: list[str], card: Card, engine: Engine) -> str | None:
    """Why a call needs no person (the actor recorded for it), or None to ask one. A call whose card
    cannot show it exactly always goes to a person, who can only reject it."""
    if card.blocked:
        return None
    if tool in grants:
        return "policy: always allowed in this conversation"
    cap = args.get("max_cost")
    threshold = engine.settings.agent_run_cost_threshold
    if tool == "rlm_run" and isinstance(cap, int | float) and 0 < cap <= threshold and not cap_problem(engine, cap):
        return f"policy: cost cap ${cap} within the ${threshold} threshold"
    return None


def rejected_text(approval: Approval) -> str:
    reason = (approval.reason or "").strip()
    return (
        f"Not done: the user rejected this call. Reason: {reason}"
        if reason
        else "Not done: the user rejected this call (no reason given)."
    )


def changed_text(target: str, tool: str, why: str) -> str:
    """What the model reads when a call's card no longer holds when it runs."""
    return (
        f"Not done: {target} changed since the approval card was shown ({why}), so the approval does not "
        f"hold and a new card is needed: call {tool} again to ask the user with the file as it is now."
    )


class ApprovalGate(FunctionMiddleware):
    """Runs a tool that needs approval only under an approved, not yet executed record of its call, and
    a file write only while its card still holds."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.store: Store = engine.workspace.store

    async def process(self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]) -> None:
        if getattr(context.function, "approval_mode", None) != "always_require":
            await call_next()
            return
        response = context.metadata.get("approval_response")
        approval_id = getattr(response, "id", None)
        approval = self.store.agent.get_approval(approval_id) if approval_id else None
        if approval is None:
            context.result = "Not done: this call has no approval record, so it was not run."
            return
        if approval.status == "rejected":
            context.result = rejected_text(approval)
            return
        if approval.status != "approved":
            context.result = f"Not done: the approval is {approval.status}."
            return
        card = None
        if approval.tool in CHECKED_WHEN_RUN:
            card = await asyncio.to_thread(self._card_now, approval, _arguments(context))
            if redact_known(card.summary) != approval.summary:
                why = f"the card said {approval.summary!r}; now it would say {redact_known(card.summary)!r}"
                await self._refuse(context, approval, card, why)
                return
        claimed = await self.store.write(self.store.agent.claim_execution, approval_id)
        if claimed is None:
            context.result = "Not run again: this approved call ran already."
            return
        shown = SHOWN_FILE.set(card.expect if card else None)
        try:
            await call_next()
        except VolumeChanged as exc:  # changed between the check above and the write
            if card is None:
                raise
            await self._refuse(context, approval, card, exc.message)
        finally:
            SHOWN_FILE.reset(shown)

    def _card_now(self, approval: Approval, args: dict[str, Any]) -> Card:
        conversation = self.store.agent.get_conversation(approval.conversation_id)
        volume = conversation.volume if conversation else self.engine.settings.agent_volume
        return approval_card(approval.tool, args, self.engine, volume)

    async def _refuse(self, context: FunctionInvocationContext, approval: Approval, card: Card, why: str) -> None:
        target = card.target or "the file"
        reason = f"{target} changed since the approval card was shown: {why}"
        await self.store.write(self.store.agent.refuse_execution, approval.id, reason)
        context.result = changed_text(target, approval.tool, why)


def _arguments(context: FunctionInvocationContext) -> dict[str, Any]:
    """The arguments the tool will be called with, as a dict."""
    args = context.arguments
    if isinstance(args, BaseModel):
        return args.model_dump()
    return dict(args or {})
