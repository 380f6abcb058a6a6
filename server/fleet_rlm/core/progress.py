"""Fold a run's events into counters and one human line ("step 3 · 40/64 sub-queries").

Every face shows progress the same way: the CLI's live line, MCP progress notifications and
``get_run`` all read this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet_rlm.types import Event, tokens_of

WAITING_MODEL = "waiting for the model"


def fetched_line(data: dict[str, Any]) -> str:
    """A ``context.fetched`` event in words: "http://host/page.html (12,345 bytes, HTTP 200, 0.1 s)"."""
    if data.get("kind") == "repo":
        what = f"{int(data.get('files') or 0):,} files, {int(data.get('bytes') or 0):,} bytes"
    else:
        what = f"{int(data.get('bytes') or 0):,} bytes, HTTP {data.get('status')}"
    return f"{data.get('name') or data.get('url')} ({what}, {float(data.get('seconds') or 0):.1f} s)"


@dataclass
class RunProgress:
    step: int = 0  # latest step of the node that last acted
    node: str = "root"
    root_steps: int = 0
    llm_calls: int = 0  # root steps, child steps and sub-queries
    subqueries_done: int = 0
    subqueries_total: int = 0  # the batch in progress (0 outside a batch)
    children: int = 0
    tokens: int = 0
    errors: int = 0  # code steps that raised
    events: int = 0
    message: str = ""  # the latest progress line
    waiting: str = ""  # what the run is busy with now: "waiting for the model", "running code", ...


class ProgressTracker:
    """Feed events in seq order; ``feed`` returns the new progress line, or None if nothing to say."""

    def __init__(self) -> None:
        self.state = RunProgress()
        self._batches: dict[tuple[str, Any], int] = {}  # (node, batch id) -> sub-queries finished

    def feed(self, event: Event) -> str | None:
        s = self.state
        s.events += 1
        kind, data, node = event["kind"], event.get("data") or {}, event.get("node") or "root"
        where = "" if node == "root" else f"{node} "
        line: str | None = None
        if kind == "run.started":
            line = f"run {event.get('run_id')} started"
            # A session's follow-up without new inputs loads nothing: the model is asked at once.
            s.waiting = WAITING_MODEL if data.get("session_id") else "loading the context"
        elif kind == "context.fetched":
            line = "fetched " + fetched_line(data)
        elif kind == "context.loaded":
            s.waiting = WAITING_MODEL
        elif kind == "lm.call":
            s.step, s.node = int(data.get("step") or s.step), node
            if node == "root":
                s.root_steps = max(s.root_steps, s.step)
            s.llm_calls += 1
            s.tokens += tokens_of(data)
            s.subqueries_done = s.subqueries_total = 0
            line = f"{where}step {s.step} · running code"
            s.waiting = "running code" if data.get("predictor", "act") == "act" else "finishing"
        elif kind == "subcall.finished":
            s.llm_calls += 1
            s.tokens += tokens_of(data)
            done, total = _batch_progress(self._batches, node, data)
            s.subqueries_done, s.subqueries_total = done, total
            line = f"{where}step {s.step} · {done}/{total} sub-queries"
            s.waiting = f"{done}/{total} sub-queries" if done < total else "running code"
        elif kind == "code.executed":
            step = data.get("step", s.step)
            s.waiting = "finishing" if data.get("submitted") else WAITING_MODEL
            if data.get("error"):
                s.errors += 1
                line = f"{where}step {step} · error: {str(data['error']).splitlines()[-1][:120]}"
            elif data.get("submitted"):
                line = f"{where}step {step} · answer submitted"
            else:
                line = f"{where}step {step} · code ran, {int(data.get('output_chars') or 0):,} chars of output"
        elif kind == "child.started":
            s.children += 1
            s.waiting = f"child RLM {node}"
            line = f"child {node} started: {(data.get('query_preview') or '')[:80]}"
        elif kind == "child.finished":
            line = f"child {node} {data.get('status') or 'finished'}"
            s.waiting = "running code"
        elif kind == "warning":
            line = f"{where}warning: {str(data.get('message'))[:160]}"
        elif kind == "run.finished":
            line = f"run {data.get('status')}" + (f": {data['error']}" if data.get("error") else "")
            s.waiting = ""
        if line:
            s.message = line
        return line


def _batch_progress(batches: dict[tuple[str, Any], int], node: str, data: dict[str, Any]) -> tuple[int, int]:
    """(done, total) for the batch this sub-query belongs to; a lone llm_query is 1/1."""
    batch = data.get("batch")
    if not isinstance(batch, dict):
        return 1, 1
    key = (node, batch.get("id"))
    batches[key] = batches.get(key, 0) + 1
    return batches[key], int(batch.get("size") or batches[key])
