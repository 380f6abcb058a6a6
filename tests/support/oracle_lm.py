"""A scripted OpenAI-compatible LM server on 127.0.0.1 for tests and benchmarks.

The runtime talks to it through its normal LiteLLM path, so everything between the
program and the HTTP wire is exercised. Two kinds of request arrive:

* root steps (the chat adapter's structured prompt, recognised by its ``[[ ## code ## ]]``
  output marker): answered with the next code step of the scenario whose trigger appears in
  the question; the reference ``rlms`` package's prompt (a system message asking for
  ```` ```repl ```` blocks) is answered in its own dialect, ``SUBMIT(x)`` becoming its
  ``answer["content"] = x; answer["ready"] = True``;
* sub-queries (``llm_query`` prompts): answered by the scenario's ``sub`` function from the
  text the prompt carries, like a model reading it would. A sub-query carrying images (OpenAI's
  ``image_url`` content parts with ``data:`` URLs, or Anthropic's base64 ``image`` blocks) has them
  decoded into ``Request.images`` (mime and bytes, as the server received them) and is answered by
  the scenario's ``see(prompt, images)`` when it has one; each image adds ``image_tokens`` prompt
  tokens to the reply's usage, as providers bill them. With ``refuse_images`` a request carrying
  images is refused (400), as a text-only model's server answers.

A scenario can answer differently when the prompt carries a marker (``when``: marker -> steps),
as a model follows an instruction or a demo it is shown: how tests prove an optimized program
really changed what the model was sent. ``field_replies`` answers structured requests for other
output fields (an optimizer's proposal or reflection: ``new_instruction``, ``proposed_instruction``)
with fixed text, as JSON when the request asks for a JSON object.

A scenario's ``style`` is how its model writes a structured reply (``STYLES``): the field headers
asked for, or one of the forms models stray into (JSON, prose with one code block, XML-like
tags ...), for the act step and the extraction alike.

It also speaks Anthropic's messages API (``POST .../messages``), for tests of what an
``anthropic/...`` model is sent. With ``cache_reads`` / ``cache_writes`` each reply reports that many
prompt tokens as read from / written to a prompt cache: OpenAI's ``prompt_tokens_details.cached_tokens``
on the chat API, Anthropic's ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` on its own.

It records every request, tracks how many were in flight at once, can add latency and can
fail a number of requests (or every root or sub request) with a chosen HTTP status to exercise
retries and error paths; with ``echo_secrets`` a failure quotes the request's Authorization
header and key back (bare, reversed and split into pieces), as careless providers do.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.support.http_server import LoopbackServer, QuietHandler

RAW = "RAW:"
# LiteLLM has no price for the oracle's model (openai/oracle): set one, as a paid model has, where a test
# runs with a cost cap (a cap on a model without a known price is refused before the run).
PRICED = {"FLEET_LM_PRICE_PER_MTOK_IN": "0.15", "FLEET_LM_PRICE_PER_MTOK_OUT": "0.6"}
NEEDLE = re.compile(r"The secret code is (\w+)")


def oracle_env(root: Path, base_url: str) -> dict[str, str]:
    """A process environment for a test that outlives one test function: a fresh FLEET_HOME in
    ``root``, the scripted model at ``base_url``, no keyring."""
    return os.environ | {
        "FLEET_HOME": str(root / "home"),
        "FLEET_NO_KEYRING": "1",
        "FLEET_LM_MODEL": "openai/oracle",
        "FLEET_LM_API_BASE": base_url,
        "FLEET_LM_API_KEY": "sk-test-oracle-0000",
        "FLEET_LM_RETRIES": "0",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def default_sub(prompt: str) -> str:
    """Answer a sub-query from the text it carries: report a needle if present."""
    found = NEEDLE.search(prompt)
    return found.group(1) if found else "NONE"


@dataclass(frozen=True)
class Image:
    """An image part of a request, as the server decoded it (``mime`` from the data URL's header)."""

    mime: str
    data: bytes
    url: str | None = None  # set when the part named a URL instead of carrying its bytes


@dataclass
class Scenario:
    """Root steps for questions containing ``trigger``; step k answers with ``steps[k]``."""

    trigger: str
    steps: list[str]
    sub: Callable[[str], str] = default_sub
    see: Callable[[str, list[Image]], str] | None = None  # answers sub-queries that carry images
    reasoning: str = "Working through the input step by step."
    when: dict[str, list[str]] = field(default_factory=dict)  # marker in the prompt -> these steps instead
    style: str = "fields"  # one of STYLES: how each structured reply is written


@dataclass
class Request:
    kind: str  # "root" | "sub"
    model: str
    messages: list[dict[str, Any]]  # empty when the state keeps no messages
    started: float
    auth: str | None
    prompt_chars: int = 0
    reply_chars: int = 0
    images: list[Image] = field(default_factory=list)  # image parts of its messages, decoded


@dataclass
class Outage:
    """Requests failed by count, not by clock, so a slow machine meets the same outage: once ``after``
    root calls have arrived, the next requests get ``statuses`` in order (one each), except those whose
    prompt mentions one of ``spare`` (runs that must meet another fault, not this one)."""

    after: int
    statuses: list[int]
    spare: tuple[str, ...] = ()
    roots: int = 0

    def strike(self, is_root: bool, prompt: Callable[[], str]) -> int | None:
        self.roots += is_root
        if self.roots < self.after or not self.statuses:
            return None
        text = prompt()
        return None if any(tag in text for tag in self.spare) else self.statuses.pop(0)


@dataclass
class OracleState:
    scenarios: list[Scenario] = field(default_factory=list)
    latency: float = 0.0
    jitter: float = 0.0  # each reply waits latency ± up to jitter seconds (seeded, reproducible)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    keep_messages: bool = True  # benchmarks send gigabytes of prompts: keep only their sizes
    fail_next: list[int] = field(default_factory=list)  # HTTP statuses to return before succeeding
    fail_kind: dict[str, int] = field(default_factory=dict)  # "root"/"sub" -> status for every such request
    outage: Outage | None = None
    echo_secrets: bool = False  # failures quote the Authorization header and the key: bare, reversed, in 4 pieces
    # What ``GET /models`` lists: a run's preflight passes these without a call (any name gets answers).
    models: tuple[str, ...] = ("oracle", "gpt-4o-mini", "gpt-5-mini")
    strict_models: bool = False  # refuse calls naming a model not in ``models`` (404), as vLLM does
    field_replies: dict[str, str] = field(default_factory=dict)  # output field -> reply (proposals, reflection)
    cache_reads: int = 0  # prompt tokens each reply reports as read from the prompt cache (at most the prompt's)
    cache_writes: int = 0  # and as written to it
    image_tokens: int = 85  # prompt tokens each image adds to a reply's usage (OpenAI's low-detail figure)
    refuse_images: bool = False  # a request carrying images gets a 400, as a text-only model's server answers
    requests: list[Request] = field(default_factory=list)
    models_listed: int = 0  # GETs of the model list (a preflight's), counted apart from the calls
    hold: threading.Event | None = None  # when given, each call waits for it once recorded (a test looks meanwhile)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


def _data_url(url: str) -> Image:
    header, comma, payload = url.partition(",")
    if not (url.startswith("data:") and comma and header.endswith(";base64")):
        return Image("", b"", url=url)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        data = b""
    return Image(header[len("data:") : -len(";base64")], data)


def _images(messages: list[dict[str, Any]]) -> list[Image]:
    """Every image part of the messages, decoded: the chat API's ``image_url`` and Anthropic's ``image``."""
    found = []
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "image_url":
                image = part.get("image_url")
                found.append(_data_url(str(image.get("url", "") if isinstance(image, dict) else image)))
            elif part.get("type") == "image" and isinstance(part.get("source"), dict):
                source = part["source"]
                data = source.get("data", "")
                found.append(Image(str(source.get("media_type", "")), base64.b64decode(data) if data else b""))
    return found


class OracleLM(LoopbackServer):
    """Run with ``with OracleLM() as lm:``; point ``FLEET_LM_API_BASE`` at ``lm.base_url``."""

    def __init__(self, *scenarios: Scenario, latency: float = 0.0) -> None:
        self.state = OracleState(scenarios=list(scenarios), latency=latency)
        super().__init__(_handler(self.state))

    def add(self, scenario: Scenario) -> None:
        self.state.scenarios.append(scenario)

    def requests(self, kind: str | None = None) -> list[Request]:
        with self.state.lock:
            return [r for r in self.state.requests if kind is None or r.kind == kind]

    @property
    def max_in_flight(self) -> int:
        return self.state.max_in_flight


def _dialect(messages: list[dict[str, Any]]) -> str | None:
    """The root prompt's dialect: dspy's chat adapter ("chat"), rlms ("repl"), or None for a sub-query."""
    first = messages[0] if messages else {}
    system = _text(first.get("content")) if first.get("role") == "system" else ""
    if "[[ ## " in system:
        return "chat"
    return "repl" if "```repl" in system else None


_SUBMIT = re.compile(r"^(\s*)SUBMIT\((.*)\)\s*$", re.MULTILINE)


def _repl_reply(reasoning: str, code: str) -> str:
    code = _SUBMIT.sub(r'\1answer["content"] = str(\2); answer["ready"] = True', code)
    return f"{reasoning}\n\n```repl\n{code}\n```"


def _field_reply(state: OracleState, messages: list[dict[str, Any]]) -> str | None:
    """A fixed reply to a request for one of ``field_replies``' output fields, in its format."""
    system = _text(messages[0].get("content")) if messages else ""
    asked = {n: t for n, t in state.field_replies.items() if f"[[ ## {n} ## ]]" in system or f'"{n}"' in system}
    if not asked:
        return None
    if "JSON object" in system:
        return json.dumps(asked)
    return "".join(f"[[ ## {n} ## ]]\n{t}\n\n" for n, t in asked.items()) + "[[ ## completed ## ]]"


def _root_answer(state: OracleState, messages: list[dict[str, Any]], dialect: str = "chat") -> str:
    reply = _field_reply(state, messages)
    if reply is not None:
        return reply
    transcript = "\n".join(_text(m.get("content")) for m in messages)
    # rlms sends its steps as chat turns; this runtime and stock dspy.RLM render them as
    # "=== Step N ===" in the last message (earlier ones may be demos).
    last = _text(messages[-1].get("content")) if messages else ""
    step = sum(1 for m in messages if m.get("role") == "assistant") if dialect == "repl" else last.count("=== Step ")
    for scenario in state.scenarios:
        if scenario.trigger in transcript:
            steps = next((alt for marker, alt in scenario.when.items() if marker in transcript), scenario.steps)
            code = steps[min(step, len(steps) - 1)]
            if code.startswith(RAW):  # a reply that ignores the format, as weak models do
                return code[len(RAW) :]
            if dialect == "repl":
                return _repl_reply(scenario.reasoning, code)
            return _structured(scenario.reasoning, code, messages, scenario.style)
    return _structured("No scenario matched.", 'SUBMIT("no scenario matched")', messages, "fields")


_OUTPUTS = re.compile(r"Your output fields are:\n(.*?)\nAll interactions", re.DOTALL)


def _output_fields(messages: list[dict[str, Any]]) -> list[str]:
    """The output field names the chat adapter's system message asks for."""
    system = _text(messages[0].get("content")) if messages else ""
    listed = _OUTPUTS.search(system)
    return re.findall(r"^\d+\. `(\w+)`", listed.group(1), re.MULTILINE) if listed else []


def _headers(values: dict[str, str]) -> str:
    return "\n\n".join(f"[[ ## {name} ## ]]\n{text}" for name, text in values.items())


def _prose(values: dict[str, str]) -> str:
    return "\n\n".join(values.values())


# How a model may write a structured reply; each takes the output fields' values, in order.
STYLES: dict[str, Callable[[dict[str, str]], str]] = {
    "fields": lambda v: _headers(v) + "\n\n[[ ## completed ## ]]",
    "fields_unclosed": _headers,  # stopped before the closing marker
    "json": json.dumps,
    "json_fenced": lambda v: f"```json\n{json.dumps(v, indent=2)}\n```\nLet me know if you need anything else.",
    "prose_code": _prose,  # the reasoning as prose, then the fenced code (an extraction: the bare answer)
    "xml": lambda v: "\n".join(f"<{name}>\n{text}\n</{name}>" for name, text in v.items()),
    # Ambiguous: two different code blocks and no headers; or no code at all.
    "two_blocks": lambda v: _prose(v) + "\n\nOr instead:\n```python\nprint('something else')\n```",
    "no_code": lambda v: v.get("reasoning") or _prose(v),
}


def _structured(reasoning: str, code: str, messages: list[dict[str, Any]], style: str) -> str:
    """Reply with the fields the request asks for (an extraction asks for the task's answer), in ``style``."""
    outputs = _output_fields(messages)
    if "code" in outputs:
        values = {"reasoning": reasoning, "code": f"```python\n{code}\n```"}
    else:  # the extract predictor
        values = dict.fromkeys(outputs, "extracted")
    return STYLES[style](values)


def _handler(state: OracleState) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                # Not recorded with the calls: the runtime's preflight reads it, and tests count model calls.
                with state.lock:
                    state.models_listed += 1
                self.send_json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in state.models]})
            else:
                self.send_json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            path = self.path.rstrip("/")
            anthropic = path.endswith("/messages")  # LiteLLM appends /v1/messages to the base, dspy's own /messages
            if not (anthropic or path.endswith("/chat/completions")):
                self.send_json(404, {"error": {"message": f"unknown path {self.path}"}})
                return
            messages = body.get("messages", [])
            if anthropic and body.get("system"):  # read as the chat API's system message
                messages = [{"role": "system", "content": body["system"]}, *messages]
            dialect = _dialect(messages)
            is_root = dialect is not None
            kind = "root" if is_root else "sub"
            prompt_chars = sum(len(_text(m.get("content"))) for m in messages)
            record = Request(
                kind=kind,
                model=body.get("model", ""),
                messages=messages if state.keep_messages else [],
                started=time.monotonic(),
                auth=self.headers.get("Authorization"),
                prompt_chars=prompt_chars,
                images=_images(messages),
            )
            with state.lock:
                state.requests.append(record)
                delay = max(0.0, state.latency + state.rng.uniform(-state.jitter, state.jitter))
                failure = state.fail_next.pop(0) if state.fail_next else state.fail_kind.get(kind)
                if not failure and state.outage is not None:
                    failure = state.outage.strike(is_root, lambda: " ".join(_text(m.get("content")) for m in messages))
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if state.hold is not None:
                    state.hold.wait()
                if delay:
                    time.sleep(delay)
                if failure:
                    self.send_json(failure, {"error": {"message": self._failure_message(), "type": "server_error"}})
                    return
                if state.refuse_images and record.images:
                    error = {"message": "This model does not support image input.", "type": "invalid_request_error"}
                    self.send_json(400, {"error": {**error, "code": "image_input_unsupported"}})
                    return
                if state.strict_models and body.get("model") not in state.models:
                    model = body.get("model")
                    error = {"message": f"The model `{model}` does not exist.", "code": "model_not_found"}
                    self.send_json(404, {"error": {**error, "type": "NotFoundError"}})
                    return
                if is_root:
                    content = _root_answer(state, messages, dialect or "chat")
                else:
                    prompt = _text(messages[-1].get("content")) if messages else ""
                    content = _sub_answer(state, prompt, record.images)
                record.reply_chars = len(content)
                reply = _message if anthropic else _completion
                prompt_tokens = max(1, prompt_chars // 4) + state.image_tokens * len(record.images)
                self.send_json(200, reply(body.get("model", "oracle"), content, prompt_tokens, state))
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _failure_message(self) -> str:
            if not state.echo_secrets:
                return "injected failure"
            auth = self.headers.get("Authorization") or ""
            key = auth.partition(" ")[2]
            size = -(-len(key) // 4)
            pieces = [key[i : i + size] for i in range(0, len(key), size)]
            return (
                f"injected failure: request had Authorization: {auth}; the key {key} is not valid here"
                f" (reversed: {key[::-1]}; in pieces: {json.dumps(pieces)}; one per line:\n" + "\n".join(pieces) + ")"
            )

    return Handler


def _sub_answer(state: OracleState, prompt: str, images: list[Image] | None = None) -> str:
    # Sub-queries rarely repeat the question; use the first scenario's reader.
    scenario = next(
        (s for s in state.scenarios if s.trigger in prompt), state.scenarios[0] if state.scenarios else None
    )
    if scenario is None:
        return default_sub(prompt)
    if images and scenario.see is not None:
        return scenario.see(prompt, images)
    return scenario.sub(prompt)


def _completion(model: str, content: str, prompt_tokens: int, state: OracleState) -> dict[str, Any]:
    completion_tokens = max(1, len(content) // 4)
    cached = {"prompt_tokens_details": {"cached_tokens": min(state.cache_reads, prompt_tokens)}}
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        | (cached if state.cache_reads else {}),
    }


def _message(model: str, content: str, prompt_tokens: int, state: OracleState) -> dict[str, Any]:
    """A reply of Anthropic's messages API, whose ``input_tokens`` leave out the cache's."""
    read = min(state.cache_reads, prompt_tokens)
    written = min(state.cache_writes, prompt_tokens - read)
    return {
        "id": f"msg_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": content}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt_tokens - read - written,
            "output_tokens": max(1, len(content) // 4),
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        },
    }
