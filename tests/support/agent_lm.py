"""A scripted OpenAI-compatible model server on 127.0.0.1 that plays the workspace agent's policy.

The agent's chat client reaches it as any OpenAI-compatible server (dspy's native route, or LiteLLM). A
``Policy`` is chosen by a trigger in the latest user message; its reply number k (k = assistant messages
since that user message) is ``steps[k]``: a tool call in the function-calling format (``Call``) or text
(``Say``), whose content may be computed from the latest tool result (``Reply.result``: its text;
``Reply.json``: it parsed). Replies stream as Server-Sent Events when asked (text in pieces; a tool call's
arguments in two pieces, as real providers send them), else come as one JSON completion. Every request is
recorded; ``fail_next`` makes the next ones fail with an HTTP status.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_server import LoopbackServer, QuietHandler


@dataclass
class Reply:
    """What a step sees: the latest tool result of the turn."""

    result: str | None

    @property
    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.result or "")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class Call:
    tool: str
    arguments: dict[str, Any] | Callable[[Reply], dict[str, Any]]


@dataclass
class Calls:
    """Several tool calls in one reply (the framework runs them concurrently)."""

    calls: list[Call]


@dataclass
class Say:
    text: str | Callable[[Reply], str]


@dataclass
class Policy:
    trigger: str
    steps: list[Call | Calls | Say]


@dataclass
class Seen:
    messages: list[dict[str, Any]]
    tools: list[str]
    stream: bool
    auth: str | None = None  # the Authorization header: which key reached this server


@dataclass
class _State:
    policies: list[Policy] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    failures: list[int] = field(default_factory=list)  # HTTP statuses the next requests get, in order


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def choose(state: _State, messages: list[dict[str, Any]]) -> Call | Calls | Say:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    since = messages[last_user + 1 :]
    step = sum(1 for m in since if m.get("role") == "assistant")
    results = [_text(m.get("content")) for m in since if m.get("role") == "tool"]
    for policy in state.policies:
        if policy.trigger in question:
            chosen = policy.steps[min(step, len(policy.steps) - 1)]
            reply = Reply(results[-1] if results else None)
            if isinstance(chosen, Say):
                return Say(chosen.text(reply) if callable(chosen.text) else chosen.text)
            if isinstance(chosen, Calls):
                return Calls([_bound(c, reply) for c in chosen.calls])
            return _bound(chosen, reply)
    return Say(f"I have no script for: {question[:80]}")


def _bound(call: Call, reply: Reply) -> Call:
    return Call(call.tool, call.arguments(reply) if callable(call.arguments) else call.arguments)


def _tool_calls(step: Call | Calls) -> list[Call]:
    return step.calls if isinstance(step, Calls) else [step]


class AgentLM(LoopbackServer):
    """``with AgentLM(Policy(...)) as lm:``; point ``FLEET_AGENT_LM_API_BASE`` at ``lm.base_url``."""

    def __init__(self, *policies: Policy) -> None:
        self.state = _State(policies=list(policies))
        super().__init__(_handler(self.state))

    def add(self, policy: Policy) -> None:
        self.state.policies.append(policy)

    def fail_next(self, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests with ``status`` (an OpenAI-style error body, Retry-After: 0)."""
        with self.state.lock:
            self.state.failures.extend([status] * times)

    @property
    def requests(self) -> list[Seen]:
        with self.state.lock:
            return list(self.state.requests)


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.send_json(200, {"object": "list", "data": [{"id": "agent", "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            messages = body.get("messages", [])
            tools = [t["function"]["name"] for t in body.get("tools") or []]
            with state.lock:
                state.requests.append(
                    Seen(messages, tools, bool(body.get("stream")), self.headers.get("Authorization"))
                )
                state.calls += 1
                call_id = f"call_{state.calls}"
                failure = state.failures.pop(0) if state.failures else None
            if failure is not None:
                error = {"error": {"message": f"scripted failure {failure}", "type": "scripted"}}
                self.send_json(failure, error, headers={"Retry-After": "0"})
                return
            step = choose(state, messages)
            model = body.get("model", "agent")
            if body.get("stream"):
                self._stream(model, step, call_id)
            else:
                self.send_json(200, _completion(model, step, call_id))

        def _stream(self, model: str, step: Call | Calls | Say, call_id: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for delta, finish in _deltas(step, call_id):
                chunk = {
                    "id": "chatcmpl-agent",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def _deltas(step: Call | Calls | Say, call_id: str) -> list[tuple[dict[str, Any], str | None]]:
    if isinstance(step, Say):
        text = str(step.text)
        words = text.split(" ")
        pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
        return [({"role": "assistant", "content": p}, None) for p in pieces] + [({}, "stop")]
    out: list[tuple[dict[str, Any], str | None]] = []
    for i, call in enumerate(_tool_calls(step)):
        args = json.dumps(call.arguments)
        half = len(args) // 2
        function = {"name": call.tool, "arguments": args[:half]}
        first = {"index": i, "id": f"{call_id}_{i}" if i else call_id, "type": "function", "function": function}
        rest = {"index": i, "function": {"arguments": args[half:]}}
        out += [({"role": "assistant", "tool_calls": [first]}, None), ({"tool_calls": [rest]}, None)]
    return [*out, ({}, "tool_calls")]


def _completion(model: str, step: Call | Calls | Say, call_id: str) -> dict[str, Any]:
    if isinstance(step, Say):
        message: dict[str, Any] = {"role": "assistant", "content": str(step.text)}
        finish = "stop"
    else:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"{call_id}_{i}" if i else call_id,
                    "type": "function",
                    "function": {"name": call.tool, "arguments": json.dumps(call.arguments)},
                }
                for i, call in enumerate(_tool_calls(step))
            ],
        }
        finish = "tool_calls"
    return {
        "id": "chatcmpl-agent",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
