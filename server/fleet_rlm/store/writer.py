"""The store's single writer thread: every write of a ``Store`` runs on it, in group commits.

Modelled on Datasette's ``Database.execute_write_fn``: one thread owns the write connection, and
everyone else queues jobs for it. A queued job is a function of a ``Tx``; callers either wait for
its ``concurrent.futures.Future`` (``submit``) or queue it and move on (``submit(..., wait=False)``,
what ``EventBus.publish`` does, so the event loop never waits for SQLite).

The thread drains whatever is queued into one transaction (``BEGIN IMMEDIATE``, which takes
SQLite's write lock up front, across processes too), each job inside its own savepoint so one
failing job does not undo its neighbours. Only after ``COMMIT`` are futures resolved and what the
jobs published (``Tx.published``) handed to the listeners: durable before visible.

Queue order is commit order: a job commits with or after every job queued before it. A batch
that starts with a job nobody waits for (an event) stays open up to ``_LINGER`` for more (group
commit); a job somebody waits for closes it at once.

When the transaction itself fails, every job of the batch fails with it: the lock stayed busy
(``StoreLocked``), the disk is full (``StoreFull``: SQLite then rolls the whole transaction back
itself, savepoints and all, which ``Connection.in_transaction`` tells), ... The thread lives on, and
logs one line per outage rather than one per lost event.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from fleet_rlm.store.db import StoreError, connect, store_error

log = logging.getLogger(__name__)
T = TypeVar("T")
_MAX_BATCH = 1000  # jobs per transaction: bounds how long one commit keeps readers of its results waiting
# How long a queued event waits for company before it commits (group commit). A commit costs
# ~0.3 ms of CPU and, on a busy 2-core machine, slows the model call running beside it (the GIL);
# fast steps come every few ms, so one commit carries several. 10 ms later on a live view is not
# seen, and a write somebody waits for ends the wait.
_LINGER = 0.01
_STOP = object()


class Tx:
    """What a job sees: the write connection inside the batch's open transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.published: list[Any] = []  # handed to the listeners after COMMIT
        self.cache: dict[Any, Any] = {}  # valid for this transaction only (e.g. each run's next seq)


Job = Callable[[Tx], Any]
Listener = Callable[[list[Any]], None]


