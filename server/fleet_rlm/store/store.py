"""The store: one SQLite file (WAL) and one repository per domain.

``Store`` is thin: the file's path, a read connection, and the writer thread (``store/writer.py``).
The rows live in its repositories, each its own class over that core (``rows.Database``):
``store.runs`` (runs and their events: ``runs.py``), ``store.sessions``, ``store.uploads`` (uploads,
the runs that read them, feedback), ``store.records`` (what runs' calls returned, for replay and fork),
``store.optimize`` (datasets, program versions, optimizations) and ``store.agent`` (the workspace
agent's conversations and approvals). Each returns typed rows: dataclasses, exported by ``fleet_rlm.store``.

Writes and reads take separate paths. Every write runs on the store's one writer thread, queued and
group-committed. The repositories' write methods wait for their commit and may be called from any
thread; ``write`` is the same without blocking an event loop; ``runs.queue_event`` does not wait at
all (``EventBus.publish``), and ``add_listener`` hands committed events on. Reads use their own
connection and stay synchronous: in WAL mode they never wait for the writer. Several processes (CLI
and web server) may open the same file; each commit takes SQLite's write lock up front
(``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from fleet_rlm.store.agent import AgentTables
from fleet_rlm.store.db import connect
from fleet_rlm.store.optimize import OptimizeTables
from fleet_rlm.store.owners import owner_alive
from fleet_rlm.store.records import RecordTables
from fleet_rlm.store.runs import RunTables
from fleet_rlm.store.sessions import SessionTables
from fleet_rlm.store.uploads import UploadTables
from fleet_rlm.store.writer import Writer
from fleet_rlm.types import Event

__all__ = ["Store"]
T = TypeVar("T")


class Store:
    """One SQLite file: its read connection, its writer thread, and a repository per domain."""

    def __init__(self, path: Path, *, alive: Callable[[int, str | None], bool] = owner_alive) -> None:
        """``alive(pid, start)`` says whether a run's owner still runs (tests pass their own)."""
        self.path = Path(path)
        self._conn = connect(self.path)  # reads only; writes go through self.writer
        self._lock = threading.Lock()  # one read at a time on the read connection
        self.writer = Writer(self.path)
        # Commits what is queued when the store is closed, collected, or the interpreter exits.
        self._finalizer = weakref.finalize(self, self.writer.close)
        self.runs = RunTables(self, alive=alive)
        self.sessions = SessionTables(self)
        self.uploads = UploadTables(self)
        self.records = RecordTables(self)
        self.optimize = OptimizeTables(self)
        self.agent = AgentTables(self)

    def close(self) -> None:
        """Commit every queued write, stop the writer thread, close the file."""
        self._finalizer()
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one query on the read connection (a WAL reader: it never waits for the writer)."""
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)`` for the writer thread, typically a repository's write
        method (it then joins the writer's transaction); the future is done once it committed."""
        future = self.writer.submit(lambda _tx: fn(*args, **kwargs))
        assert future is not None
        return future

    async def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``submit`` for an event loop: wait for the commit without blocking the loop. The write
        is shielded: cancelling the caller does not cancel it (it commits all the same)."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(fn, *args, **kwargs)))

    def barrier(self) -> Future[None]:
        """A future done once every write queued before it is committed and delivered."""
        return self.writer.barrier()

    def flush(self) -> None:
        """Wait until every write queued so far (e.g. by ``runs.queue_event``) is committed."""
        self.barrier().result()

    def add_listener(self, listener: Callable[[list[Event]], None]) -> None:
        """Call ``listener(events)`` with each commit's new events, in commit order, on the writer
        thread right after the commit: it must only hand them on (e.g. ``call_soon_threadsafe``)."""
        self.writer.listeners.append(listener)
