"""A run's events folded into a tree: nodes, their steps, and each step's sub-calls and children.

Every face renders this one structure (CLI tree, MCP ``inspect_trace``, web trace view).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet_rlm.types import Event


def _new_node(node: str, parent: str | None, depth: int) -> dict[str, Any]:
    return {"node": node, "parent": parent, "depth": depth, "status": "running", "steps": [], "children": [],
            "warnings": [], "query_preview": None, "answer_preview": None}


def _step(holder: dict[str, Any], number: int) -> dict[str, Any]:
    for step in holder["steps"]:
        if step["step"] == number:
            found: dict[str, Any] = step
            return found
    step = {"step": number, "reasoning": None, "code": None, "output": None, "error": None,
            "duration": None, "lm": None, "subcalls": [], "tools": [], "children": [], "submitted": False,
            "ts": None, "ts_end": None}  # when the model was asked, when the code finished (timelines)
    holder["steps"].append(step)
    return step


def build_trace(events: Sequence[Event]) -> dict[str, Any]:
    """Fold events (ordered by seq) into ``{"run": {...}, "nodes": {id: node}, "root": "root"}``."""
    nodes: dict[str, dict[str, Any]] = {"root": _new_node("root", None, 0)}
    current: dict[str, int] = {}  # node -> step in progress
    run: dict[str, Any] = {"status": "running", "events": len(events)}
    for ev in events:
        kind, data, name = ev["kind"], ev.get("data") or {}, ev.get("node") or "root"
        node = nodes.setdefault(name, _new_node(name, ev.get("parent"), ev.get("depth", 0)))
        if kind == "run.started":
            run.update(question=data.get("question"), limits=data.get("limits"), started=ev["ts"])
            if data.get("lineage"):  # a replay's or fork's source
                run["lineage"] = data["lineage"]
        elif kind == "run.finished":
            run.update({k: data.get(k) for k in
                        ("status", "answer", "stop_reason", "error", "usage", "iterations", "llm_calls", "seconds")})
            run["finished"] = ev["ts"]
            nodes["root"]["status"] = data.get("status")
            nodes["root"]["answer_preview"] = (data.get("answer") or "")[:200] or None
        elif kind == "lm.call":
            step = _step(node, data.get("step", 0))
            current[name] = step["step"]
            step["ts"] = step["ts"] or ev["ts"]
            step["reasoning"] = data.get("reasoning")
            step["lm"] = {k: data.get(k) for k in
                          ("model", "predictor", "reply_form", "prompt_tokens", "completion_tokens", "cost",
                           "latency", "replayed", "cached_tokens", "cache_write_tokens", "saved")}
        elif kind == "code.executed":
            step = _step(node, data.get("step", 0))
            step.update({k: data.get(k) for k in ("code", "output", "error", "error_kind", "duration")})
            step["output_chars"] = data.get("output_chars")
            step["submitted"] = bool(data.get("submitted"))
            step["ts_end"] = ev["ts"]
        elif kind == "subcall.finished":
            _step(node, current.get(name, 0))["subcalls"].append({"seq": ev["seq"], "ts": ev["ts"], **data})
        elif kind == "tool.called":  # an MCP tool or a Python function the step's code called (core.tools)
            _step(node, current.get(name, 0))["tools"].append({"seq": ev["seq"], "ts": ev["ts"], **data})
        elif kind == "child.started":
            node.update(query_preview=data.get("query_preview"), started=ev["ts"])
            parent = ev.get("parent")
            if parent in nodes:
                nodes[parent]["children"].append(name)
                _step(nodes[parent], current.get(parent, 0))["children"].append(name)
        elif kind == "child.finished":
            node.update(status=data.get("status"), answer_preview=data.get("answer_preview"), finished=ev["ts"],
                        stop_reason=data.get("stop_reason"), error=data.get("error"))
        elif kind == "warning":
            node["warnings"].append(data.get("message"))
    return {"run": run, "root": "root", "nodes": nodes}


def summarize_step(step: dict[str, Any]) -> dict[str, Any]:
    """A step without the bulky parts, with sizes so a reader knows what to drill into."""
    subcalls = step["subcalls"]
    return {
        "step": step["step"],
        "reasoning": (step["reasoning"] or "")[:300],
        "code_preview": (step["code"] or "")[:300],
        "code_chars": len(step["code"] or ""),
        "output_preview": (step["output"] or "")[:300],
        "output_chars": step.get("output_chars") or len(step["output"] or ""),
        "error": step["error"],
        "submitted": step["submitted"],
        "subcalls": len(subcalls),
        "subcall_errors": sum(1 for s in subcalls if s.get("error")),
        "tool_calls": len(step.get("tools") or []),
        "tool_errors": sum(1 for t in step.get("tools") or [] if t.get("error")),
        "children": step["children"],
    }
