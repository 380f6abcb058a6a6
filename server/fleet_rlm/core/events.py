"""The in-process event bus: durable first, then live fan-out.

Every step of a run emits an event. ``EventBus.publish`` writes it to the
``Store`` (which assigns the run's next gap-free ``seq``) and only then hands
it to live subscribers (web SSE, MCP progress, CLI progress). Subscribers can
start from any ``seq``: stored events are replayed, then live ones follow with
no gaps and no duplicates.

Envelope (version ``EVENT_VERSION``)::

    {"v": 1, "run_id", "seq", "ts", "kind", "node", "parent", "depth", "data"}

Kinds:

- ``run.started`` -- the run began (data: question, request).
- ``run.finished`` -- always the last event of a run (data: status
  succeeded|failed|cancelled|interrupted, answer, usage, stop_reason).
- ``lm.call`` -- one language-model call finished (model, usage, latency).
- ``code.executed`` -- one REPL code block ran (code, output, error).
- ``subcall.finished`` -- a sub-LM call (``llm_query``) returned.
- ``child.started`` / ``child.finished`` -- a child RLM node began / ended.
- ``warning`` -- something worth showing that did not stop the run.
- ``context.loaded`` -- the inputs reached the REPL (chars, sources, skipped files, report).

Secrets never reach events: the store passes every event's data through
``fleet_rlm.redaction.redact`` (configured secret values and key-shaped strings) before
writing it, and subscribers only ever see what was stored.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from fleet_rlm.store import Store
from fleet_rlm.store.store import EVENT_VERSION

__all__ = ["EVENT_KINDS", "EVENT_VERSION", "RUN_FINISHED", "EventBus"]

RUN_FINISHED = "run.finished"
EVENT_KINDS = frozenset(
    {
        "run.started",
        RUN_FINISHED,
        "lm.call",
        "code.executed",
        "subcall.finished",
        "child.started",
        "child.finished",
        "warning",
        "context.loaded",
    }
)

# -- bus -----------------------------------------------------------------------

_PAGE = 500  # events per store read during replay / catch-up


class _Subscriber:
    """A bounded queue owned by one event loop, plus what overflowed from it."""

    def __init__(self, run_id: str | None, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.run_id = run_id
        self.loop = loop
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=size)
        # run_id -> lowest seq we failed to enqueue. Non-empty means "lagging":
        # the reader re-reads those runs from the store before anything else.
        self.missed: dict[str, int] = {}
        self.closed = False

    def offer(self, event: dict[str, Any]) -> None:
        # Always runs on self.loop's thread, so no locking is needed here.
        if self.closed:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            run_id, seq = event["run_id"], event["seq"]
            self.missed[run_id] = min(seq, self.missed.get(run_id, seq))


class EventBus:
    """Durable publish + live, gap-free, replayable subscriptions."""

    def __init__(self, store: Store, *, queue_size: int = 1000) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self._store = store
        self._queue_size = queue_size
        self._subs: list[_Subscriber] = []
        self._lock = threading.Lock()  # publish may run on any thread

    @property
    def store(self) -> Store:
        return self._store

    def publish(
        self,
        run_id: str,
        kind: str,
        data: dict[str, Any],
        *,
        node: str = "root",
        parent: str | None = None,
        depth: int = 0,
    ) -> dict[str, Any]:
        """Store the event (the store redacts it), then deliver it to live subscribers. Thread-safe."""
        event = self._store.append_event(run_id, kind, data, node=node, parent=parent, depth=depth)
        with self._lock:
            targets = [s for s in self._subs if s.run_id is None or s.run_id == run_id]
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for sub in targets:
            if sub.loop is current:
                sub.offer(event)  # same thread: deliver now, preserving order
                continue
            try:
                sub.loop.call_soon_threadsafe(sub.offer, event)
            except RuntimeError:  # that loop is closed; its subscriber is gone
                self._remove(sub)
        return event

    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subs)

    def _remove(self, sub: _Subscriber) -> None:
        sub.closed = True
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    async def subscribe(self, run_id: str | None, after_seq: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Yield a run's events with seq > ``after_seq``: stored ones, then live ones.

        Ends after the run's ``run.finished`` event. ``run_id=None`` follows
        every run's live events (no replay) and never ends by itself.
        Close the generator (``aclose``/``contextlib.aclosing``) to unsubscribe.
        """
        sub = _Subscriber(run_id, asyncio.get_running_loop(), self._queue_size)
        # Register before reading the store: an event published meanwhile is
        # then in the replay or in the queue (or both -- deduped by seq below).
        with self._lock:
            self._subs.append(sub)
        last: dict[str, int] = {}  # run_id -> last seq yielded
        try:
            batch: list[dict[str, Any]] = []
            if run_id is not None:
                last[run_id] = after_seq
                # Reading the run closes it out if its owner process died: the replay then ends
                # with that run.finished instead of waiting for events that will never come.
                await asyncio.to_thread(self._store.get_run, run_id)
                batch = await self._read_after(run_id, after_seq)
                if not batch and await self._finished_by(run_id, after_seq):
                    return
            while True:
                for event in batch:
                    rid, seq = event["run_id"], event["seq"]
                    if seq <= last.get(rid, seq - 1):
                        continue  # already yielded via replay or catch-up
                    last[rid] = seq
                    yield event
                    if run_id is not None and event["kind"] == RUN_FINISHED:
                        return
                batch = await self._next_batch(sub, last)
        finally:
            self._remove(sub)

    async def _next_batch(self, sub: _Subscriber, last: dict[str, int]) -> list[dict[str, Any]]:
        """Wait for the next live event(s); fill any gap from the store."""
        if sub.missed:
            # Lagging: the queue overflowed. Drain it, then re-read every run
            # involved from the store, from just after what we last yielded
            # (or the lowest seq we know of, for runs we have not seen yet).
            lowest = dict(sub.missed)
            sub.missed.clear()
            while not sub.queue.empty():
                ev = sub.queue.get_nowait()
                lowest[ev["run_id"]] = min(ev["seq"], lowest.get(ev["run_id"], ev["seq"]))
            batch: list[dict[str, Any]] = []
            for rid, low in lowest.items():
                batch += await self._read_after(rid, last.get(rid, low - 1))
            return batch
        event = await sub.queue.get()
        prev = last.get(event["run_id"])
        if prev is not None and event["seq"] > prev + 1:
            # Out of order (publishers on several threads). Every lower seq is
            # already committed -- it was assigned first -- so read the gap.
            return await self._read_after(event["run_id"], prev)
        return [event]

    async def _read_after(self, run_id: str, after_seq: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            # Off the loop thread: a long replay must not stall other clients.
            page = await asyncio.to_thread(self._store.events, run_id, after_seq, _PAGE)
            out += page
            if len(page) < _PAGE:
                return out
            after_seq = page[-1]["seq"]

    async def _finished_by(self, run_id: str, after_seq: int) -> bool:
        """True if the run's log already ended with run.finished at seq <= ``after_seq``."""
        last_seq = await asyncio.to_thread(self._store.last_seq, run_id)
        if last_seq == 0 or last_seq > after_seq:
            return False
        tail = await asyncio.to_thread(self._store.events, run_id, last_seq - 1, 1)
        return bool(tail) and tail[0]["kind"] == RUN_FINISHED
