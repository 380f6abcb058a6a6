"""One segment of a turn: a workflow built for it, run until the agent answers or asks for approvals.

Workflow instances do not support concurrent runs, so every segment builds its own: the agent (its
tools bound to this turn) in an ``AgentExecutor``, checkpointed in the store under the turn's workflow
name. A first segment starts from the conversation's history plus the new message; a resumed segment
loads the turn's latest checkpoint (any process may, after a restart too) and answers its pending
approval requests. What streams out becomes turn events (text, tool calls and results) and stored
messages; the pending requests come back to the host, which records approvals for them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from agent_framework import (
    Agent,
    AgentExecutor,
    AgentResponseUpdate,
    Content,
    MCPStdioTool,
    Message,
    WorkflowBuilder,
)

from fleet_rlm.agent.approvals import ApprovalGate
from fleet_rlm.agent.checkpoints import StoreCheckpointStorage
from fleet_rlm.agent.client import ModelChatClient, result_text
from fleet_rlm.agent.tools import TurnContext, build_tools
from fleet_rlm.agent.views import PREVIEW
from fleet_rlm.errors import Conflict
from fleet_rlm.redaction import redact
from fleet_rlm.store.agent import ChatMessage, workflow_name

EXECUTOR_ID = "agent"  # the graph must be the same in every process that resumes it

INSTRUCTIONS = """\
You are the fleet-rlm workspace agent. You help the user with their workspace: files they attached to
this conversation, their volumes (memory/ notes kept across conversations, buffers/ with pulled-in
context, artifacts/ with results) and their recursive language model (RLM) runs.

- When an answer depends on the contents of files, call rlm_run with a precise, self-contained question;
  never guess file contents. Answer from its result and mention the run id.
- To remember something for later, call write_memory. To pull in a web page or a repository, call
  add_context_from_url or add_context_from_repo, then read it with rlm_run ('vol:NAME/buffers/...').
- Some tools wait for the user's approval. If a tool result says the user rejected a call, do not retry
  it: tell the user it was not done and why.
