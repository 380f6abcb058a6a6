"""Runs as OpenTelemetry traces (OpenInference conventions), built from the run's stored events.

A run is a CHAIN span; each node (root, children) an AGENT span; each model step an LLM span (the new
message it was sent, its reply, tokens, cost, model); each code execution a TOOL span under which the
step's ``llm_query`` calls (LLM) and child nodes (AGENT) nest. Spans carry the events' own times,
so they are built after the fact, on a thread of their own: the store's writer hands committed (already
redacted) events over and returns, and a batch processor sends them. A collector that is down costs
dropped spans and a logged warning, never a run; closing waits at most ``CLOSE_SECONDS``.

Imported only when the export is on (``core.telemetry``): the SDK stays out of start-up otherwise.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import requests
from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode
from requests.auth import AuthBase, HTTPBasicAuth
from requests.utils import get_auth_from_url

from fleet_rlm.types import Event

log = logging.getLogger(__name__)

CLOSE_SECONDS = 2.0  # the longest a closing engine waits for spans to go out
TEXT_CAP = 4_000  # characters of a code output or message kept on a span
RUN_ID = "fleet.run_id"
KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
_CHAIN, _AGENT, _LLM, _TOOL = (
    OpenInferenceSpanKindValues.CHAIN.value,
    OpenInferenceSpanKindValues.AGENT.value,
    OpenInferenceSpanKindValues.LLM.value,
    OpenInferenceSpanKindValues.TOOL.value,
)


def _ns(ts: float) -> int:
    return int(ts * 1e9)


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes no None values; long text is cut to its head."""
    return {k: (v[:TEXT_CAP] if isinstance(v, str) else v) for k, v in attributes.items() if v is not None}


def _message(prefix: str, role: str, content: str) -> dict[str, Any]:
    return {f"{prefix}.0.message.role": role, f"{prefix}.0.message.content": content}


def _reply(span: Span, text: str) -> None:
    span.set_attributes(
        _clean({SpanAttributes.OUTPUT_VALUE: text, **_message(SpanAttributes.LLM_OUTPUT_MESSAGES, "assistant", text)})
    )


def _usage(data: dict[str, Any]) -> dict[str, Any]:
    """Model, tokens (cached prompt tokens included) and cost of one model call."""
    model = data.get("model")
    prompt, completion = data.get("prompt_tokens"), data.get("completion_tokens")
    total = prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
    return {
        SpanAttributes.LLM_MODEL_NAME: model,
        SpanAttributes.LLM_PROVIDER: model.split("/", 1)[0] if isinstance(model, str) and "/" in model else None,
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT: prompt,
        SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: completion,
        SpanAttributes.LLM_TOKEN_COUNT_TOTAL: total,
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ: data.get("cached_tokens"),
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_WRITE: data.get("cache_write_tokens"),
        SpanAttributes.LLM_COST_TOTAL: data.get("cost"),
        "fleet.latency": data.get("latency"),
        "fleet.replayed": data.get("replayed"),
    }


# What the exporter and requests put on a request for the protocol itself; every other header is one we chose.
_PROTOCOL_HEADERS = frozenset({
    "accept", "accept-encoding", "connection", "content-encoding", "content-length", "content-type",
    "transfer-encoding", "user-agent",
})  # fmt: skip


class _OnlyTheseHeaders(AuthBase):
    """Sends exactly the headers given (and the protocol's own), whatever else the exporter adds.

    The SDK's exporter merges ``OTEL_EXPORTER_OTLP_HEADERS`` into every request whatever headers it is
    given; those are for the endpoint the environment names, and ``core.telemetry`` decides whether this
    endpoint is it. A user name and password in the endpoint's URL still go to it, as requests sends them."""

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        for name in [n for n in request.headers if n.lower() not in _PROTOCOL_HEADERS]:
            del request.headers[name]
        request.headers.update(self._headers)
        user, password = get_auth_from_url(request.url or "")
        if (user or password) and not any(n.lower() == "authorization" for n in self._headers):
            request = HTTPBasicAuth(user, password)(request)
        return request


def _session(headers: dict[str, str]) -> requests.Session:
    session = requests.Session()
    session.auth = _OnlyTheseHeaders(headers)
    return session


@dataclass
class _Node:
    span: Span
    seen: str  # the newest message the node's model was sent: the query, then each step's output
    step: int = 0
    step_ts: float = 0.0  # when the step's reply arrived, so its code began
    tool: Span | None = None
    reply: tuple[Span, str] | None = None  # the step's LLM span (it ended at step_ts) and its reasoning


@dataclass
class _Run:
    span: Span
    run_id: str
    nodes: dict[str, _Node] = field(default_factory=dict)


