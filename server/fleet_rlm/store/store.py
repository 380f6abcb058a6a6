"""Durable store for runs, their event logs and sessions (SQLite, WAL).

Writes and reads take separate paths. Every write (runs, events, sessions) runs on the store's
one writer thread (``store/writer.py``), queued and group-committed. The public write methods
wait for their commit and may be called from any thread; ``write`` is the same without blocking an
event loop; ``queue_event`` does not wait at all (``EventBus.publish``), and ``add_listener``
hands committed events on. Reads use their own connection and stay synchronous: in WAL mode they
never wait for the writer. Several processes (CLI and web server) may open the same file; each
commit takes SQLite's write lock up front (``BEGIN IMMEDIATE``), so event sequence numbers stay
gap-free per run and unique across processes too. Every event also gets ``gid``, one order over
all runs and processes, never reused: ``events_since`` follows every run's new events with one
cursor, which is how one process shows runs that another process is running.

Nothing reaches the file unredacted: event data and the runs' free-text fields go through
``fleet_rlm.redaction.redact`` on the way in (on the writer thread, for events).

A run whose owning process died (killed, crashed, machine off) is closed out as
``interrupted`` the moment anyone reads it (``get_run``, ``list_runs``), not only when the
next engine starts. The owner is recognised by host, pid and process start stamp, so a pid
the OS recycled for another process does not keep a dead run "running".
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from fleet_rlm.redaction import redact
from fleet_rlm.store.agent import AgentTables
from fleet_rlm.store.db import connect
from fleet_rlm.store.optimize import OptimizeTables
from fleet_rlm.store.records import RecordTables
from fleet_rlm.store.rows import dumps
from fleet_rlm.store.writer import Tx, Writer
from fleet_rlm.types import ACTIVE_STATUSES, EVENT_VERSION, RUN_FINISHED, STATUSES, Event, RunStatus

__all__ = ["ACTIVE_STATUSES", "EVENT_VERSION", "STATUSES", "RunRecord", "SessionRecord", "Store"]
T = TypeVar("T")


@dataclass
class RunRecord:
    """One run (a question answered by a tree of RLM nodes)."""

    id: str
    question: str = ""
    session_id: str | None = None
    parent_run_id: str | None = None
    status: RunStatus = "queued"
    answer: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    request: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    iterations: int = 0
    llm_calls: int = 0
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    owner_pid: int | None = None
    owner_host: str | None = None
    owner_start: str | None = None  # see process_start(); set by create_run for this process's runs
    kind: str = "run"  # run | eval (an optimization's replay of a dataset row) | optimize (see store/db.py _V5)
    # | replay (a rerun answered from its parent run's record: core/tape.py)
    program_version: str | None = None  # the program version that answered (None: the built-in program)
    fork_at: str | None = None  # a fork: the step ("root:3") it branched from its parent run at
    pinned: bool = False  # kept by retention (operations.pin_run)


@dataclass
class SessionRecord:
    id: str
    name: str | None = None
    created_at: float = field(default_factory=time.time)
    last_used_at: float = field(default_factory=time.time)
    closed_at: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


# RunRecord field -> column. request/usage are stored as JSON text.
_RUN_COLUMNS = {f.name: f.name for f in fields(RunRecord)} | {
    "request": "request_json",
    "usage": "usage_json",
}
_JSON_FIELDS = frozenset({"request", "usage"})
# Free text that may quote a provider's error (or a user's paste): masked before it is stored.
_REDACTED_FIELDS = frozenset({"question", "answer", "stop_reason", "error", "request"})
_RUN_SELECT = "SELECT " + ", ".join(_RUN_COLUMNS.values()) + " FROM runs"
_SESSION_SELECT = "SELECT id, name, created_at, last_used_at, closed_at, meta_json FROM sessions"
_EVENT_COLUMNS = "run_id, seq, ts, kind, node, parent, depth, data_json"
_EVENT_SELECT = f"SELECT {_EVENT_COLUMNS} FROM events"


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(STATUSES)}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


@cache
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start stamp) of ``pid`` from /proc; None where /proc lacks it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The name (field 2) may contain spaces and ')': the fields we want follow its last ')'.
    after_name = stat[stat.rindex(b")") + 2 :].split()
    return after_name[0].decode(), f"{_boot_id()}:{after_name[19].decode()}"  # fields 3 and 22


def process_start(pid: int) -> str | None:
    """Which process ``pid`` is, beyond its number: boot id + start time in clock ticks.

    None where /proc is not available (macOS, Windows) or the process is gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def owner_alive(pid: int, start: str | None) -> bool:
    """Is the process that owns a run still running? Not if it exited (a zombie has), nor if
    the pid now belongs to another process (another start stamp)."""
    stat = _proc_stat(pid)
    if stat is None:
        return _pid_alive(pid)  # no /proc here (or it hides the pid): ask the kernel
    state, now = stat
    return state not in ("Z", "X") and start in (None, now)


