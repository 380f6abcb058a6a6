"""The store's optimization tables: datasets, program versions and their activations, optimizations,
and the evaluation cache (schema: ``store/db.py``, migration 5).

``store.optimize``: writes go through the store's one writer thread (``writer.run``), reads through
its read connection (``read``), like every other repository; rows come back as frozen dataclasses. Free text a person
or a model wrote (questions, answers, comments, contexts) is masked by ``redact`` on the way in.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fleet_rlm.redaction import redact
from fleet_rlm.store.rows import Database, dumps, record, row_values, table_columns

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Tx

_OPT_UPDATABLE = frozenset({"version_id", "scores_json"})


@dataclass(frozen=True)
class Dataset:
    """A dataset, with its row counts per split."""

    id: str
    name: str
    source: str  # jsonl (imported) | feedback (judged runs)
    holdout_fraction: float
    seed: int
    created_at: float
    train: int
    holdout: int


@dataclass(frozen=True)
class DatasetRow:
    """One row of a dataset: a question, its context and the expected answer."""

    idx: int
    split: str  # train | holdout
    question: str
    context_text: str | None
    context_paths: list[str] | None
    answer: str
    verdict: bool | None  # the person's judgement of the run the row came from, if any
    comment: str | None
    run_id: str | None


@dataclass(frozen=True)
class JudgedRun:
    """A run's newest feedback with what a dataset needs of the run (``judged_runs``)."""

    run_id: str
    question: str
    answer: str | None
    status: str
    request: dict[str, Any]
    session_id: str | None
    earlier: int  # runs its session had before it (0 for a session's first run)
    correct: bool
    expected: str | None
    comment: str | None


@dataclass(frozen=True)
class ProgramVersion:
    """A saved program: where it came from, how it scored, what changed from its base."""

    id: str
    base_id: str | None
    optimization_id: str | None
    dataset_id: str | None
    optimizer: str
    metric: str
    scores: dict[str, Any] | None
    changes: dict[str, Any] | None
    created_at: float
    state: dict[str, Any] | None = None  # None in listings (``list_program_versions``: it can be large)


@dataclass(frozen=True)
class Activation:
    """A promotion or rollback: the version new runs use from then on (None: the built-in program)."""

    id: int
    version_id: str | None
    action: str  # promote | rollback
    reason: str | None
    created_at: float


@dataclass(frozen=True)
class Optimization:
    """An optimization's settings and, once it finished, the version it produced and its scores."""

    id: str
    lineage: str
    dataset_id: str
    optimizer: str
    metric: str
    base_version: str | None
    params: dict[str, Any] | None
    version_id: str | None
    scores: dict[str, Any] | None
    created_at: float


_DATASET_COLUMNS = table_columns(Dataset, computed=("train", "holdout"))
_ROW_COLUMNS = table_columns(DatasetRow, json=("context_paths",))
_VERSION_COLUMNS = table_columns(ProgramVersion, json=("scores", "changes", "state"))
_OPT_COLUMNS = table_columns(Optimization, json=("params", "scores"))


@dataclass(frozen=True)
class CachedEval:
    """What replaying one example with one program gave (the evaluation cache)."""

    run_id: str | None
    answer: str | None
    steps: list[dict[str, Any]] | None
    llm_calls: int
    cost: float | None


