"""Live progress of a run on stderr: step, sub-calls done/total, tokens, elapsed."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from fleet_rlm.core.progress import ProgressTracker


class Progress:
    """Feed it events; it redraws one status line (TTY) or prints one line per step (pipes)."""

    def __init__(self, mode: str = "compact", console: Console | None = None) -> None:
        self.mode = mode
        self.console = console or Console(stderr=True, highlight=False)
        self.live: Live | None = None
        self.started = time.monotonic()
        self.tracker = ProgressTracker()

    def __enter__(self) -> Progress:
        if self.mode != "off" and self.console.is_terminal:
            self.live = Live(self._line(), console=self.console, refresh_per_second=8, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.__exit__(None, None, None)

    def _line(self) -> Text:
        p = self.tracker.state
        parts = [f"step {p.step}" + (f" ({p.node})" if p.node != "root" else "")]
        if p.subqueries_total:
            parts.append(f"{p.subqueries_done}/{p.subqueries_total} sub-queries")
        if p.children:
            parts.append(f"{p.children} child RLMs")
        parts += [f"{p.tokens:,} tokens", f"{time.monotonic() - self.started:.1f}s"]
        return Text(" · ".join(parts), style="cyan")

    def feed(self, event: dict[str, Any]) -> None:
        self.tracker.feed(event)
        if self.mode == "off":
            return
        line = self._describe(event)
        shown = {"code.executed", "warning", "child.started", "context.loaded"}
        if line and (self.mode == "verbose" or event["kind"] in shown):
            self.console.print(line, markup=False, highlight=False)
        if self.live:
            self.live.update(self._line())

    def _describe(self, event: dict[str, Any]) -> str | None:
        kind, data, node = event["kind"], event.get("data") or {}, event.get("node", "root")
        prefix = "  " * int(event.get("depth") or 0)
        if kind == "code.executed":
            first = (data.get("code") or "").strip().splitlines()[:1]
            status = "error" if data.get("error") else ("submitted" if data.get("submitted") else "ok")
            line = f"{prefix}[{node}] step {data.get('step')}: {first[0][:80] if first else ''} → {status}"
            if self.mode == "verbose":
                line += "\n" + _indent(data.get("code") or "", prefix + "    | ")
                line += "\n" + _indent((data.get("output") or "")[:2000], prefix + "    > ")
            return line
        if kind == "context.loaded":
            return "context: " + str(data.get("report")) if data.get("sources") else None
        if kind == "warning":
            return f"{prefix}[{node}] warning: {data.get('message')}"
        if kind == "child.started":
            return f"{prefix}[{node}] child RLM: {(data.get('query_preview') or '')[:80]}"
        if kind == "lm.call" and self.mode == "verbose":
            return f"{prefix}[{node}] thinking: {(data.get('reasoning') or '')[:300]}"
        if kind == "subcall.finished" and self.mode == "verbose":
            p = self.tracker.state
            return f"{prefix}[{node}] sub-query {p.subqueries_done}/{p.subqueries_total}: " \
                   f"{(data.get('response_preview') or data.get('error') or '')[:80]}"
        return None


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines() or [""])