- Be brief."""


@dataclass
class Segment:
    """What one segment produced."""

    pending: list[Content] = field(default_factory=list)  # function_approval_request contents
    reply: str = ""
    error: str | None = None


def instructions(tc: TurnContext) -> str:
    conv = tc.conversation
    files = tc.store.agent.attachments(conv.id)
    attached = ", ".join(f"{a.name} ({a.size} bytes)" for a in files) or "none"
    return (
        f"{INSTRUCTIONS}\n\nThis conversation's volume: {conv.volume}. Attached files: {attached}."
        f" Tools the user allowed always here: {', '.join(conv.grants) or 'none'}."
    )


def history(rows: list[ChatMessage]) -> list[Message]:
    """The stored conversation as framework messages; a tool call that never got a result (its turn
    failed or was interrupted) is left out, as providers refuse a call without its result."""
    answered = {r.call_id for r in rows if r.kind == "tool_result"}
    return [Message.from_dict(r.af) for r in rows if r.kind != "tool_call" or r.call_id in answered]


class Recorder:
    """Turns streamed updates into turn events and stored messages (each call and result once)."""

    def __init__(self, tc: TurnContext, seen: set[str]) -> None:
        self.tc = tc
        self.seen = seen  # "call:<id>" / "result:<id>" already stored for this turn
        self.text: list[str] = []
        self.reply: list[str] = []
        self.names: dict[str, str] = {}

    async def _store(self, role: str, kind: str, af: Message, **fields: Any) -> None:
        store, conv = self.tc.store, self.tc.conversation
        await store.write(store.agent.add_message, conv.id, self.tc.turn_id, role, kind, af.to_dict(), **fields)

    async def flush(self) -> None:
        if self.text:
            text, self.text = "".join(self.text), []
            await self._store("assistant", "text", Message(role="assistant", contents=[text]), text=text)

    async def feed(self, update: AgentResponseUpdate) -> None:
        for content in update.contents:
            if content.type == "text" and content.text:
                self.text.append(content.text)
                self.reply.append(content.text)
                self.tc.emit({"kind": "text", "text": content.text})
            elif content.type == "function_call" and f"call:{content.call_id}" not in self.seen:
                await self.flush()
                self.seen.add(f"call:{content.call_id}")
                self.reply = []
                args = content.parse_arguments() or {}
                self.names[str(content.call_id)] = str(content.name)
                call = Content.from_function_call(str(content.call_id), str(content.name), arguments=json.dumps(args))
                await self._store(
                    "assistant",
                    "tool_call",
                    Message(role="assistant", contents=[call]),
                    call_id=content.call_id,
                    tool=content.name,
                    arguments=args,
                )
                # Masked as the stored row is: a live event never carries a secret.
                shown = redact(args)
                self.tc.emit(
                    {"kind": "tool.call", "call_id": content.call_id, "tool": content.name, "arguments": shown}
                )
            elif content.type == "function_result" and f"result:{content.call_id}" not in self.seen:
                await self.flush()
                self.seen.add(f"result:{content.call_id}")
                text = result_text(content)
                name = self.names.get(str(content.call_id)) or self._tool_of(str(content.call_id))
                result = Content.from_function_result(str(content.call_id), result=text)
                await self._store(
                    "tool",
                    "tool_result",
                    Message(role="tool", contents=[result]),
                    text=text,
                    call_id=content.call_id,
                    tool=name,
                )
                self.tc.emit(
                    {"kind": "tool.result", "call_id": content.call_id, "tool": name, "result": text[:PREVIEW]}
                )

    def _tool_of(self, call_id: str) -> str | None:
        for row in self.tc.store.agent.messages(self.tc.conversation.id):
            if row.call_id == call_id and row.kind == "tool_call":
                return str(row.tool)
        return None


async def run_segment(tc: TurnContext, *, new_messages: list[Message] | None) -> Segment:
    """Run the turn's workflow: from ``new_messages`` (a first segment), else resumed from its checkpoint."""
    store = tc.store
    storage = StoreCheckpointStorage(store)
    name = workflow_name(tc.turn_id)
    seen = {
        f"{'call' if r.kind == 'tool_call' else 'result'}:{r.call_id}"
        for r in store.agent.messages(tc.conversation.id)
        if r.turn_id == tc.turn_id and r.call_id
    }
    recorder = Recorder(tc, seen)
    segment = Segment()
    async with contextlib.AsyncExitStack() as stack:
        # The user's MCP servers: opened and closed in this task (their clients must not cross tasks).
        mcp_tools = [
            await stack.enter_async_context(
                MCPStdioTool(
                    s["name"],
                    s["command"],
                    args=s["args"],
                    tool_name_prefix=s["name"],
                    approval_mode="always_require",
                    load_prompts=False,
                )
            )
            for s in tc.conversation.mcp_servers or []
        ]
        agent = Agent(
            client=ModelChatClient.from_settings(tc.engine.settings),
            name="fleet-agent",
            instructions=instructions(tc),
            tools=[*build_tools(tc), *mcp_tools],
            middleware=[ApprovalGate(tc.engine)],
        )
        workflow = WorkflowBuilder(
            name=name, start_executor=AgentExecutor(agent, id=EXECUTOR_ID), checkpoint_storage=storage
        ).build()
        if new_messages is not None:
            stream = workflow.run(new_messages, stream=True)
        else:
            checkpoint = await storage.get_latest(workflow_name=name)
            if checkpoint is None or not checkpoint.pending_request_info_events:
                raise Conflict(f"turn {tc.turn_id} has nothing to resume: it was answered or ended already")
            # The gate enforces each call's recorded decision; the framework only needs to go on.
            responses = {
                rid: event.data.to_function_approval_response(approved=True)
                for rid, event in checkpoint.pending_request_info_events.items()
            }
            stream = workflow.run(checkpoint_id=checkpoint.checkpoint_id, responses=responses, stream=True)
        async for event in stream:
            if event.type == "output" and isinstance(event.data, AgentResponseUpdate):
                await recorder.feed(event.data)
            elif event.type == "request_info" and getattr(event.data, "type", None) == "function_approval_request":
                segment.pending.append(event.data)
            elif event.type == "failed":
                details = getattr(event, "details", None)
                segment.error = str(getattr(details, "message", None) or details or "the agent failed")
        await recorder.flush()
    segment.reply = "".join(recorder.reply).strip()
    return segment