class OptimizeTables:
    """Datasets, program versions, optimizations and the eval cache (``store.optimize``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- datasets -------------------------------------------------------------------------------

    def create_dataset(
        self, dataset_id: str, name: str, source: str, holdout_fraction: float, seed: int, rows: list[DatasetRow]
    ) -> None:
        """Insert a dataset with its rows. ValueError when the name is taken."""
        masked = (
            replace(r, question=redact(r.question), context_text=redact(r.context_text), context_paths=r.context_paths
                    or [], answer=redact(r.answer), comment=redact(r.comment))
            for r in rows
        )  # fmt: skip
        values = [(dataset_id, *row_values(r, _ROW_COLUMNS)) for r in masked]

        def insert(tx: Tx) -> None:
            try:
                tx.conn.execute(
                    f"INSERT INTO datasets ({', '.join(_DATASET_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",
                    (dataset_id, name, source, holdout_fraction, seed, time.time()),
                )
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"a dataset named {name!r} exists already") from exc
            tx.conn.executemany(
                f"INSERT INTO dataset_rows (dataset_id, {', '.join(_ROW_COLUMNS)}) VALUES ({', '.join('?' * 10)})",
                values,
            )

        self._db.writer.run(insert)

    def get_dataset(self, name_or_id: str) -> Dataset | None:
        """The dataset (by name, else id) with its row counts per split."""
        rows = self._db.read(
            f"SELECT {', '.join(_DATASET_COLUMNS)} FROM datasets WHERE name = ? OR id = ? ORDER BY name = ? DESC",
            (name_or_id, name_or_id, name_or_id),
        )
        return self._with_counts(record(_DATASET_COLUMNS, rows[0])) if rows else None

    def list_datasets(self) -> list[Dataset]:
        rows = self._db.read(f"SELECT {', '.join(_DATASET_COLUMNS)} FROM datasets ORDER BY created_at DESC, name")
        return [self._with_counts(record(_DATASET_COLUMNS, r)) for r in rows]

    def _with_counts(self, dataset: dict[str, Any]) -> Dataset:
        sql = "SELECT split, COUNT(*) FROM dataset_rows WHERE dataset_id = ? GROUP BY split"
        counts = dict(self._db.read(sql, (dataset["id"],)))
        return Dataset(**dataset, train=int(counts.get("train", 0)), holdout=int(counts.get("holdout", 0)))

    def dataset_rows(self, dataset_id: str) -> list[DatasetRow]:
        rows = self._db.read(
            f"SELECT {', '.join(_ROW_COLUMNS)} FROM dataset_rows WHERE dataset_id = ? ORDER BY idx", (dataset_id,)
        )
        out = []
        for r in rows:
            rec = record(_ROW_COLUMNS, r)
            rec["verdict"] = None if rec["verdict"] is None else bool(rec["verdict"])
            out.append(DatasetRow(**rec))
        return out

    def judged_runs(self) -> list[JudgedRun]:
        """Each run's newest feedback with what a dataset needs of the run (people's runs only), and
        ``earlier``: how many runs its session had before it (0 for a session's first run)."""
        sql = (
            "SELECT r.id, r.question, r.answer, r.status, r.request_json, r.session_id, (SELECT COUNT(*) FROM runs e"
            " WHERE e.session_id = r.session_id AND e.kind = 'run' AND (e.created_at < r.created_at"
            " OR (e.created_at = r.created_at AND e.id < r.id))), f.correct, f.expected, f.comment FROM feedback f"
            " JOIN runs r ON r.id = f.run_id WHERE r.kind = 'run'"
            " AND f.id = (SELECT MAX(id) FROM feedback WHERE run_id = f.run_id) ORDER BY r.created_at, r.id"
        )
        keys = ("run_id", "question", "answer", "status", "request", "session_id", "earlier", "correct", "expected",
                "comment")  # fmt: skip
        rows = [dict(zip(keys, r, strict=True)) for r in self._db.read(sql)]
        return [
            JudgedRun(**{**row, "request": json.loads(row["request"] or "{}"), "correct": bool(row["correct"])})
            for row in rows
        ]

    # -- program versions -----------------------------------------------------------------------

    def add_program_version(self, version: ProgramVersion) -> None:
        """Insert a version. Its demos quote replayed runs: masked like everything else, so no secret
        reaches a later prompt either."""
        masked = replace(version, scores=redact(version.scores), state=redact(version.state),
                         changes=redact(version.changes))  # fmt: skip
        values = row_values(masked, _VERSION_COLUMNS)

        def insert(tx: Tx) -> None:
            tx.conn.execute(
                f"INSERT INTO program_versions ({', '.join(_VERSION_COLUMNS)}) VALUES ({', '.join('?' * 10)})", values
            )

        self._db.writer.run(insert)

    def get_program_version(self, version_id: str) -> ProgramVersion | None:
        rows = self._db.read(f"SELECT {', '.join(_VERSION_COLUMNS)} FROM program_versions WHERE id = ?", (version_id,))
        return ProgramVersion(**record(_VERSION_COLUMNS, rows[0])) if rows else None

    def list_program_versions(self) -> list[ProgramVersion]:
        """Newest first, without their saved state (it can be large)."""
        columns = tuple(c for c in _VERSION_COLUMNS if c != "state_json")
        rows = self._db.read(f"SELECT {', '.join(columns)} FROM program_versions ORDER BY created_at DESC, id DESC")
        return [ProgramVersion(**record(columns, r)) for r in rows]

    def activate_program(self, version_id: str | None, action: str, reason: str | None) -> None:
        """Make ``version_id`` (None: the built-in program) the one new runs use; kept as history."""

        def insert(tx: Tx) -> None:
            tx.conn.execute(
                "INSERT INTO program_activations (version_id, action, reason, created_at) VALUES (?, ?, ?, ?)",
                (version_id, action, redact(reason), time.time()),
            )

        self._db.writer.run(insert)

    def activations(self) -> list[Activation]:
        """Promotions and rollbacks, newest first."""
        keys = ("id", "version_id", "action", "reason", "created_at")
        rows = self._db.read(f"SELECT {', '.join(keys)} FROM program_activations ORDER BY id DESC")
        return [Activation(*r) for r in rows]

    def active_program_version(self) -> str | None:
        rows = self._db.read("SELECT version_id FROM program_activations ORDER BY id DESC LIMIT 1")
        return rows[0][0] if rows else None

    # -- optimizations --------------------------------------------------------------------------

    def create_optimization(self, opt: Optimization) -> None:
        values = row_values(opt, _OPT_COLUMNS)

        def insert(tx: Tx) -> None:
            tx.conn.execute(f"INSERT INTO optimizations ({', '.join(_OPT_COLUMNS)}) VALUES ({', '.join('?' * 10)})",
                            values)  # fmt: skip

        self._db.writer.run(insert)

    def update_optimization(self, opt_id: str, **fields: Any) -> None:
        """Set ``version_id`` and/or ``scores`` of an optimization."""
        columns = {f"{k}_json" if f"{k}_json" in _OPT_UPDATABLE else k: v for k, v in fields.items()}
        bad = sorted(set(columns) - _OPT_UPDATABLE)
        if bad:
            raise ValueError(f"cannot update optimization field(s): {', '.join(bad)}")
        params = [dumps(v) if k.endswith("_json") else v for k, v in columns.items()]
        sql = f"UPDATE optimizations SET {', '.join(f'{k} = ?' for k in columns)} WHERE id = ?"
        self._db.writer.run(lambda tx: tx.conn.execute(sql, [*params, opt_id]))

    def get_optimization(self, opt_id: str) -> Optimization | None:
        rows = self._db.read(f"SELECT {', '.join(_OPT_COLUMNS)} FROM optimizations WHERE id = ?", (opt_id,))
        return Optimization(**record(_OPT_COLUMNS, rows[0])) if rows else None

    def list_optimizations(self, limit: int = 50) -> list[Optimization]:
        rows = self._db.read(
            f"SELECT {', '.join(_OPT_COLUMNS)} FROM optimizations ORDER BY created_at DESC, id DESC LIMIT ?", (limit,)
        )
        return [Optimization(**record(_OPT_COLUMNS, r)) for r in rows]

    # -- evaluation cache -----------------------------------------------------------------------

    def cached_eval(self, lineage: str, program_hash: str, example_key: str) -> CachedEval | None:
        keys = ("run_id", "answer", "steps_json", "llm_calls", "cost")
        rows = self._db.read(
            f"SELECT {', '.join(keys)} FROM eval_cache WHERE lineage = ? AND program_hash = ? AND example_key = ?",
            (lineage, program_hash, example_key),
        )
        return CachedEval(**record(keys, rows[0])) if rows else None

    def cache_eval(
        self,
        lineage: str,
        program_hash: str,
        example_key: str,
        *,
        run_id: str | None,
        answer: str | None,
        steps: list[dict[str, Any]],
        llm_calls: int,
        cost: float | None,
    ) -> None:
        row = (lineage, program_hash, example_key, run_id, redact(answer), dumps(redact(steps)), llm_calls, cost,
               time.time())  # fmt: skip

        def insert(tx: Tx) -> None:
            tx.conn.execute(
                "INSERT OR REPLACE INTO eval_cache (lineage, program_hash, example_key, run_id, answer, steps_json,"
                " llm_calls, cost, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )

        self._db.writer.run(insert)
