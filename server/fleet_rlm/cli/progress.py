"""Live progress of a run on stderr: step, what the run waits for and for how long, sub-calls
done/total, tokens, elapsed. On a terminal the line is redrawn twice a second, so the clocks
keep ticking while a slow model thinks; elsewhere it prints one line per step."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Self

from rich.console import Console
from rich.live import Live
from rich.text import Text

from fleet_rlm.core.progress import ProgressTracker, fetched_line

REFRESH_PER_SECOND = 2


class LiveLine:
    """A status line (``__rich__``) that a terminal redraws while the ``with`` block runs."""

    console: Console
    live: Live | None = None
    redirect = True  # while live, what the process prints goes above the line (rich's stream proxies)

    def __rich__(self) -> Text:
        raise NotImplementedError

    def wants_live(self) -> bool:
        return self.console.is_terminal

    def feed(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    async def follow(self, engine: Any, job_id: str) -> None:
        """Show a job's (a run's, an optimization's) events until it ends; Ctrl-C cancels the job,
        which is recorded as cancelled."""
        try:
            with self:
                async for event in engine.subscribe(job_id):
                    self.feed(event)
        except (KeyboardInterrupt, asyncio.CancelledError):
            await engine.cancel(job_id)
            raise

    def __enter__(self) -> Self:
        if self.wants_live():
            # Live re-renders ``self`` on every refresh (``__rich__``): the timers tick between events.
            self.live = Live(self, console=self.console, refresh_per_second=REFRESH_PER_SECOND, transient=True,
                             redirect_stdout=self.redirect, redirect_stderr=self.redirect)  # fmt: skip
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.__exit__(None, None, None)


class Progress(LiveLine):
    """Feed it events; it redraws one status line (TTY) or prints one line per step (pipes)."""

    def __init__(self, mode: str = "compact", console: Console | None = None) -> None:
        self.mode = mode
        self.console = console or Console(stderr=True, highlight=False)
        self.started = time.monotonic()
        self.tracker = ProgressTracker()
        self.waiting = ""
        self.waiting_since = self.started

    def wants_live(self) -> bool:
        return self.mode != "off" and super().wants_live()

    def __rich__(self) -> Text:
        return self.line()

    def line(self, now: float | None = None) -> Text:
        """The status line: ``step 2 · waiting for the model (12s) · 1,234 tokens · 15.0s``."""
        now = time.monotonic() if now is None else now
        p = self.tracker.state
        parts = [f"step {p.step}" + (f" ({p.node})" if p.node != "root" else "")]
        if self.waiting:
            parts.append(f"{self.waiting} ({now - self.waiting_since:.0f}s)")
        if p.children:
            parts.append(f"{p.children} child RLMs")
        parts += [f"{p.tokens:,} tokens", f"{now - self.started:.1f}s"]
        return Text(" · ".join(parts), style="cyan")

    def feed(self, event: dict[str, Any]) -> None:
        self.tracker.feed(event)
        waiting = self.tracker.state.waiting
        if _wait_kind(waiting) != _wait_kind(self.waiting):
            self.waiting_since = time.monotonic()
        self.waiting = waiting
        if self.mode == "off":
            return
        line = self._describe(event)
        shown = {"code.executed", "warning", "child.started", "context.loaded", "context.fetched"}
        if line and (self.mode == "verbose" or event["kind"] in shown):
            if self.live:  # above the live line, which rich redraws
                self.console.print(line, markup=False, highlight=False)
            else:  # a pipe or a file: plain lines, unwrapped (rich's layout costs ~0.3 ms a step)
                self.console.file.write(line + "\n")
        if self.live:
            self.live.refresh()

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
        if kind == "context.fetched":
            return "fetched " + fetched_line(data)
        if kind == "warning":
            return f"{prefix}[{node}] warning: {data.get('message')}"
        if kind == "child.started":
            return f"{prefix}[{node}] child RLM: {(data.get('query_preview') or '')[:80]}"
        if kind == "lm.call" and self.mode == "verbose":
            return f"{prefix}[{node}] thinking: {(data.get('reasoning') or '')[:300]}"
        if kind == "subcall.finished" and self.mode == "verbose":
            p = self.tracker.state
            return (
                f"{prefix}[{node}] sub-query {p.subqueries_done}/{p.subqueries_total}: "
                f"{(data.get('response_preview') or data.get('error') or '')[:80]}"
            )
        return None


def _wait_kind(waiting: str) -> str:
    """What the run waits for without its count: a batch answering one sub-query after another ("3/64
    sub-queries") is one wait, whose clock keeps running instead of restarting at each answer."""
    count, _, rest = waiting.partition(" ")
    return rest if rest == "sub-queries" and "/" in count else waiting


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines() or [""])
