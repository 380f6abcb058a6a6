"""The store's run records (``store.records``): what a run's model calls and host calls returned, for
replay and fork (schema: ``store/db.py``, migration 8; the runtime side is ``core/tape.py``, docs/replay.md).

A record row names its position in the run (``slot``), the hash and size of the request it answered,
and its body by content hash: a body is stored once however many runs (a replay, a fork) or calls
repeat it. Rows are queued like events (``keep`` never waits), so recording stays off a step's path;
bodies are masked by ``redact`` on the writer thread, as events are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet_rlm.redaction import redact
from fleet_rlm.store.rows import Database, dumps

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Tx


@dataclass(frozen=True)
class Record:
    """One recorded call: where in the run it was made, what it was asked, what it returned."""

    n: int  # order of recording within the run
    slot: str  # position: "root#3/act", "root#2/sub0", "root#2>root.1#1/act", "root#0/inputs" (core.tape)
    request_hash: str
    request_chars: int
    body: dict[str, Any]  # {"outputs": [...]} | {"error": "..."} | {"value": ...} | the run's inputs
    usage: dict[str, Any]


@dataclass(frozen=True)
class RecordSize:
    """What a run's record takes (``RecordTables.size``)."""

    records: int
    row_bytes: int
    body_bytes: int


def body_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def drop_unused_bodies(tx: Tx) -> None:
    """After runs were deleted: bodies no remaining record points at."""
    tx.conn.execute(
        "DELETE FROM record_bodies WHERE NOT EXISTS (SELECT 1 FROM run_records WHERE body_hash = record_bodies.hash)"
    )


class RecordTables:
    """Run records and their deduplicated bodies (``store.records``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def keep(
        self,
        run_id: str,
        n: int,
        slot: str,
        request_hash: str,
        request_chars: int,
        body: dict[str, Any],
        usage: dict[str, Any],
    ) -> None:
        """Queue one record and return at once (``flush`` waits for it). ``body`` belongs to the store
        from here on: it is masked and serialized on the writer thread."""

        def insert(tx: Tx) -> None:
            text = dumps(redact(body))
            digest = body_hash(text)
            tx.conn.execute("INSERT OR IGNORE INTO record_bodies (hash, body) VALUES (?, ?)", (digest, text))
            tx.conn.execute(
                "INSERT INTO run_records (run_id, n, slot, request_hash, request_chars, body_hash, usage_json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, n, slot, request_hash, request_chars, digest, dumps(usage)),
            )

        self._db.writer.submit(insert, wait=False)

    def size(self, run_id: str) -> RecordSize:
        """What the run's record takes: its rows, and the distinct bodies they point at (some of which
        other runs may share)."""
        count, row_bytes = self._db.read(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(slot) + LENGTH(request_hash) + LENGTH(body_hash)"
            " + LENGTH(usage_json) + 16), 0) FROM run_records WHERE run_id = ?",
            (run_id,),
        )[0]
        (body_bytes,) = self._db.read(
            "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM record_bodies WHERE hash IN"
            " (SELECT body_hash FROM run_records WHERE run_id = ?)",
            (run_id,),
        )[0]
        return RecordSize(int(count), int(row_bytes), int(body_bytes))

    # Last: below this method, ``list`` in an annotation would name it, not the builtin (mypy).
    def list(self, run_id: str) -> list[Record]:
        """The run's records in the order they were kept."""
        rows = self._db.read(
            "SELECT r.n, r.slot, r.request_hash, r.request_chars, b.body, r.usage_json FROM run_records r"
            " JOIN record_bodies b ON b.hash = r.body_hash WHERE r.run_id = ? ORDER BY r.n",
            (run_id,),
        )
        return [
            Record(n, slot, rh, chars, json.loads(body), json.loads(usage)) for n, slot, rh, chars, body, usage in rows
        ]
