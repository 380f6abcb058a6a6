"""A run as one self-contained HTML file: question, outcome, step tree, timeline and token table.

The file works offline from ``file://``: its CSS and JavaScript are inline and its CSP forbids every
request. The run's content is hostile (a prompt injection can put ``</script>`` into an output), so it
travels only as JSON inside ``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped,
and the page's script renders it with ``textContent``; no run text ever becomes markup.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fleet_rlm.core.trace import build_trace
from fleet_rlm.redaction import redact_text
from fleet_rlm.types import Event

BLOCK_CAP = 20_000  # characters kept of one code/output block: the head and tail halves
_TEMPLATE = "html_export.html"
_SCRIPT_OPEN = "<script>"  # the page's one executable script; the data sits in a typed one
_DATA_MARK = "{{RUN-DATA}}"
_CSP_MARK = "{{SCRIPT-HASH}}"
_TEXT_FIELDS = ("reasoning", "code", "output", "error")
_SUBCALL_TEXT = ("prompt_preview", "response_preview", "error")


@dataclass
class HtmlExport:
    """The file's text, and what was cut from it (``label``, original chars) to keep it small."""

    html: str
    cut: list[dict[str, Any]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.html.encode())


def run_html(run_id: str, events: Sequence[Event], cap: int = BLOCK_CAP) -> HtmlExport:
    """The run whose events (seq order) are ``events`` as one HTML file; see the module docstring."""
    trace = build_trace(events)
    cut: list[dict[str, Any]] = []
    nodes = {name: _node(node, cap, cut) for name, node in trace["nodes"].items()}
    run = {**trace["run"], "answer": _clip(trace["run"].get("answer"), cap, cut, "the answer")}
    payload = _masked(
        {
            "run_id": run_id,
            "exported_at": time.time(),
            "run": run,
            "nodes": nodes,
            "timeline": timeline_rows(trace),
            "cap": cap,
            "cut": cut,
        }
    )
    return HtmlExport(_fill(payload), cut)


def _node(node: dict[str, Any], cap: int, cut: list[dict[str, Any]]) -> dict[str, Any]:
    where = "root" if node["node"] == "root" else f"child {node['node']}"
    steps = []
    for step in node["steps"]:
        label = f"{where} step {step['step']}"
        clipped = {k: _clip(step.get(k), cap, cut, f"{label} {k}") for k in _TEXT_FIELDS}
        subcalls = [{**s, **{k: _clip(s.get(k), cap, cut, f"{label} sub-call {k}") for k in _SUBCALL_TEXT}}
                    for s in step["subcalls"]]  # fmt: skip
        steps.append({**step, **clipped, "subcalls": subcalls})
    return {**node, "steps": steps}


def _clip(text: str | None, cap: int, cut: list[dict[str, Any]], label: str) -> str | None:
    """``text`` whole when it fits ``cap``; else its head and tail with a marker saying how much went."""
    if text is None or len(text) <= cap:
        return text
    half = cap // 2
    cut.append({"label": label, "chars": len(text), "kept": 2 * half})
    return f"{text[:half]}\n\n[… {len(text) - 2 * half:,} characters cut: see the note at the top …]\n\n{text[-half:]}"


def _masked(data: Any) -> Any:
    """Every string (keys too) through ``redact_text``: the store's events are masked already, this is a
    second net for a file that is made to be shared."""
    if isinstance(data, dict):
        return {redact_text(str(k)): _masked(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_masked(v) for v in data]
    return redact_text(data) if isinstance(data, str) else data


def _fill(payload: dict[str, Any]) -> str:
    page = resources.files("fleet_rlm.core").joinpath(_TEMPLATE).read_text(encoding="utf-8")
    start = page.index(_SCRIPT_OPEN) + len(_SCRIPT_OPEN)
    end = page.index("</script>", start)
    digest = base64.b64encode(hashlib.sha256(page[start:end].encode()).digest()).decode()
    # Only markup-free JSON goes in: JSON.parse reads the escapes back, the HTML parser never sees "<".
    data = (
        json.dumps(payload, ensure_ascii=False)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
    # Filled before the script only, so nothing from the run can alter the code the hash allows.
    return page[:start].replace(_CSP_MARK, f"sha256-{digest}").replace(_DATA_MARK, data) + page[start:]


def timeline_rows(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The waterfall the web UI draws (webui/static/timeline.js), as rows of bars in seconds from the
    run's start: ``[{label, depth, bars: [{start, end, kind, title}]}]``."""
    t0 = trace["run"].get("started")
    if t0 is None:
        return []
    end = trace["run"].get("finished") or t0
    rows = [{"label": "run", "depth": 0, "bars": [_bar(t0, t0, end, "run", f"run {trace['run']['status']}")]}]
    _node_rows(trace["nodes"], "root", 0, t0, rows)
    return rows


def _node_rows(nodes: dict[str, Any], name: str, depth: int, t0: float, rows: list[dict[str, Any]]) -> None:
    node = nodes.get(name)
    if node is None:
        return
    if name != "root" and node.get("started"):
        finished = node.get("finished") or node["started"]
        bar = _bar(t0, node["started"], finished, "child", f"child {name} {node['status']}")
        rows.append({"label": name, "depth": depth, "bars": [bar]})
    for step in node["steps"]:
        bars = []
        lm = step["lm"] or {}
        if step["ts"]:
            bars.append(_bar(t0, step["ts"] - (lm.get("latency") or 0), step["ts"], "lm", f"step {step['step']} model"))
        if step["ts_end"]:
            start = step["ts_end"] - (step["duration"] or 0)
            bars.append(_bar(t0, start, step["ts_end"], "code", f"step {step['step']} code"))
        if bars:
            rows.append({"label": f"{'' if name == 'root' else name + ' '}step {step['step']}", "depth": depth,
                         "bars": bars})  # fmt: skip
        calls = [_bar(t0, s["ts"] - (s.get("latency") or 0), s["ts"], "sub", "sub-query") for s in step["subcalls"]]
        for lane in pack_lanes(calls):
            rows.append({"label": "", "depth": depth + 1, "bars": lane, "thin": True})
        for child in step["children"]:
            _node_rows(nodes, child, depth + 1, t0, rows)


def _bar(t0: float, start: float, end: float, kind: str, title: str) -> dict[str, Any]:
    return {"start": round(start - t0, 4), "end": round(max(end, start) - t0, 4), "kind": kind, "title": title}


def pack_lanes(bars: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Concurrent bars into the fewest lanes without overlap (greedy by start)."""
    lanes: list[list[dict[str, Any]]] = []
    for bar in sorted(bars, key=lambda b: b["start"]):
        lane = next((la for la in lanes if la[-1]["end"] <= bar["start"] + 1e-6), None)
        if lane is None:
            lanes.append([bar])
        else:
            lane.append(bar)
    return lanes