def _redacted(name: str, value: Any) -> Any:
    return redact(value) if name in _REDACTED_FIELDS else value


def _like_literal(text: str) -> str:
    """``text`` for a LIKE pattern with ESCAPE '\\': its own %, _ and \\ match only themselves."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _run_from_row(row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
    values = dict(zip(_RUN_COLUMNS, row, strict=True))
    for name in _JSON_FIELDS:
        values[name] = json.loads(values[name]) if values[name] else {}
    values["pinned"] = bool(values["pinned"])
    return RunRecord(**values)


def _event_from_row(row: tuple[Any, ...]) -> Event:
    run_id, seq, ts, kind, node, parent, depth, data_json = row
    return {
        "v": EVENT_VERSION,
        "run_id": run_id,
        "seq": seq,
        "ts": ts,
        "kind": kind,
        "node": node,
        "parent": parent,
        "depth": depth,
        "data": json.loads(data_json),
    }


def _session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    sid, name, created_at, last_used_at, closed_at, meta_json = row
    return SessionRecord(sid, name, created_at, last_used_at, closed_at, json.loads(meta_json or "{}"))


class Store(OptimizeTables, AgentTables, RecordTables):
    """Runs, events and sessions in one SQLite file (datasets and program versions: ``OptimizeTables``;
    the workspace agent's conversations and approvals: ``AgentTables``; what runs' calls returned, for
    replay and fork: ``RecordTables``)."""

    def __init__(self, path: Path, *, alive: Callable[[int, str | None], bool] = owner_alive) -> None:
        """``alive(pid, start)`` says whether a run's owner still runs (tests pass their own)."""
        self.path = Path(path)
        self._conn = connect(self.path)  # reads only; writes go through self._writer
        self._lock = threading.Lock()  # one read at a time on the read connection
        self._writer = Writer(self.path)
        # Commits what is queued when the store is closed, collected, or the interpreter exits.
        self._finalizer = weakref.finalize(self, self._writer.close)
        self._host = socket.gethostname()
        self._alive = alive
        self._pid = os.getpid()
        self._start = process_start(self._pid)
        self._writing: set[str] = set()  # runs of this process created here and not finished yet

    def close(self) -> None:
        """Commit every queued write, stop the writer thread, close the file."""
        self._finalizer()
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)`` for the writer thread, typically one of this store's write
        methods (it then joins the writer's transaction); the future is done once it committed."""
        future = self._writer.submit(lambda _tx: fn(*args, **kwargs))
        assert future is not None
        return future

    async def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``submit`` for an event loop: wait for the commit without blocking the loop. The write
        is shielded: cancelling the caller does not cancel it (it commits all the same)."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(fn, *args, **kwargs)))

    def barrier(self) -> Future[None]:
        """A future done once every write queued before it is committed and delivered."""
        return self._writer.barrier()

    def flush(self) -> None:
        """Wait until every write queued so far (e.g. by ``queue_event``) is committed."""
        self.barrier().result()

    def add_listener(self, listener: Callable[[list[Event]], None]) -> None:
        """Call ``listener(events)`` with each commit's new events, in commit order, on the writer
        thread right after the commit: it must only hand them on (e.g. ``call_soon_threadsafe``)."""
        self._writer.listeners.append(listener)

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # -- runs ---------------------------------------------------------------

    def create_run(self, rec: RunRecord) -> None:
        """Insert a run. A run owned by this process gets this process's start stamp."""
        _check_status(rec.status)
        ours = rec.owner_pid in (None, self._pid) and rec.owner_host in (None, self._host)
        if rec.owner_start is None and rec.owner_pid == self._pid and rec.owner_host == self._host:
            rec.owner_start = self._start
        values = []
        for name in _RUN_COLUMNS:
            value = _redacted(name, getattr(rec, name))
            values.append(dumps(value) if name in _JSON_FIELDS else value)
        sql = f"INSERT INTO runs ({', '.join(_RUN_COLUMNS.values())}) VALUES ({', '.join('?' * len(values))})"

        def insert(tx: Tx) -> None:
            try:
                tx.conn.execute(sql, values)
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"run {rec.id!r} already exists") from exc
            if ours:
                self._writing.add(rec.id)

        self._writer.run(insert)

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set some columns of a run. Keys are ``RunRecord`` field names (not ``id``)."""
        if not fields:
            return
        bad = sorted(set(fields) - (set(_RUN_COLUMNS) - {"id"}))
        if bad:
            raise ValueError(f"cannot update run field(s): {', '.join(bad)}")
        if "status" in fields:
            _check_status(fields["status"])
        assignments = ", ".join(f"{_RUN_COLUMNS[name]} = ?" for name in fields)
        values = {name: _redacted(name, v) for name, v in fields.items()}
        params = [dumps(v) if name in _JSON_FIELDS else v for name, v in values.items()]

        def update(tx: Tx) -> None:
            cur = tx.conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", [*params, run_id])
            if cur.rowcount == 0:
                raise KeyError(f"no run {run_id!r}")

        self._writer.run(update)

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run, closed out as interrupted first if its owner process is gone."""
        rows = self._read(f"{_RUN_SELECT} WHERE id = ?", (run_id,))
        if not rows:
            return None
        rec = _run_from_row(rows[0])
        if rec.status in ACTIVE_STATUSES and self._owner_gone(rec.owner_host, rec.owner_pid, rec.owner_start):
            self._interrupt(rec.id, rec.owner_pid)  # type: ignore[arg-type]  # _owner_gone checked it
            rec = _run_from_row(self._read(f"{_RUN_SELECT} WHERE id = ?", (run_id,))[0])
        return rec

    def list_runs(
        self,
        limit: int = 50,
        offset: int = 0,
        session_id: str | None = None,
        status: str | None = None,
        q: str | None = None,
        kind: str | None = "run",
    ) -> list[RunRecord]:
        """Newest first; runs of dead processes show as interrupted (see ``mark_interrupted``).
        ``q``: only runs whose question contains it (case-insensitive for ASCII). ``kind``: people's
        runs by default, not optimizations and their replays (None: every kind)."""
        self.mark_interrupted()
        where, params = [], []
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if q:
            where.append("question LIKE ? ESCAPE '\\'")
            params.append(f"%{_like_literal(q)}%")
        if session_id is not None:
            where.append("session_id = ?")
            params.append(session_id)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        sql = _RUN_SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
        return [_run_from_row(r) for r in self._read(sql, (*params, limit, offset))]

    def run_exists(self, run_id: str) -> bool:
        return bool(self._read("SELECT 1 FROM runs WHERE id = ?", (run_id,)))

    def run_ids_matching(self, part: str, *, prefix: bool, limit: int = 2) -> list[str]:
        """Ids of runs (every kind) that end with ``part`` (or start with it, if ``prefix``), newest
        first; ``limit`` 2 is enough to tell one match from several."""
        patterns = [f"%{_like_literal(part)}"] + ([f"{_like_literal(part)}%"] if prefix else [])
        where = " OR ".join(["id LIKE ? ESCAPE '\\'"] * len(patterns))
        sql = f"SELECT id FROM runs WHERE {where} ORDER BY created_at DESC, id DESC LIMIT ?"
        return [r[0] for r in self._read(sql, (*patterns, limit))]

    def delete_run(self, run_id: str) -> None:
        def delete(tx: Tx) -> None:
            tx.conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            tx.conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            tx.cache.pop(("seq", run_id), None)
            self._writing.discard(run_id)

        self._writer.run(delete)

    def writes(self, run_id: str) -> bool:
        """True while this store writes the run's events: this process created and runs it, so
        they reach listeners here as they commit and nobody needs to tail the file for them."""
        return run_id in self._writing

    def mark_interrupted(self) -> list[str]:
        """Close out queued/running runs whose owning process (on this host) is gone.

        Runs on every ``list_runs`` and at engine start, so a killed process never leaves a run
        'running'. Cheap: one indexed query, and a /proc read per active run of another process
        (this process's own runs are never checked). Returns the ids marked now.
        """
        rows = self._read(
            "SELECT id, owner_pid, owner_start FROM runs WHERE status IN (?, ?) AND owner_host = ?"
            " AND owner_pid IS NOT NULL",
            (*ACTIVE_STATUSES, self._host),
        )
        return [
            run_id
            for run_id, pid, start in rows
            if self._owner_gone(self._host, pid, start) and self._interrupt(run_id, pid)
        ]

    def _owner_gone(self, host: str | None, pid: int | None, start: str | None) -> bool:
        """True if the run's owner is known to have stopped (only decidable on its own host)."""
        if host != self._host or pid is None:
            return False
        if pid == self._pid and start in (None, self._start):
            return False  # ours: this process is obviously alive
        return not self._alive(pid, start)

    def _interrupt(self, run_id: str, pid: int) -> bool:
        """Record the run as interrupted with its closing run.finished event; False if it already ended."""
        now = time.time()
        reason = f"the process running it stopped (pid {pid})"

        def interrupt(tx: Tx) -> bool:
            # Re-check status inside the transaction: another process may have finished or
            # interrupted the run since our SELECT.
            cur = tx.conn.execute(
                "UPDATE runs SET status = 'interrupted', finished_at = ?, stop_reason = ?"
                " WHERE id = ? AND status IN (?, ?)",
                (now, reason, run_id, *ACTIVE_STATUSES),
            )
            if cur.rowcount == 0:
                return False
            (usage_json,) = tx.conn.execute("SELECT usage_json FROM runs WHERE id = ?", (run_id,)).fetchone()
            data = {
                "status": "interrupted",
                "answer": None,
                "usage": json.loads(usage_json or "{}"),
                "stop_reason": reason,
            }
            self._append(tx, run_id, RUN_FINISHED, data, "root", None, 0, now)
            return True

        return self._writer.run(interrupt)

    # -- events -------------------------------------------------------------

    def _append(
        self,
        tx: Tx,
        run_id: str,
        kind: str,
        data: dict[str, Any],
        node: str,
        parent: str | None,
        depth: int,
        ts: float,
    ) -> Event:
        # On the writer thread, in its transaction: the write lock makes MAX(seq)+1 race-free,
        # and the next seq of a run stays valid in the cache until the transaction ends.
        seq = tx.cache.get(("seq", run_id))
        if seq is None:
            (seq,) = tx.conn.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?", (run_id,)
            ).fetchone()
        data_json = dumps(redact(data))  # every event, whoever writes it, is masked here
        row = (run_id, seq, ts, kind, node, parent, depth, data_json)
        try:
            tx.conn.execute(f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
        except sqlite3.IntegrityError as exc:  # the foreign key: no such run
            raise KeyError(f"no run {run_id!r}; create_run() before appending events") from exc
        tx.cache[("seq", run_id)] = seq + 1
        # Hand on what a reader would get back (JSON round trip), not the caller's object.
        event = _event_from_row(row)
        tx.published.append(event)
        if kind == RUN_FINISHED:
            self._writing.discard(run_id)
        return event

    def queue_event(
        self,
        run_id: str,
        kind: str,
        data: dict[str, Any],
        *,
        node: str = "root",
        parent: str | None = None,
        depth: int = 0,
    ) -> None:
        """Queue an event for the writer and return at once. It gets the run's next seq when it
        commits, then goes to the listeners; ``flush``/``barrier`` wait for it. ``data`` is
        serialized on the writer thread: do not change it after queueing. A failure (an unknown
        run) is logged."""
        ts = time.time()
        self._writer.submit(lambda tx: self._append(tx, run_id, kind, data, node, parent, depth, ts), wait=False)

    def append_event(
        self,
        run_id: str,
        kind: str,
        data: dict[str, Any],
        *,
        node: str = "root",
        parent: str | None = None,
        depth: int = 0,
        ts: float | None = None,
    ) -> Event:
        """Durably append an event with the run's next seq (1, 2, ...); return its envelope."""
        when = time.time() if ts is None else ts
        return self._writer.run(lambda tx: self._append(tx, run_id, kind, data, node, parent, depth, when))

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        sql = f"{_EVENT_SELECT} WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        rows = self._read(sql, (run_id, after_seq, -1 if limit is None else limit))
        return [_event_from_row(r) for r in rows]

    def last_seq(self, run_id: str) -> int:
        return self._read("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?", (run_id,))[0][0]

    def event_cursor(self) -> int:
        """Where ``events_since`` starts to see only events committed from now on."""
        return self._read("SELECT COALESCE(MAX(gid), 0) FROM events")[0][0]

    def events_since(self, cursor: int, limit: int, *, others_only: bool = False) -> tuple[list[Event], int]:
        """Events committed after ``cursor`` (any run, any process) in commit order, and the next
        cursor. ``others_only`` leaves out runs this store ``writes`` (their events come live)."""
        rows = self._read(
            f"SELECT gid, {_EVENT_COLUMNS} FROM events WHERE gid > ? ORDER BY gid LIMIT ?", (cursor, limit)
        )
        if not rows:
            return [], cursor
        # A writer holds the write lock from its first gid to its commit: a reader never sees a
        # gid while a smaller one is still uncommitted, so the cursor skips nothing.
        events = [_event_from_row(r[1:]) for r in rows if not (others_only and r[1] in self._writing)]
        return events, rows[-1][0]

    # -- sessions -----------------------------------------------------------

    def create_session(self, id: str, name: str | None = None, meta: dict[str, Any] | None = None) -> SessionRecord:
        rec = SessionRecord(id=id, name=name, meta=dict(meta or {}))
        rec.last_used_at = rec.created_at

        def insert(tx: Tx) -> None:
            try:
                tx.conn.execute(
                    "INSERT INTO sessions (id, name, created_at, last_used_at, closed_at, meta_json)"
                    " VALUES (?, ?, ?, ?, NULL, ?)",
                    (rec.id, rec.name, rec.created_at, rec.last_used_at, dumps(rec.meta)),
                )
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"session {id!r} already exists") from exc

        self._writer.run(insert)
        return rec

    def get_session(self, id: str) -> SessionRecord | None:
        rows = self._read(f"{_SESSION_SELECT} WHERE id = ?", (id,))
        return _session_from_row(rows[0]) if rows else None

    def list_sessions(self, include_closed: bool = False) -> list[SessionRecord]:
        """Most recently used first."""
        where = "" if include_closed else " WHERE closed_at IS NULL"
        rows = self._read(f"{_SESSION_SELECT}{where} ORDER BY last_used_at DESC, id")
        return [_session_from_row(r) for r in rows]

    def touch_session(self, id: str) -> None:
        self._update_session(id, "last_used_at")

    def close_session(self, id: str) -> None:
        self._update_session(id, "closed_at")

    def _update_session(self, id: str, column: str) -> None:
        now = time.time()

        def update(tx: Tx) -> None:
            cur = tx.conn.execute(f"UPDATE sessions SET {column} = ? WHERE id = ?", (now, id))
            if cur.rowcount == 0:
                raise KeyError(f"no session {id!r}")

        self._writer.run(update)

    # -- uploads and feedback (the web app's files, and answers judged for optimization) ----

    def add_upload(self, upload_id: str, name: str, size: int) -> None:
        def insert(tx: Tx) -> None:
            tx.conn.execute(
                "INSERT INTO uploads (id, name, size, created_at) VALUES (?, ?, ?, ?)",
                (upload_id, name, size, time.time()),
            )

        self._writer.run(insert)

    def get_upload(self, upload_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT id, name, size, created_at FROM uploads WHERE id = ?", (upload_id,))
        return dict(zip(("upload_id", "name", "size", "created_at"), rows[0], strict=True)) if rows else None

    def attach_uploads(self, run_id: str, upload_ids: list[str]) -> None:
        """Record that the run reads these uploads: they now live as long as some run uses them."""

        def insert(tx: Tx) -> None:
            tx.conn.executemany(
                "INSERT OR IGNORE INTO run_uploads (run_id, upload_id) VALUES (?, ?)",
                [(run_id, u) for u in upload_ids],
            )

        self._writer.run(insert)

    def run_uploads(self, run_id: str) -> list[str]:
        return [r[0] for r in self._read("SELECT upload_id FROM run_uploads WHERE run_id = ?", (run_id,))]

    def purge_runs(self, run_ids: list[str]) -> list[str]:
        """Delete runs with their events, feedback and upload links; also delete (and return the
        ids of) the uploads that no remaining run uses, so the caller can remove their files."""

        def purge(tx: Tx) -> list[str]:
            orphans: list[str] = []
            for run_id in run_ids:
                used = [r[0] for r in tx.conn.execute("SELECT upload_id FROM run_uploads WHERE run_id = ?", (run_id,))]
                tx.conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
                tx.conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))  # cascades: links, feedback
                tx.cache.pop(("seq", run_id), None)
                self._writing.discard(run_id)
                for upload_id in used:
                    still = tx.conn.execute("SELECT 1 FROM run_uploads WHERE upload_id = ?", (upload_id,)).fetchone()
                    if still is None:
                        tx.conn.execute("DELETE FROM uploads WHERE id = ?", (upload_id,))
                        orphans.append(upload_id)
            self._drop_unused_bodies(tx)
            return orphans

        return self._writer.run(purge)

    def finished_runs_before(self, created_before: float) -> list[str]:
        """Ids of runs created before the time that have ended and are not pinned (active runs are never listed)."""
        marks = ", ".join("?" * len(ACTIVE_STATUSES))
        sql = f"SELECT id FROM runs WHERE created_at < ? AND NOT pinned AND status NOT IN ({marks})"
        return [r[0] for r in self._read(sql, (created_before, *ACTIVE_STATUSES))]

    def unused_uploads_before(self, created_before: float) -> list[str]:
        """Uploads no run ever took, older than the time (a page uploaded files, then left)."""
        sql = (
            "SELECT id FROM uploads WHERE created_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM run_uploads WHERE upload_id = uploads.id)"
        )
        return [r[0] for r in self._read(sql, (created_before,))]

    def delete_uploads(self, upload_ids: list[str]) -> None:
        def delete(tx: Tx) -> None:
            tx.conn.executemany("DELETE FROM uploads WHERE id = ?", [(u,) for u in upload_ids])

        self._writer.run(delete)

    def add_feedback(self, run_id: str, correct: bool, expected: str | None, comment: str | None) -> dict[str, Any]:
        """Store a judgement of the run's answer (free text redacted); return the stored row."""
        row = (run_id, int(bool(correct)), redact(expected), redact(comment), time.time())

        def insert(tx: Tx) -> int:
            try:
                cur = tx.conn.execute(
                    "INSERT INTO feedback (run_id, correct, expected, comment, created_at) VALUES (?, ?, ?, ?, ?)", row
                )
            except sqlite3.IntegrityError as exc:
                raise KeyError(f"no run {run_id!r}") from exc
            return int(cur.lastrowid or 0)

        feedback_id = self._writer.run(insert)
        return _feedback(feedback_id, *row)

    def feedback(self, run_id: str) -> list[dict[str, Any]]:
        """The run's feedback, oldest first."""
        sql = "SELECT id, run_id, correct, expected, comment, created_at FROM feedback WHERE run_id = ? ORDER BY id"
        return [_feedback(*r) for r in self._read(sql, (run_id,))]


def _feedback(
    id: int, run_id: str, correct: int, expected: str | None, comment: str | None, created_at: float
) -> dict[str, Any]:
    return {"id": id, "run_id": run_id, "correct": bool(correct), "expected": expected, "comment": comment,
            "created_at": created_at}  # fmt: skip
