"""Sessions (``store.sessions``): a sandbox kept across runs in the same process; the row says it exists,
when it was last used and whether it is closed."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet_rlm.store.rows import Database, dumps

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Tx

_SESSION_SELECT = "SELECT id, name, created_at, last_used_at, closed_at, meta_json FROM sessions"


@dataclass
class SessionRecord:
    id: str
    name: str | None = None
    created_at: float = field(default_factory=time.time)
    last_used_at: float = field(default_factory=time.time)
    closed_at: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    sid, name, created_at, last_used_at, closed_at, meta_json = row
    return SessionRecord(sid, name, created_at, last_used_at, closed_at, json.loads(meta_json or "{}"))


class SessionTables:
    """Sessions (``store.sessions``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def create(self, id: str, name: str | None = None, meta: dict[str, Any] | None = None) -> SessionRecord:
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

        self._db.writer.run(insert)
        return rec

    def get(self, id: str) -> SessionRecord | None:
        rows = self._db.read(f"{_SESSION_SELECT} WHERE id = ?", (id,))
        return _session_from_row(rows[0]) if rows else None

    def touch(self, id: str) -> None:
        self._update(id, "last_used_at")

    def close(self, id: str) -> None:
        self._update(id, "closed_at")

    def _update(self, id: str, column: str) -> None:
        now = time.time()

        def update(tx: Tx) -> None:
            cur = tx.conn.execute(f"UPDATE sessions SET {column} = ? WHERE id = ?", (now, id))
            if cur.rowcount == 0:
                raise KeyError(f"no session {id!r}")

        self._db.writer.run(update)

    # Last: below this method, ``list`` in an annotation would name it, not the builtin (mypy).
    def list(self, include_closed: bool = False) -> list[SessionRecord]:
        """Most recently used first."""
        where = "" if include_closed else " WHERE closed_at IS NULL"
        rows = self._db.read(f"{_SESSION_SELECT}{where} ORDER BY last_used_at DESC, id")
        return [_session_from_row(r) for r in rows]
