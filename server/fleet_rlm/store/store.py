"""Durable store for runs, their event logs and sessions (SQLite, WAL).

One ``Store`` is shared by the asyncio loop thread and worker threads, so every
statement runs under a ``threading.Lock``. Several processes (CLI and web
server) may open the same file; writes use ``BEGIN IMMEDIATE`` so that, e.g.,
event sequence numbers stay gap-free and unique across processes too.

Nothing reaches the file unredacted: event data and the runs' free-text fields go through
``fleet_rlm.redaction.redact`` on the way in.

A run whose owning process died (killed, crashed, machine off) is closed out as
``interrupted`` the moment anyone reads it (``get_run``, ``list_runs``), not only when the
next engine starts. The owner is recognised by host, pid and process start stamp, so a pid
the OS recycled for another process does not keep a dead run "running".
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from fleet_rlm.redaction import redact
from fleet_rlm.store.db import connect

EVENT_VERSION = 1
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "interrupted")
ACTIVE_STATUSES = ("queued", "running")


@dataclass
class RunRecord:
    """One run (a question answered by a tree of RLM nodes)."""

    id: str
    question: str = ""
    session_id: str | None = None
    parent_run_id: str | None = None
    status: str = "queued"
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
_EVENT_SELECT = "SELECT run_id, seq, ts, kind, node, parent, depth, data_json FROM events"


def _dumps(value: Any) -> str:
    # default=str: an odd object in event data should degrade, not crash a run.
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


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


def _run_from_row(row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
    values = dict(zip(_RUN_COLUMNS, row, strict=True))
    for name in _JSON_FIELDS:
        values[name] = json.loads(values[name]) if values[name] else {}
    return RunRecord(**values)


def _event_from_row(row: tuple[Any, ...]) -> dict[str, Any]:
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


class Store:
    """Runs, events and sessions in one SQLite file."""

    def __init__(self, path: Path, *, alive: Callable[[int, str | None], bool] = owner_alive) -> None:
        """``alive(pid, start)`` says whether a run's owner still runs (tests pass their own)."""
        self.path = Path(path)
        self._conn = connect(self.path)
        self._lock = threading.Lock()
        self._host = socket.gethostname()
        self._alive = alive
        self._pid = os.getpid()
        self._start = process_start(self._pid)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """Lock + write transaction. IMMEDIATE takes SQLite's write lock up front,
        which is what makes read-then-insert (seq assignment) safe across processes."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # -- runs ---------------------------------------------------------------

    def create_run(self, rec: RunRecord) -> None:
        """Insert a run. A run owned by this process gets this process's start stamp."""
        _check_status(rec.status)
        if rec.owner_start is None and rec.owner_pid == self._pid and rec.owner_host == self._host:
            rec.owner_start = self._start
        values = []
        for name in _RUN_COLUMNS:
            value = _redacted(name, getattr(rec, name))
            values.append(_dumps(value) if name in _JSON_FIELDS else value)
        sql = f"INSERT INTO runs ({', '.join(_RUN_COLUMNS.values())}) VALUES ({', '.join('?' * len(values))})"
        try:
            with self._write() as conn:
                conn.execute(sql, values)
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"run {rec.id!r} already exists") from exc

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
        params = [_dumps(v) if name in _JSON_FIELDS else v for name, v in values.items()]
        with self._write() as conn:
            cur = conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", [*params, run_id])
            if cur.rowcount == 0:
                raise KeyError(f"no run {run_id!r}")

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
    ) -> list[RunRecord]:
        """Newest first; runs of dead processes show as interrupted (see ``mark_interrupted``)."""
        self.mark_interrupted()
        where, params = [], []
        if session_id is not None:
            where.append("session_id = ?")
            params.append(session_id)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        sql = _RUN_SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
        return [_run_from_row(r) for r in self._read(sql, (*params, limit, offset))]

    def delete_run(self, run_id: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

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
        with self._write() as conn:
            # Re-check status inside the transaction: another process may have finished or
            # interrupted the run since our SELECT.
            cur = conn.execute(
                "UPDATE runs SET status = 'interrupted', finished_at = ?, stop_reason = ?"
                " WHERE id = ? AND status IN (?, ?)",
                (now, reason, run_id, *ACTIVE_STATUSES),
            )
            if cur.rowcount == 0:
                return False
            (usage_json,) = conn.execute("SELECT usage_json FROM runs WHERE id = ?", (run_id,)).fetchone()
            data = {
                "status": "interrupted",
                "answer": None,
                "usage": json.loads(usage_json or "{}"),
                "stop_reason": reason,
            }
            self._append(conn, run_id, "run.finished", data, "root", None, 0, now)
        return True

    # -- events -------------------------------------------------------------

    def _append(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        kind: str,
        data: dict[str, Any],
        node: str,
        parent: str | None,
        depth: int,
        ts: float,
    ) -> dict[str, Any]:
        # Must run inside _write(): the write lock makes MAX(seq)+1 race-free.
        (seq,) = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?", (run_id,)).fetchone()
        data_json = _dumps(redact(data))  # every event, whoever writes it, is masked here
        conn.execute(
            "INSERT INTO events (run_id, seq, ts, kind, node, parent, depth, data_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, seq, ts, kind, node, parent, depth, data_json),
        )
        # Return what a reader would get back (JSON round trip), not the caller's object.
        return _event_from_row((run_id, seq, ts, kind, node, parent, depth, data_json))

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
    ) -> dict[str, Any]:
        """Durably append an event with the run's next seq (1, 2, ...); return its envelope."""
        try:
            with self._write() as conn:
                return self._append(conn, run_id, kind, data, node, parent, depth, time.time() if ts is None else ts)
        except sqlite3.IntegrityError as exc:
            if self.get_run(run_id) is None:
                raise KeyError(f"no run {run_id!r}; create_run() before appending events") from exc
            raise

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        sql = f"{_EVENT_SELECT} WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        rows = self._read(sql, (run_id, after_seq, -1 if limit is None else limit))
        return [_event_from_row(r) for r in rows]

    def last_seq(self, run_id: str) -> int:
        return self._read("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?", (run_id,))[0][0]

    # -- sessions -----------------------------------------------------------

    def create_session(self, id: str, name: str | None = None, meta: dict[str, Any] | None = None) -> SessionRecord:
        rec = SessionRecord(id=id, name=name, meta=dict(meta or {}))
        rec.last_used_at = rec.created_at
        try:
            with self._write() as conn:
                conn.execute(
                    "INSERT INTO sessions (id, name, created_at, last_used_at, closed_at, meta_json)"
                    " VALUES (?, ?, ?, ?, NULL, ?)",
                    (rec.id, rec.name, rec.created_at, rec.last_used_at, _dumps(rec.meta)),
                )
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"session {id!r} already exists") from exc
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
        with self._write() as conn:
            cur = conn.execute(f"UPDATE sessions SET {column} = ? WHERE id = ?", (time.time(), id))
            if cur.rowcount == 0:
                raise KeyError(f"no session {id!r}")
