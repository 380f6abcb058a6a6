"""The event bus: durable first, then live fan-out, and tailing of other processes' runs.

Every step of a run emits an event. ``EventBus.publish`` queues it for the store's writer thread
and returns at once: the event loop never waits for SQLite. The writer commits what is queued
(assigning each run's next gap-free ``seq``) and only then hands the stored events to live
subscribers (web SSE, MCP progress, CLI progress), each on its own loop. ``flush`` waits until
everything published so far is stored. Subscribers can start from any ``seq``: stored events are
replayed, then live ones follow with no gaps and no duplicates.

Events of a run that this process does not run (the CLI runs it, the web app watches) never
arrive live here, so a subscription tails the store for them: it reads the run's new events
every 0.1 s while there are some, backing off to 0.5 s when idle, and each read also checks that
the run's owner still lives (``store.runs.get``), so a killed owner's run ends with its
``interrupted`` ``run.finished``. ``subscribe(None)`` tails every other process's runs by the
store's global event order.

Envelope, kinds and payloads: ``fleet_rlm.types`` (``run.finished`` is always a run's last
event). Secrets never reach events: the store passes every event's data through
``fleet_rlm.redaction.redact`` before writing it, and subscribers only ever see what was stored.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from fleet_rlm.redaction import redact
from fleet_rlm.store import Store
from fleet_rlm.types import EVENT_KINDS, EVENT_VERSION, RUN_FINISHED, Event

__all__ = ["EVENT_KINDS", "EVENT_VERSION", "RUN_FINISHED", "EventBus"]

_PAGE = 500  # events per store read during replay / catch-up / tailing
_POLL_MIN, _POLL_MAX = 0.1, 0.5  # seconds between reads of the store while tailing: busy, idle


class _Subscriber:
    """A bounded queue owned by one event loop, plus what overflowed from it."""

    def __init__(self, run_id: str | None, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.run_id = run_id
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=size)
        # run_id -> lowest seq we failed to enqueue. Non-empty means "lagging":
        # the reader re-reads those runs from the store before anything else.
        self.missed: dict[str, int] = {}
        self.closed = False

    def offer(self, events: list[Event]) -> None:
        # Always runs on self.loop's thread, so no locking is needed here.
        if self.closed:
            return
        for event in events:
            try:
                self.queue.put_nowait(event)
            except asyncio.QueueFull:
                run_id, seq = event["run_id"], event["seq"]
                self.missed[run_id] = min(seq, self.missed.get(run_id, seq))


class _Tail:
    """When to read the store next for events that do not arrive live, and the reading."""

    def __init__(self, read: Callable[[], Awaitable[list[Event]]]) -> None:
        self._read = read
        self._delay = _POLL_MIN
        self.due = time.monotonic() + _POLL_MIN

    async def poll(self) -> list[Event]:
        batch = await self._read()
        self._delay = _POLL_MIN if batch else min(self._delay * 2, _POLL_MAX)
        self.due = time.monotonic() + self._delay
        return batch


class EventBus:
    """Non-blocking durable publish + live, gap-free, replayable subscriptions."""

    def __init__(self, store: Store, *, queue_size: int = 1000) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self._store = store
        self._queue_size = queue_size
        self._subs: list[_Subscriber] = []
        self._lock = threading.Lock()  # subscribers come and go on loops; delivery runs on the writer
        store.add_listener(self._deliver)

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
    ) -> None:
        """Queue the event and return at once; subscribers get it once it is stored (and redacted).

        Thread-safe. ``data`` belongs to the bus from here on: do not change it afterwards."""
        self._store.runs.queue_event(run_id, kind, data, node=node, parent=parent, depth=depth)

    def end_unstored(self, run_id: str, data: dict[str, Any]) -> Event:
        """Hand the run's ``run.finished`` to those who follow it live, though the store could not take
        it (its disk is full): they end instead of waiting for an event that never commits. It has the
        seq the store gives it when it can be written; the engine writes it then (``Engine._finish``)."""
        event: Event = {
            "v": EVENT_VERSION,
            "run_id": run_id,
            "seq": self._store.runs.last_seq(run_id) + 1,
            "ts": time.time(),
            "kind": RUN_FINISHED,
            "node": "root",
            "parent": None,
            "depth": 0,
            "data": json.loads(json.dumps(redact(data), default=str)),  # as a stored event reads
        }
        self._deliver([event])
        return event

    async def flush(self) -> None:
        """Wait until every event published so far is stored and handed to subscribers."""
        await asyncio.wrap_future(self._store.barrier())

    def _deliver(self, events: list[Event]) -> None:
        """On the store's writer thread, right after a commit: on to each subscriber's loop."""
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            mine = events if sub.run_id is None else [e for e in events if e["run_id"] == sub.run_id]
            if not mine:
                continue
            try:
                sub.loop.call_soon_threadsafe(sub.offer, mine)
            except RuntimeError:  # that loop is closed; its subscriber is gone
                self._remove(sub)

    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subs)

    def _remove(self, sub: _Subscriber) -> None:
        sub.closed = True
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    async def subscribe(self, run_id: str | None, after_seq: int = 0) -> AsyncGenerator[Event, None]:
        """Yield a run's events with seq > ``after_seq``: stored ones, then new ones as they commit.

        Ends after the run's ``run.finished`` event. ``run_id=None`` follows every run's new
        events (no replay), this process's and others', and never ends by itself.
        Close the generator (``aclose``/``contextlib.aclosing``) to unsubscribe.
        """
        sub = _Subscriber(run_id, asyncio.get_running_loop(), self._queue_size)
        # Register before reading the store: an event committed meanwhile is
        # then in the replay or in the queue (or both -- deduped by seq below).
        with self._lock:
            self._subs.append(sub)
        last: dict[str, int] = {}  # run_id -> last seq yielded
        try:
            batch: list[Event] = []
            if run_id is not None:
                last[run_id] = after_seq
                # Reading the run closes it out if its owner process died: the replay then ends
                # with that run.finished instead of waiting for events that will never come.
                await asyncio.to_thread(self._store.runs.get, run_id)
                batch = await self._read_after(run_id, after_seq)
                if not batch and await self._finished_by(run_id, after_seq):
                    return
                tail = None if self._store.runs.writes(run_id) else self._tail_run(run_id, last)
            else:
                tail = self._tail_all(await asyncio.to_thread(self._store.runs.event_cursor))
            while True:
                for event in batch:
                    rid, seq = event["run_id"], event["seq"]
                    if seq <= last.get(rid, seq - 1):
                        continue  # already yielded via replay, catch-up or tailing
                    last[rid] = seq
                    yield event
                    if run_id is not None and event["kind"] == RUN_FINISHED:
                        return
                batch = await self._next_batch(sub, last, tail)
        finally:
            self._remove(sub)

    async def _next_batch(self, sub: _Subscriber, last: dict[str, int], tail: _Tail | None) -> list[Event]:
        """Wait for the next live event(s) or the next read of the store; fill any gap from the store."""
        if sub.missed:
            # Lagging: the queue overflowed. Drain it, then re-read every run
            # involved from the store, from just after what we last yielded
            # (or the lowest seq we know of, for runs we have not seen yet).
            lowest = dict(sub.missed)
            sub.missed.clear()
            while not sub.queue.empty():
                ev = sub.queue.get_nowait()
                lowest[ev["run_id"]] = min(ev["seq"], lowest.get(ev["run_id"], ev["seq"]))
            batch: list[Event] = []
            for rid, low in lowest.items():
                batch += await self._read_after(rid, last.get(rid, low - 1))
            return batch
        if tail is None:
            event = await sub.queue.get()
        else:
            # Checked first: a steady stream of live events must not starve the tail.
            if time.monotonic() >= tail.due:
                return await tail.poll()
            try:
                async with asyncio.timeout(tail.due - time.monotonic()):
                    event = await sub.queue.get()
            except TimeoutError:
                return await tail.poll()
        prev = last.get(event["run_id"])
        if prev is not None and event["seq"] > prev + 1:
            # A gap: this run's earlier events took another path (tailing not caught up yet,
            # another process). Every lower seq is already committed, so read the gap.
            return await self._read_after(event["run_id"], prev)
        return [event]

    def _tail_run(self, run_id: str, last: dict[str, int]) -> _Tail:
        """One run that another process writes, from the last seq yielded on."""

        def read(after_seq: int) -> list[Event]:
            self._store.runs.get(run_id)  # closes the run out if its owner died: its run.finished follows
            return self._store.runs.events(run_id, after_seq, _PAGE)

        return _Tail(lambda: asyncio.to_thread(read, last[run_id]))

    def _tail_all(self, cursor: int) -> _Tail:
        """Every other process's runs, by the store's global event order from ``cursor`` on."""

        def read() -> list[Event]:
            nonlocal cursor
            self._store.runs.mark_interrupted()  # a dead owner's runs end here too
            out: list[Event] = []
            while len(out) < _PAGE:  # pages of this process's own events yield nothing: read on
                events, after = self._store.runs.events_since(cursor, _PAGE, others_only=True)
                if after == cursor:
                    break
                out += events
                cursor = after
            return out

        return _Tail(lambda: asyncio.to_thread(read))

    async def _read_after(self, run_id: str, after_seq: int) -> list[Event]:
        out: list[Event] = []
        while True:
            # Off the loop thread: a long replay must not stall other clients.
            page = await asyncio.to_thread(self._store.runs.events, run_id, after_seq, _PAGE)
            out += page
            if len(page) < _PAGE:
                return out
            after_seq = page[-1]["seq"]

    async def _finished_by(self, run_id: str, after_seq: int) -> bool:
        """True if the run's log already ended with run.finished at seq <= ``after_seq``."""
        last_seq = await asyncio.to_thread(self._store.runs.last_seq, run_id)
        if last_seq == 0 or last_seq > after_seq:
            return False
        tail = await asyncio.to_thread(self._store.runs.events, run_id, last_seq - 1, 1)
        return bool(tail) and tail[0]["kind"] == RUN_FINISHED