class Writer:
    """One thread, one connection, a queue of jobs. Started by the first write; ``close`` drains it."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards starting and closing
        self._thread: threading.Thread | None = None
        self._closed = False
        self._tx: Tx | None = None  # the open transaction; only the writer thread touches it
        self._lost_writes = 0  # queued writes lost since the last commit that worked (writer thread only)
        self.listeners: list[Listener] = []  # called on the writer thread, after COMMIT: must not block

    def submit(self, job: Job, *, wait: bool = True) -> Future[Any] | None:
        """Queue ``job``; its future (None when ``wait`` is False: failures are only logged)."""
        future: Future[Any] | None = Future() if wait else None
        with self._lock:  # so nothing is queued behind close()'s stop marker
            if self._closed:
                raise StoreError("the store is closed: open a new Store to write")
            if self._thread is None:
                self._start()
            self._queue.put((job, future))
        return future

    def run(self, job: Callable[[Tx], T]) -> T:
        """Run ``job`` and wait for its commit. On the writer thread (a job calling a write
        method of the store), it joins the open transaction instead: waiting would deadlock."""
        if threading.current_thread() is self._thread:
            if self._tx is None:
                raise RuntimeError("a store write from a commit listener: listeners must not write")
            return job(self._tx)
        future = self.submit(job)
        assert future is not None
        return future.result()

    def barrier(self) -> Future[None]:
        """Done once everything queued before it is committed and delivered."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("waiting for the store's writer on its own thread would deadlock")
        with self._lock:
            idle = self._thread is None or self._closed  # nothing queued, or close() drains it
        if idle:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return self.submit(_nothing)  # type: ignore[return-value]

    def close(self) -> None:
        """Commit what is queued, then stop the thread and close its connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_STOP)
        if thread is not None and threading.current_thread() is not thread:
            thread.join()

    def _start(self) -> None:
        # Under self._lock. Opened here, not on the thread, so a store that cannot be opened
        # fails the caller. A daemon so a store nobody closed does not hang the interpreter's
        # exit; the Store's finalizer (run at exit too) drains the queue first.
        conn = connect(self._path)
        self._thread = threading.Thread(target=self._main, args=(conn,), name="fleet-store-writer", daemon=True)
        self._thread.start()

    def _main(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                batch = [self._queue.get()]
                # Nobody waits for a queued event: give the ones that follow it a moment to join.
                until = 0.0 if _awaited(batch[0]) else time.monotonic() + _LINGER
                while len(batch) < _MAX_BATCH:
                    try:
                        batch.append(self._queue.get(timeout=max(0.0, until - time.monotonic())))
                    except queue.Empty:
                        break
                    if _awaited(batch[-1]):  # commit now
                        until = 0.0
                stop = batch[-1] is _STOP  # close() queues it last: nothing is queued after it
                self._commit(conn, batch[:-1] if stop else batch)
                if stop:
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[Job, Future[Any] | None]]) -> None:
        # A future cancelled while queued is not run (Store.write shields its own, so it never is).
        batch = [(job, f) for job, f in batch if f is None or f.set_running_or_notify_cancel()]
        if not batch:
            return
        outcomes: list[tuple[Future[Any] | None, Any, BaseException | None]] = []
        tx = Tx(conn)
        self._tx = tx
        try:
            conn.execute("BEGIN IMMEDIATE")
            # A lone job (the usual case: one event) needs no savepoint: undoing it is a rollback.
            lone = len(batch) == 1
            for job, future in batch:
                outcomes.append((future, *(_alone(tx, job) if lone else _in_savepoint(tx, job))))
            conn.execute("ROLLBACK" if lone and outcomes[0][2] is not None else "COMMIT")
        except Exception as exc:  # the transaction itself failed: the lock stayed busy, disk full, ...
            if conn.in_transaction:  # not when SQLite ended it itself (SQLITE_FULL rolls it back)
                with contextlib.suppress(sqlite3.Error):  # the thread must live on: callers wait on it
                    conn.execute("ROLLBACK")
            error = store_error(exc, self._path)
            self._lost(len(batch), error)
            for _, future in batch:
                if future is not None:
                    future.set_exception(error)
            return
        finally:
            self._tx = None
        self._recovered()
        # Visible only now. Listeners first: whoever waits on a future then finds the events delivered.
        if tx.published:
            for listener in list(self.listeners):
                try:
                    listener(tx.published)
                except Exception:
                    log.exception("a store commit listener failed")
        for future, result, error in outcomes:
            if error is not None:
                error = store_error(error, self._path)
            if future is None:
                if error is not None:
                    log.warning("a queued store write failed: %s", error)
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _lost(self, count: int, error: BaseException) -> None:
        """Say once per outage that writes are being lost (a full disk fails every commit until space
        is freed: one line, not one per event), and count them for the line that ends it."""
        if self._lost_writes == 0:
            log.error("the store could not commit %d queued write(s), which are lost: %s", count, error)
        else:
            log.debug("the store could not commit %d more queued write(s): %s", count, error)
        self._lost_writes += count

    def _recovered(self) -> None:
        if self._lost_writes:
            log.warning("the store commits again; %d queued write(s) were lost before", self._lost_writes)
            self._lost_writes = 0


def _in_savepoint(tx: Tx, job: Job) -> tuple[Any, BaseException | None]:
    """Run one job; on failure undo just its changes (and what it published). Errors of the
    transaction itself (SQLite ended it, ROLLBACK TO failing) propagate and fail the batch."""
    mark = len(tx.published)
    tx.conn.execute("SAVEPOINT job")
    try:
        result = job(tx)
    except Exception as exc:
        if not tx.conn.in_transaction:
            # SQLite ended the whole transaction itself (SQLITE_FULL rolls it back): the savepoint and
            # every job before this one are gone, so the batch fails, with this job's error.
            raise
        tx.conn.execute("ROLLBACK TO job")
        tx.conn.execute("RELEASE job")
        del tx.published[mark:]
        tx.cache.clear()  # it may describe rows the rollback removed
        return None, exc
    tx.conn.execute("RELEASE job")
    return result, None


def _awaited(item: Any) -> bool:
    """Somebody waits for this queued item: a write with a future, or ``close()``'s stop."""
    return item is _STOP or item[1] is not None


def _alone(tx: Tx, job: Job) -> tuple[Any, BaseException | None]:
    """Run a batch's only job; if it fails, the caller rolls the transaction back (if SQLite has
    not ended it itself: then it is the transaction's failure, which propagates)."""
    try:
        return job(tx), None
    except Exception as exc:
        if not tx.conn.in_transaction:
            raise
        tx.published.clear()
        return None, exc


def _nothing(tx: Tx) -> None:
    return None
