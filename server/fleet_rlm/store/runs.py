"""Runs and their event logs (``store.runs``).

Every event gets ``seq``, gap-free per run (the writer's ``BEGIN IMMEDIATE`` takes SQLite's write lock
across processes, so it stays unique there too), and ``gid``, one order over all runs and processes,
never reused: ``events_since`` follows every run's new events with one cursor, which is how one
process shows runs that another process is running.

Nothing reaches the file unredacted: event data and the runs' free-text fields go through
``fleet_rlm.redaction.redact`` on the way in (on the writer thread, for events).

A run whose owning process died (killed, crashed, machine off) is closed out as
``interrupted`` the moment anyone reads it (``get``, ``list``), not only when the
next engine starts. The owner is recognised by host, pid and process start stamp
(``store/owners.py``), so a pid the OS recycled for another process does not keep a dead run "running".
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from fleet_rlm.redaction import redact
from fleet_rlm.store.owners import owner_alive, process_start
from fleet_rlm.store.records import drop_unused_bodies
from fleet_rlm.store.rows import Database, dumps, record, row_values, table_columns
from fleet_rlm.types import ACTIVE_STATUSES, EVENT_VERSION, RUN_FINISHED, STATUSES, Event, RunStatus

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Tx


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
    owner_start: str | None = None  # see owners.process_start(); set by create() for this process's runs
    kind: str = "run"  # run | eval (an optimization's replay of a dataset row) | optimize (see store/db.py _V5)
    # | replay (a rerun answered from its parent run's record: core/tape.py)
    program_version: str | None = None  # the program version that answered (None: the built-in program)
    fork_at: str | None = None  # a fork: the step ("root:3") it branched from its parent run at
    pinned: bool = False  # kept by retention (operations.pin_run)


_JSON_FIELDS = ("request", "usage")  # stored as JSON text, in request_json and usage_json
_RUN_COLUMNS = table_columns(RunRecord, json=_JSON_FIELDS)
_COLUMN_OF = dict(zip((f.name for f in fields(RunRecord)), _RUN_COLUMNS, strict=True))  # field -> column
# Free text that may quote a provider's error (or a user's paste): masked before it is stored.
_REDACTED_FIELDS = frozenset({"question", "answer", "stop_reason", "error", "request"})
_RUN_SELECT = "SELECT " + ", ".join(_RUN_COLUMNS) + " FROM runs"
_EVENT_COLUMNS = "run_id, seq, ts, kind, node, parent, depth, data_json"
_EVENT_SELECT = f"SELECT {_EVENT_COLUMNS} FROM events"


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(STATUSES)}")


def _redacted(name: str, value: Any) -> Any:
    return redact(value) if name in _REDACTED_FIELDS else value


def _like_literal(text: str) -> str:
    """``text`` for a LIKE pattern with ESCAPE '\\': its own %, _ and \\ match only themselves."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _run_from_row(row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
    values = record(_RUN_COLUMNS, tuple(row))
    for name in _JSON_FIELDS:
        values[name] = values[name] or {}
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


