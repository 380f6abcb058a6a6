"""Uploads, the runs that read them, and feedback on runs' answers (``store.uploads``): the web app's
files (kept under FLEET_HOME/uploads/<id>/), and answers judged for optimization.

An upload lives as long as some run uses it (``attach``); ``runs.purge`` drops the ones its runs left
unused. Feedback goes with its run (ON DELETE CASCADE); its free text is masked on the way in.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet_rlm.redaction import redact
from fleet_rlm.store.rows import Database

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Tx


@dataclass(frozen=True)
class Upload:
    """A file uploaded through the web app."""

    id: str
    name: str
    size: int
    created_at: float


@dataclass(frozen=True)
class Feedback:
    """A person's judgement of a run's answer."""

    id: int
    run_id: str
    correct: bool
    expected: str | None
    comment: str | None
    created_at: float


_FEEDBACK_SELECT = "SELECT id, run_id, correct, expected, comment, created_at FROM feedback"


class UploadTables:
    """Uploads, run attachments and feedback (``store.uploads``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add(self, upload_id: str, name: str, size: int) -> None:
        def insert(tx: Tx) -> None:
            tx.conn.execute(
                "INSERT INTO uploads (id, name, size, created_at) VALUES (?, ?, ?, ?)",
                (upload_id, name, size, time.time()),
            )

        self._db.writer.run(insert)

    def get(self, upload_id: str) -> Upload | None:
        rows = self._db.read("SELECT id, name, size, created_at FROM uploads WHERE id = ?", (upload_id,))
        return Upload(*rows[0]) if rows else None

    def attach(self, run_id: str, upload_ids: list[str]) -> None:
        """Record that the run reads these uploads: they now live as long as some run uses them."""

        def insert(tx: Tx) -> None:
            tx.conn.executemany(
                "INSERT OR IGNORE INTO run_uploads (run_id, upload_id) VALUES (?, ?)",
                [(run_id, u) for u in upload_ids],
            )

        self._db.writer.run(insert)

    def of_run(self, run_id: str) -> list[str]:
        """Ids of the uploads the run reads."""
        return [r[0] for r in self._db.read("SELECT upload_id FROM run_uploads WHERE run_id = ?", (run_id,))]

    def unused_before(self, created_before: float) -> list[str]:
        """Uploads no run ever took, older than the time (a page uploaded files, then left)."""
        sql = (
            "SELECT id FROM uploads WHERE created_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM run_uploads WHERE upload_id = uploads.id)"
        )
        return [r[0] for r in self._db.read(sql, (created_before,))]

    def delete(self, upload_ids: list[str]) -> None:
        def delete(tx: Tx) -> None:
            tx.conn.executemany("DELETE FROM uploads WHERE id = ?", [(u,) for u in upload_ids])

        self._db.writer.run(delete)

    def add_feedback(self, run_id: str, correct: bool, expected: str | None, comment: str | None) -> Feedback:
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

        feedback_id = self._db.writer.run(insert)
        return _feedback((feedback_id, *row))

    def feedback(self, run_id: str) -> list[Feedback]:
        """The run's feedback, oldest first."""
        return [_feedback(r) for r in self._db.read(f"{_FEEDBACK_SELECT} WHERE run_id = ? ORDER BY id", (run_id,))]


def _feedback(row: tuple[Any, ...]) -> Feedback:
    id, run_id, correct, expected, comment, created_at = row
    return Feedback(id, run_id, bool(correct), expected, comment, created_at)