class SpanExport:
    """Turns committed events into spans on a worker thread; ``offer`` is the store's listener."""

    def __init__(self, endpoint: str, headers: dict[str, str]) -> None:
        """Spans to ``endpoint`` (the full traces URL) with ``headers`` and no other (``_OnlyTheseHeaders``)."""
        # A private provider: the global one belongs to whatever else the process instruments.
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "fleet-rlm"}),
            shutdown_on_exit=False,
        )
        exporter = OTLPSpanExporter(endpoint=endpoint, headers=headers, session=_session(headers))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("fleet_rlm")
        self._runs: dict[str, _Run] = {}
        self._inbox: queue.SimpleQueue[list[Event] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="fleet-otel", daemon=True)
        self._worker.start()

    def offer(self, events: list[Event]) -> None:
        """On the store's writer thread: hand over and return."""
        self._inbox.put(events)

    def close(self) -> None:
        """Send what is built, waiting at most CLOSE_SECONDS: a collector that is down must not hold the exit."""
        self._inbox.put(None)
        self._worker.join(CLOSE_SECONDS)
        closer = threading.Thread(target=self._provider.shutdown, name="fleet-otel-close", daemon=True)
        closer.start()
        closer.join(CLOSE_SECONDS)

    def _work(self) -> None:
        while (events := self._inbox.get()) is not None:
            for event in events:
                try:
                    self._on_event(event)
                except Exception:  # a span is worth less than the run: never let one stop the export
                    log.debug("no span for event %s of run %s", event.get("kind"), event.get("run_id"), exc_info=True)

    # -- events to spans -----------------------------------------------------------------------

    def _start(self, name: str, kind: str, parent: Span | None, ts: float, run_id: str, **attrs: Any) -> Span:
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self._tracer.start_span(
            name, context=context, start_time=_ns(ts), attributes=_clean({KIND: kind, RUN_ID: run_id, **attrs})
        )

    def _on_event(self, event: Event) -> None:
        kind, run_id = event["kind"], event["run_id"]
        if kind == "run.started":
            self._run_started(event)
            return
        run = self._runs.get(run_id)
        if run is None:  # a run this export did not see start (an optimization's, one begun before it)
            return
        handler = {
            "lm.call": self._lm_call,
            "code.executed": self._code_executed,
            "subcall.finished": self._subcall,
            "tool.called": self._tool_called,
            "child.started": self._child_started,
            "child.finished": self._child_finished,
            "run.finished": self._run_finished,
        }.get(kind)
        if handler is not None:
            handler(run, event)

    def _run_started(self, event: Event) -> None:
        data, run_id, ts = event["data"], event["run_id"], event["ts"]
        question = data.get("question") or ""
        span = self._start(
            "run",
            _CHAIN,
            None,
            ts,
            run_id,
            **{
                SpanAttributes.SESSION_ID: data.get("session_id"),
                SpanAttributes.INPUT_VALUE: question,
            },
        )
        run = self._runs[run_id] = _Run(span, run_id)
        root = self._start("node root", _AGENT, span, ts, run_id, **{SpanAttributes.AGENT_NAME: "root"})
        run.nodes["root"] = _Node(root, seen=question)

    def _lm_call(self, run: _Run, event: Event) -> None:
        data, ts = event["data"], event["ts"]
        node = run.nodes.get(event["node"])
        if node is None:
            return
        self._end_step(node, ts)
        step, final = data.get("step", 0), data.get("predictor") == "extract"
        span = self._start(
            "extract" if final else f"step {step}",
            _LLM,
            node.span,
            ts - (data.get("latency") or 0.0),
            run.run_id,
            **_usage(data),
            **_message(SpanAttributes.LLM_INPUT_MESSAGES, "user", node.seen),
            **{SpanAttributes.INPUT_VALUE: node.seen, "fleet.step": step},
        )
        reasoning = data.get("reasoning") or ""
        _reply(span, reasoning)  # the code follows with code.executed
        node.step, node.step_ts, node.reply = step, ts, (span, reasoning)

    def _code_executed(self, run: _Run, event: Event) -> None:
        data, ts = event["data"], event["ts"]
        node = run.nodes.get(event["node"])
        if node is None:
            return
        code, output, error = data.get("code") or "", data.get("output") or "", data.get("error")
        tool = self._tool(run, node)
        tool.set_attributes(
            _clean(
                {
                    SpanAttributes.INPUT_VALUE: code,
                    SpanAttributes.OUTPUT_VALUE: output,
                    "fleet.duration": data.get("duration"),
                    "fleet.error": error,
                    "fleet.submitted": data.get("submitted"),
                }
            )
        )
        if error:
            tool.set_status(Status(StatusCode.ERROR, error[:TEXT_CAP]))
        if node.reply is not None:
            span, reasoning = node.reply
            _reply(span, f"{reasoning}\n\n```python\n{code}\n```" if reasoning else code)
        self._end_step(node, ts)
        node.seen = output

    def _tool(self, run: _Run, node: _Node) -> Span:
        """The running step's code span, opened when the reply arrived (its sub-calls and children nest in it)."""
        if node.tool is None:
            node.tool = self._start(
                f"code step {node.step}",
                _TOOL,
                node.span,
                node.step_ts,
                run.run_id,
                **{SpanAttributes.TOOL_NAME: "python", "fleet.step": node.step},
            )
        return node.tool

    def _end_step(self, node: _Node, ts: float) -> None:
        """End the step's reply (at its own time) and its code span (at ``ts``), whichever are open."""
        if node.reply is not None:
            node.reply[0].end(_ns(node.step_ts))
            node.reply = None
        if node.tool is not None:
            node.tool.end(_ns(ts))
            node.tool = None

    def _parent_of(self, run: _Run, node_id: str | None) -> Span:
        node = run.nodes.get(node_id or "root") or run.nodes["root"]
        return self._tool(run, node) if node.step else node.span

    def _subcall(self, run: _Run, event: Event) -> None:
        data, ts = event["data"], event["ts"]
        prompt, response, error = (
            data.get("prompt_preview") or "",
            data.get("response_preview") or "",
            data.get("error"),
        )
        span = self._start(
            "llm_query",
            _LLM,
            self._parent_of(run, event["node"]),
            ts - (data.get("latency") or 0.0),
            run.run_id,
            **_usage(data),
            **_message(SpanAttributes.LLM_INPUT_MESSAGES, "user", prompt),
            **_message(SpanAttributes.LLM_OUTPUT_MESSAGES, "assistant", response),
            **{
                SpanAttributes.INPUT_VALUE: prompt,
                SpanAttributes.OUTPUT_VALUE: response,
                "fleet.prompt_chars": data.get("prompt_chars"),
                "fleet.error": error,
            },
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error[:TEXT_CAP]))
        span.end(_ns(ts))

    def _tool_called(self, run: _Run, event: Event) -> None:
        """A tool call from the REPL (an MCP server's tool, a Python function), nested in its step's code span."""
        data, ts = event["data"], event["ts"]
        error = data.get("error")
        span = self._start(
            f"tool {data.get('server')}.{data.get('tool')}",
            _TOOL,
            self._parent_of(run, event["node"]),
            ts - (data.get("seconds") or 0.0),
            run.run_id,
            **{
                SpanAttributes.TOOL_NAME: f"{data.get('server')}.{data.get('tool')}",
                "fleet.tool.server": data.get("server"),
                "fleet.tool.arg_chars": data.get("arg_chars"),
                "fleet.tool.result_chars": data.get("result_chars"),
                "fleet.replayed": data.get("replayed"),
                "fleet.error": error,
            },
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error[:TEXT_CAP]))
        span.end(_ns(ts))

    def _child_started(self, run: _Run, event: Event) -> None:
        query, name = event["data"].get("query_preview") or "", event["node"]
        span = self._start(
            f"node {name}",
            _AGENT,
            self._parent_of(run, event["parent"]),
            event["ts"],
            run.run_id,
            **{SpanAttributes.AGENT_NAME: name, SpanAttributes.INPUT_VALUE: query},
        )
        run.nodes[name] = _Node(span, seen=query)

    def _child_finished(self, run: _Run, event: Event) -> None:
        node = run.nodes.pop(event["node"], None)
        if node is not None:
            data = event["data"]
            self._end_node(node, event["ts"], data.get("answer_preview"), data.get("status"), data.get("error"))

    def _end_node(self, node: _Node, ts: float, answer: str | None, status: Any, error: str | None) -> None:
        self._end_step(node, ts)
        node.span.set_attributes(_clean({SpanAttributes.OUTPUT_VALUE: answer, "fleet.status": status}))
        if error or status == "failed":
            node.span.set_status(Status(StatusCode.ERROR, (error or "failed")[:TEXT_CAP]))
        node.span.end(_ns(ts))

    def _run_finished(self, run: _Run, event: Event) -> None:
        data, ts = event["data"], event["ts"]
        del self._runs[run.run_id]
        answer, status, error = data.get("answer"), data.get("status"), data.get("error")
        for node in reversed(list(run.nodes.values())):  # children left open (a cancel) before their parents
            self._end_node(node, ts, answer if node is run.nodes.get("root") else None, status, error)
        run.span.set_attributes(
            _clean(
                {
                    SpanAttributes.OUTPUT_VALUE: answer,
                    "fleet.status": status,
                    "fleet.stop_reason": data.get("stop_reason"),
                    "fleet.iterations": data.get("iterations"),
                    "fleet.llm_calls": data.get("llm_calls"),
                }
            )
        )
        if error or status == "failed":
            run.span.set_status(Status(StatusCode.ERROR, (error or "failed")[:TEXT_CAP]))
        run.span.end(_ns(ts))