class RunTables:
    """Runs and their events (``store.runs``)."""

    def __init__(self, db: Database, *, alive: Callable[[int, str | None], bool] = owner_alive) -> None:
        """``alive(pid, start)`` says whether a run's owner still runs (tests pass their own)."""
        self._db = db
        self._host = socket.gethostname()
        self._alive = alive
        self._pid = os.getpid()
        self._start = process_start(self._pid)
        self._writing: set[str] = set()  # runs of this process created here and not finished yet

    # -- runs ---------------------------------------------------------------

    def create(self, rec: RunRecord) -> None:
        """Insert a run. A run owned by this process gets this process's start stamp."""
        _check_status(rec.status)
        ours = rec.owner_pid in (None, self._pid) and rec.owner_host in (None, self._host)
        if rec.owner_start is None and rec.owner_pid == self._pid and rec.owner_host == self._host:
            rec.owner_start = self._start
        masked = replace(rec, **{name: redact(getattr(rec, name)) for name in _REDACTED_FIELDS})
        values = row_values(masked, _RUN_COLUMNS)
        sql = f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(values))})"

        def insert(tx: Tx) -> None:
            try:
                tx.conn.execute(sql, values)
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"run {rec.id!r} already exists") from exc
            if ours:
                self._writing.add(rec.id)

        self._db.writer.run(insert)

    def update(self, run_id: str, **fields: Any) -> None:
        """Set some columns of a run. Keys are ``RunRecord`` field names (not ``id``)."""
        if not fields:
            return
        bad = sorted(set(fields) - (set(_COLUMN_OF) - {"id"}))
        if bad:
            raise ValueError(f"cannot update run field(s): {', '.join(bad)}")
        if "status" in fields:
            _check_status(fields["status"])
        assignments = ", ".join(f"{_COLUMN_OF[name]} = ?" for name in fields)
        values = {name: _redacted(name, v) for name, v in fields.items()}
        params = [dumps(v) if name in _JSON_FIELDS else v for name, v in values.items()]

        def update(tx: Tx) -> None:
            cur = tx.conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", [*params, run_id])
            if cur.rowcount == 0:
                raise KeyError(f"no run {run_id!r}")

        self._db.writer.run(update)

    def get(self, run_id: str) -> RunRecord | None:
        """The run, closed out as interrupted first if its owner process is gone."""
        rows = self._db.read(f"{_RUN_SELECT} WHERE id = ?", (run_id,))
        if not rows:
            return None
        rec = _run_from_row(rows[0])
        if rec.status in ACTIVE_STATUSES and self._owner_gone(rec.owner_host, rec.owner_pid, rec.owner_start):
            self._interrupt(rec.id, rec.owner_pid)  # type: ignore[arg-type]  # _owner_gone checked it
            rec = _run_from_row(self._db.read(f"{_RUN_SELECT} WHERE id = ?", (run_id,))[0])
        return rec

    def exists(self, run_id: str) -> bool:
        return bool(self._db.read("SELECT 1 FROM runs WHERE id = ?", (run_id,)))

    def ids_matching(self, part: str, *, prefix: bool, limit: int = 2) -> list[str]:
        """Ids of runs (every kind) that end with ``part`` (or start with it, if ``prefix``), newest
        first; ``limit`` 2 is enough to tell one match from several."""
        patterns = [f"%{_like_literal(part)}"] + ([f"{_like_literal(part)}%"] if prefix else [])
        where = " OR ".join(["id LIKE ? ESCAPE '\\'"] * len(patterns))
        sql = f"SELECT id FROM runs WHERE {where} ORDER BY created_at DESC, id DESC LIMIT ?"
        return [r[0] for r in self._db.read(sql, (*patterns, limit))]

    def delete(self, run_id: str) -> None:
        def delete(tx: Tx) -> None:
            tx.conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            tx.conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            tx.cache.pop(("seq", run_id), None)
            self._writing.discard(run_id)

        self._db.writer.run(delete)

    def purge(self, run_ids: list[str]) -> list[str]:
        """Delete runs with their events, feedback, records and upload links; also delete (and return
        the ids of) the uploads that no remaining run uses, so the caller can remove their files."""

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
            drop_unused_bodies(tx)
            return orphans

        return self._db.writer.run(purge)

    def finished_before(self, created_before: float) -> list[str]:
        """Ids of runs created before the time that have ended and are not pinned (active runs are never listed)."""
        marks = ", ".join("?" * len(ACTIVE_STATUSES))
        sql = f"SELECT id FROM runs WHERE created_at < ? AND NOT pinned AND status NOT IN ({marks})"
        return [r[0] for r in self._db.read(sql, (created_before, *ACTIVE_STATUSES))]

    def writes(self, run_id: str) -> bool:
        """True while this store writes the run's events: this process created and runs it, so
        they reach listeners here as they commit and nobody needs to tail the file for them."""
        return run_id in self._writing

    def mark_interrupted(self) -> list[str]:
        """Close out queued/running runs whose owning process (on this host) is gone.

        Runs on every ``list`` and at engine start, so a killed process never leaves a run
        'running'. Cheap: one indexed query, and a /proc read per active run of another process
        (this process's own runs are never checked). Returns the ids marked now.
        """
        rows = self._db.read(
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

        return self._db.writer.run(interrupt)

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
            raise KeyError(f"no run {run_id!r}; runs.create() before appending events") from exc
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
        self._db.writer.submit(lambda tx: self._append(tx, run_id, kind, data, node, parent, depth, ts), wait=False)

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
        return self._db.writer.run(lambda tx: self._append(tx, run_id, kind, data, node, parent, depth, when))

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        sql = f"{_EVENT_SELECT} WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        rows = self._db.read(sql, (run_id, after_seq, -1 if limit is None else limit))
        return [_event_from_row(r) for r in rows]

    def last_seq(self, run_id: str) -> int:
        return self._db.read("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?", (run_id,))[0][0]

    def event_cursor(self) -> int:
        """Where ``events_since`` starts to see only events committed from now on."""
        return self._db.read("SELECT COALESCE(MAX(gid), 0) FROM events")[0][0]

    def events_since(self, cursor: int, limit: int, *, others_only: bool = False) -> tuple[list[Event], int]:
        """Events committed after ``cursor`` (any run, any process) in commit order, and the next
        cursor. ``others_only`` leaves out runs this store ``writes`` (their events come live)."""
        rows = self._db.read(
            f"SELECT gid, {_EVENT_COLUMNS} FROM events WHERE gid > ? ORDER BY gid LIMIT ?", (cursor, limit)
        )
        if not rows:
            return [], cursor
        # A writer holds the write lock from its first gid to its commit: a reader never sees a
        # gid while a smaller one is still uncommitted, so the cursor skips nothing.
        events = [_event_from_row(r[1:]) for r in rows if not (others_only and r[1] in self._writing)]
        return events, rows[-1][0]

    # Last: below this method, ``list`` in an annotation would name it, not the builtin (mypy).
    def list(
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
        return [_run_from_row(r) for r in self._db.read(sql, (*params, limit, offset))]
