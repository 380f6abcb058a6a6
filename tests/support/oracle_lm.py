"""A scripted OpenAI-compatible LM server on 127.0.0.1 for tests and benchmarks.

The runtime talks to it through its normal LiteLLM path, so everything between the
program and the HTTP wire is exercised. Two kinds of request arrive:

* root steps (the chat adapter's structured prompt, recognised by its ``[[ ## code ## ]]``
  output marker): answered with the next code step of the scenario whose trigger appears in
  the question;
* sub-queries (``llm_query`` prompts): answered by the scenario's ``sub`` function from the
  text the prompt carries, like a model reading it would.

It records every request, tracks how many were in flight at once, can add latency and can
fail a number of requests with a chosen HTTP status to exercise retries.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RAW = "RAW:"
NEEDLE = re.compile(r"The secret code is (\w+)")


def default_sub(prompt: str) -> str:
    """Answer a sub-query from the text it carries: report a needle if present."""
    found = NEEDLE.search(prompt)
    return found.group(1) if found else "NONE"


@dataclass
class Scenario:
    """Root steps for questions containing ``trigger``; step k answers with ``steps[k]``."""

    trigger: str
    steps: list[str]
    sub: Callable[[str], str] = default_sub
    reasoning: str = "Working through the input step by step."


@dataclass
class Request:
    kind: str  # "root" | "sub"
    model: str
    messages: list[dict[str, Any]]
    started: float
    auth: str | None


@dataclass
class OracleState:
    scenarios: list[Scenario] = field(default_factory=list)
    latency: float = 0.0
    fail_next: list[int] = field(default_factory=list)  # HTTP statuses to return before succeeding
    requests: list[Request] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # the default backlog of 5 resets connections under fan-out
    daemon_threads = True


class OracleLM:
    """Run with ``with OracleLM() as lm:``; point ``FLEET_LM_API_BASE`` at ``lm.base_url``."""

    def __init__(self, *scenarios: Scenario, latency: float = 0.0) -> None:
        self.state = OracleState(scenarios=list(scenarios), latency=latency)
        self._server = _Server(("127.0.0.1", 0), _handler(self.state))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, scenario: Scenario) -> None:
        self.state.scenarios.append(scenario)

    def requests(self, kind: str | None = None) -> list[Request]:
        with self.state.lock:
            return [r for r in self.state.requests if kind is None or r.kind == kind]

    @property
    def max_in_flight(self) -> int:
        return self.state.max_in_flight

    def __enter__(self) -> OracleLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _root_answer(state: OracleState, messages: list[dict[str, Any]]) -> str:
    transcript = "\n".join(_text(m.get("content")) for m in messages)
    # Our runtime sends steps as chat turns; stock dspy.RLM renders them as "=== Step N ===".
    step = sum(1 for m in messages if m.get("role") == "assistant") or transcript.count("=== Step ")
    for scenario in state.scenarios:
        if scenario.trigger in transcript:
            code = scenario.steps[min(step, len(scenario.steps) - 1)]
            if code.startswith(RAW):  # a reply that ignores the format, as weak models do
                return code[len(RAW):]
            return _structured(scenario.reasoning, code, transcript)
    return _structured("No scenario matched.", 'SUBMIT("no scenario matched")', transcript)


def _structured(reasoning: str, code: str, transcript: str) -> str:
    """Reply in the chat adapter's field format; an extract request asks for other fields."""
    fields = re.findall(r"\[\[ ## (\w+) ## \]\]", transcript)
    if "code" not in fields:  # the extract predictor: answer its output fields
        outputs = [f for f in dict.fromkeys(fields) if f not in {"completed", "observation", "history"}]
        return "\n\n".join(f"[[ ## {f} ## ]]\nextracted" for f in outputs) + "\n\n[[ ## completed ## ]]"
    return f"[[ ## reasoning ## ]]\n{reasoning}\n\n[[ ## code ## ]]\n```python\n{code}\n```\n\n[[ ## completed ## ]]"


def _handler(state: OracleState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output quiet
            return

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "oracle", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"unknown path {self.path}"}})
                return
            messages = body.get("messages", [])
            first = messages[0] if messages else {}
            is_root = first.get("role") == "system" and "[[ ## " in _text(first.get("content"))
            with state.lock:
                state.requests.append(
                    Request(
                        kind="root" if is_root else "sub",
                        model=body.get("model", ""),
                        messages=messages,
                        started=time.monotonic(),
                        auth=self.headers.get("Authorization"),
                    )
                )
                failure = state.fail_next.pop(0) if state.fail_next else None
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if state.latency:
                    time.sleep(state.latency)
                if failure:
                    self._send(failure, {"error": {"message": "injected failure", "type": "server_error"}})
                    return
                if is_root:
                    content = _root_answer(state, messages)
                else:
                    prompt = _text(messages[-1].get("content")) if messages else ""
                    content = _sub_answer(state, prompt)
                prompt_chars = sum(len(_text(m.get("content"))) for m in messages)
                self._send(200, _completion(body.get("model", "oracle"), content, prompt_chars))
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _sub_answer(state: OracleState, prompt: str) -> str:
    for scenario in state.scenarios:
        if scenario.trigger in prompt:
            return scenario.sub(prompt)
    # Sub-queries rarely repeat the question; use the first scenario's reader.
    return state.scenarios[0].sub(prompt) if state.scenarios else default_sub(prompt)


def _completion(model: str, content: str, prompt_chars: int) -> dict[str, Any]:
    prompt_tokens = max(1, prompt_chars // 4)
    completion_tokens = max(1, len(content) // 4)
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
