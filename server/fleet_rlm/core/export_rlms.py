"""A run in the reference ``rlms`` package's trajectory format, so its log visualizer opens our runs.

``rlms``' ``RLMLogger(log_dir=...)`` writes JSON lines: one ``{"type": "metadata", ...}`` row (its
``RLMMetadata``), then one ``{"type": "iteration", "iteration": N, ...}`` row per root step (its
``RLMIteration``: prompt, response, code_blocks with REPL results and sub-calls, final_answer). A child
RLM becomes a sub-call whose ``metadata`` holds the child's own trajectory, as ``rlms`` nests them.
docs/export.md lists what maps and what does not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from fleet_rlm.core.trace import build_trace
from fleet_rlm.redaction import redact_text
from fleet_rlm.types import Event


def rlms_rows(events: Sequence[Event]) -> Iterator[dict[str, Any]]:
    """The run whose events (seq order) are ``events``: the metadata row, then one row per root step."""
    trace = build_trace(events)
    yield {"type": "metadata", "timestamp": _iso(trace["run"].get("started")), **_metadata(trace, "root"),
           "fleet_rlm": _outcome(trace["run"])}  # fmt: skip
    yield from _iterations(trace, "root", trace["run"].get("question") or "")


def _metadata(trace: dict[str, Any], name: str) -> dict[str, Any]:
    """``RLMMetadata.to_dict()``'s fields: the model of the node's first step, the run's limits."""
    node = trace["nodes"][name]
    model = next((s["lm"]["model"] for s in node["steps"] if s["lm"] and s["lm"].get("model")), None)
    limits = trace["run"].get("limits") or {}
    return {
        "root_model": model,
        "max_depth": limits.get("max_depth"),
        "max_iterations": limits.get("max_iters"),
        "backend": model.split("/", 1)[0] if model and "/" in model else None,  # litellm's provider prefix
        "backend_kwargs": {"model_name": model},
        "environment_type": "fleet-rlm",
        "environment_kwargs": {},
        "other_backends": None,
    }


def _outcome(run: dict[str, Any]) -> dict[str, Any]:
    """What ``rlms`` has no field for but a reader of the file wants: how the run ended."""
    keys = ("status", "stop_reason", "error", "iterations", "llm_calls", "seconds", "usage", "lineage")
    return {
        "question": _text(run.get("question")),
        **{k: _text(v) if isinstance(v := run.get(k), str) else v for k in keys},
    }


def _iterations(trace: dict[str, Any], name: str, query: str) -> Iterator[dict[str, Any]]:
    node = trace["nodes"][name]
    answer = trace["run"].get("answer") if name == "root" else node.get("answer_preview")
    for number, step in enumerate(node["steps"], start=1):
        final = _text(answer) if step["submitted"] else None
        lm = step["lm"] or {}
        yield {
            "type": "iteration",
            "iteration": number,
            "timestamp": _iso(step["ts"]),
            "prompt": [{"role": "user", "content": _text(query)}],  # the only part of the prompt we keep
            "response": _response(step),
            "code_blocks": [] if step["code"] is None else [_code_block(trace, step, final)],
            "final_answer": final,
            "iteration_time": (lm.get("latency") or 0) + (step["duration"] or 0),
        }


def _response(step: dict[str, Any]) -> str:
    """The model's reply as ``rlms`` records it: its reasoning, then the code in a ```repl block."""
    parts = [step["reasoning"] or ""]
    if step["code"] is not None:
        parts.append(f"```repl\n{step['code']}\n```")
    return redact_text("\n\n".join(p for p in parts if p))


def _code_block(trace: dict[str, Any], step: dict[str, Any], final: str | None) -> dict[str, Any]:
    calls = [_subcall(s) for s in step["subcalls"]] + [_child_call(trace, c) for c in step["children"]]
    result = {
        "stdout": _text(step["output"] or ""),
        "stderr": _text(step["error"] or ""),
        "locals": {},
        "execution_time": step["duration"],
        "rlm_calls": calls,
        "final_answer": final,
    }
    return {"code": _text(step["code"]), "result": result}


def _subcall(call: dict[str, Any]) -> dict[str, Any]:
    """An ``RLMChatCompletion.to_dict()`` for one sub-query (we keep previews of its prompt and reply)."""
    model = call.get("model") or "unknown"
    row = {
        "root_model": model,
        "prompt": _text(call.get("prompt_preview") or ""),
        "response": _text(call.get("response_preview") or ""),
        "usage_summary": _usage({model: [call]}),
        "execution_time": call.get("latency") or 0,
    }
    if call.get("error"):
        row["error"] = _text(call["error"])
    return row


def _child_call(trace: dict[str, Any], name: str) -> dict[str, Any]:
    """A child RLM as ``rlms`` logs a recursive call: the completion, its trajectory in ``metadata``."""
    node = trace["nodes"][name]
    lms = [s["lm"] for s in node["steps"] if s["lm"]]
    by_model: dict[str, list[dict[str, Any]]] = {}
    for lm in lms:
        by_model.setdefault(lm.get("model") or "unknown", []).append(lm)
    query = node.get("query_preview") or ""
    row = {
        "root_model": next(iter(by_model), "unknown"),
        "prompt": _text(query),
        "response": _text(node.get("answer_preview") or ""),
        "usage_summary": _usage(by_model),
        "execution_time": (node.get("finished") or 0) - (node.get("started") or 0),
        "metadata": {"run_metadata": _metadata(trace, name), "iterations": list(_iterations(trace, name, query))},
    }
    if node.get("error"):
        row["error"] = _text(node["error"])
    return row


def _usage(by_model: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``UsageSummary.to_dict()``: per model its calls and tokens (and cost when known), then the total cost."""
    summaries: dict[str, dict[str, Any]] = {}
    for model, calls in by_model.items():
        summary = {
            "total_calls": len(calls),
            "total_input_tokens": sum(c.get("prompt_tokens") or 0 for c in calls),
            "total_output_tokens": sum(c.get("completion_tokens") or 0 for c in calls),
        }
        costs = [c["cost"] for c in calls if c.get("cost") is not None]
        if costs:
            summary["total_cost"] = sum(costs)
        summaries[model] = summary
    out: dict[str, Any] = {"model_usage_summaries": summaries}
    costs = [s["total_cost"] for s in summaries.values() if "total_cost" in s]
    if costs:
        out["total_cost"] = sum(costs)
    return out


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts).isoformat()


def _text(value: str | None) -> str | None:
    """A second net: the store's events are masked already, and this file is made to be shared."""
    return None if value is None else redact_text(value)
