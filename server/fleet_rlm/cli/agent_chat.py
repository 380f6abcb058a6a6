"""``fleet --agent``: the terminal chat with the workspace agent, approvals answered with y/n prompts.

The agent's reply streams to stdout; tool calls, RLM progress and approvals go to stderr. When a turn
pauses for an approval (this conversation's, or any conversation's waiting when the chat starts) the
chat asks: y (approve once), a (approve, and always for this conversation), n (reject, with a reason the
agent reads) or s (skip: it stays pending for another face). Only those words are answers (or yes, always,
no, skip): any other line, a new message too, is asked again, never read by its first letter. A call its
card cannot show exactly is offered n and s only. Ctrl-C stops waiting for a turn; the turn itself goes
on in the background until the chat ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_rlm.agent.approvals import Answer, parse_answer
from fleet_rlm.cli.chat import Chat, Interrupted
from fleet_rlm.cli.common import settings_for
from fleet_rlm.errors import UserError

if TYPE_CHECKING:
    from fleet_rlm.agent import AgentHost, Feed
    from fleet_rlm.agent.views import Approval

HELP = """Talk to the workspace agent, or:
  /attach FILE...     attach files to this conversation (the agent's RLM runs read them)
  /approvals          answer the approvals waiting in any conversation
  /audit              this conversation's approval log
  /conversations      list conversations        /switch ID   continue one
  /new                start a new conversation
  /help               this help                 /quit        leave (Ctrl-D, or Ctrl-C twice)"""
CHOICES = "[y]es / [a]lways in this conversation / [n]o / [s]kip"
BLOCKED_CHOICES = "[n]o / [s]kip"
BANNER = """fleet-rlm agent: talk about your files, runs and notes. It starts RLM runs over attached files and
volumes, reads traces and volumes, keeps notes in its memory, and pulls in web pages and git repositories.
Before anything with side effects or open-ended cost (writing memory, fetching, a run without a small cost
cap) it asks you first: [y]es / [a]lways in this conversation / [n]o (with a reason it reads) / [s]kip
(decide later with /approvals).
/help for commands, /quit to leave."""


class AgentChat(Chat):
    """The terminal chat's reading and Ctrl-C handling, with turns sent to the agent."""

    banner = BANNER
    help = HELP

    def __init__(self, engine: Any, args: argparse.Namespace) -> None:
        from fleet_rlm.agent import AgentHost

        super().__init__(engine, args)
        self.host: AgentHost = AgentHost.of(engine)
        self.conversation_id: str | None = None

    async def _conversation(self) -> str:
        if self.conversation_id is None:
            self.conversation_id = (await self.host.create_conversation("terminal chat")).id
            print(f"[conversation {self.conversation_id}]", file=sys.stderr)
        return self.conversation_id

    async def ask(self, question: str) -> None:
        feed = await self.host.send(await self._conversation(), question)
        await self.follow(feed)

    async def follow(self, feed: Feed) -> None:
        """Show a turn as it streams; then answer what it waits for."""
        end: dict[str, Any] = {}
        streaming = False
        try:
            async for event in _events(self, feed):
                kind = event["kind"]
                if kind == "text":
                    print(event["text"], end="", flush=True)
                    streaming = True
                    continue
                if streaming:
                    print()
                    streaming = False
                end = event if kind == "turn.finished" else end
                line = describe(event)
                if line:
                    print(line, file=sys.stderr)
        except Interrupted:
            print("\n(stopped waiting: the turn goes on in the background)", file=sys.stderr)
            return
        if streaming:
            print()
        if end.get("status") == "paused":
            from fleet_rlm.agent.views import Approval

            await self.decide([Approval(**a) for a in end["pending"]])

    async def decide(self, approvals: list[Approval]) -> None:
        for approval in approvals:
            print(f"\nThe agent asks to {approval.summary}", file=sys.stderr)
            if approval.blocked:
                print(f"It cannot be approved: {approval.blocked}.", file=sys.stderr)
            answer = await self.answer_for(approval)
            if answer is None:
                return
            if answer == "skip":
                print(f"left pending: approve it later with /approvals (id {approval.id})", file=sys.stderr)
                continue
            reason = None
            if answer == "no":
                reason = await self.interruptible(self.reader.read("reason (the agent reads it; optional): "))
            decided, feed = await self.host.answer(
                approval.id, answer != "no", reason=reason, always=answer == "always", actor="cli"
            )
            print(f"{decided.status}: {decided.summary}", file=sys.stderr)
            if feed is not None:
                self.conversation_id = decided.conversation_id
                await self.follow(feed)

    async def answer_for(self, approval: Approval) -> Answer | None:
        """The person's answer to one approval, asked until it is one of the offered words; None at the end
        of input."""
        choices, offered = (BLOCKED_CHOICES, ("no", "skip")) if approval.blocked else (CHOICES, None)
        while True:
            line = await self.interruptible(self.reader.read(f"approve ({choices})? "))
            if line is None:
                return None
            answer = parse_answer(line)
            if answer is not None and (offered is None or answer in offered):
                return answer
            print(f"not an answer: type one of {choices} (nothing was decided or sent)", file=sys.stderr)

    async def run_command(self, cmd: str, arg: str) -> bool:
        if cmd == "/attach":
            await self.attach_files(arg)
        elif cmd == "/approvals":
            pending = self.host.list_conversations().pending_approvals
            if not pending:
                print("no approval is waiting")
            await self.decide(pending)
        elif cmd == "/audit":
            for e in reversed(self.host.audit(self.conversation_id).entries):
                when = datetime.fromtimestamp(e.created_at).strftime("%Y-%m-%d %H:%M:%S")
                why = f" ({e.reason})" if e.reason else ""
                print(f"{when}  {e.action:<13} {e.actor:<10} {e.summary}{why}")
        elif cmd == "/conversations":
            for c in self.host.list_conversations().conversations:
                waiting = f"  ({c.pending} waiting)" if c.pending else ""
                print(f"{c.id}  {c.title[:60]}{waiting}")
        elif cmd == "/switch":
            self.conversation_id = self.host.conversation(arg).id
            print(f"[conversation {self.conversation_id}]", file=sys.stderr)
        elif cmd == "/new":
            self.conversation_id = None
            print("the next message starts a new conversation", file=sys.stderr)
        else:
            return False
        return True

    async def attach_files(self, arg: str) -> None:
        from fleet_rlm.core.uploads import UploadWriter

        paths = [Path(p).expanduser() for p in arg.split()] if arg else []
        try:
            missing = not paths or not all(p.is_file() for p in paths)
        except OSError as exc:  # a name too long for the file system, ...
            raise UserError(f"cannot attach '{exc.filename}': {exc.strerror}") from None
        if missing:
            raise UserError("give files that exist: /attach FILE... (folders: put them in a volume)")
        ids = []
        for path in paths:
            writer = UploadWriter(self.engine.settings, path.name)
            with path.open("rb") as source:
                while chunk := source.read(1 << 20):
                    writer.write(chunk)
            ids.append(writer.commit(self.engine.workspace)["upload_id"])
        await self.host.attach(await self._conversation(), ids)
        print(f"attached {', '.join(p.name for p in paths)}")

    async def loop(self) -> None:
        pending = self.host.list_conversations().pending_approvals
        if pending:
            print(f"{len(pending)} approval(s) wait for you:", file=sys.stderr)
            with contextlib.suppress(Interrupted):
                await self.decide(pending)
        await super().loop()


async def _events(chat: AgentChat, feed: Feed) -> Any:
    """The feed's events, each wait interruptible by Ctrl-C."""
    events = feed.follow()
    while True:
        try:
            yield await chat.interruptible(events.__anext__())
        except StopAsyncIteration:
            return


def describe(event: dict[str, Any]) -> str | None:
    """One stderr line for a turn event (text streams to stdout instead)."""
    kind = event["kind"]
    if kind == "tool.call":
        return f"→ {event['tool']}({json.dumps(event['arguments'], ensure_ascii=False)[:200]})"
    if kind == "tool.result":
        return f"← {event['tool']}: {event['result'][:200]}"
    if kind in ("run.started", "run.progress", "run.finished"):
        return f"  [run {event['run_id']}] {event.get('message') or event.get('status') or 'started'}"
    if kind == "approval.decided":
        return f"✓ {event['approval']['summary']} ({event['approval']['decided_by']})"
    if kind == "turn.finished" and event["status"] not in ("done", "paused"):
        return f"[turn {event['status']}: {event.get('error') or ''}]"
    return None


def cmd_agent_chat(args: argparse.Namespace) -> int:
    asyncio.run(run_agent_chat(settings_for(args), args))
    return 0


async def run_agent_chat(settings: Any, args: argparse.Namespace) -> None:
    from fleet_rlm.core.engine import Engine

    async with Engine(settings) as engine:
        await AgentChat(engine, args).run()
