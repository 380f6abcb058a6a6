"""SQLite connection setup and versioned schema migrations.

The schema version lives in ``PRAGMA user_version``. ``MIGRATIONS[i]`` moves a
database from version ``i`` to ``i + 1``; migrations are only ever appended,
never edited, so a store written by any older fleet-rlm can be upgraded.

The database holds questions, answers and traces: its folder is 0700 and its files 0600
(SQLite gives the -wal and -shm files the database file's mode).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

from fleet_rlm.config import private_dir


class StoreError(RuntimeError):
    """The store cannot be opened or used (e.g. written by a newer fleet-rlm)."""


_V1 = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    name TEXT,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    closed_at REAL,
    meta_json TEXT NOT NULL DEFAULT '{}'
);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    session_id TEXT,
    parent_run_id TEXT,
    question TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    answer TEXT,
    stop_reason TEXT,
    error TEXT,
    request_json TEXT NOT NULL DEFAULT '{}',
    usage_json TEXT NOT NULL DEFAULT '{}',
    iterations INTEGER NOT NULL DEFAULT 0,
    llm_calls INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    owner_pid INTEGER,
    owner_host TEXT
);
CREATE INDEX runs_created ON runs (created_at DESC, id DESC);
CREATE INDEX runs_session ON runs (session_id, created_at DESC);
CREATE INDEX runs_status ON runs (status);

-- Events belong to a run: deleting the run deletes its log, and an event for
-- an unknown run is a bug we want to hear about (foreign keys are on).
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    node TEXT NOT NULL,
    parent TEXT,
    depth INTEGER NOT NULL DEFAULT 0,
    data_json TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
"""


def _sql(script: str) -> Callable[[sqlite3.Connection], None]:
    def apply(conn: sqlite3.Connection) -> None:
        # Split by hand: executescript() would COMMIT our open transaction.
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)

    return apply


# Who owns a run, beyond its pid: boot id + process start time, so a recycled pid is not
# mistaken for the run's owner (NULL where /proc is not available, and for older rows).
_V2 = "ALTER TABLE runs ADD COLUMN owner_start TEXT"

# Append-only. Index i upgrades schema version i -> i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_sql(_V1), _sql(_V2)]
SCHEMA_VERSION = len(MIGRATIONS)


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the database at ``path`` and bring its schema up to date."""
    private_dir(path.parent)
    _make_private(path)
    # isolation_level=None: we issue BEGIN/COMMIT ourselves so that writes can
    # take the write lock up front (BEGIN IMMEDIATE) across processes.
    conn = sqlite3.connect(str(path), timeout=5.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _make_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does; tighten an older store's files."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            info = name.stat()
        except FileNotFoundError:
            continue
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            name.chmod(stat.S_IMODE(info.st_mode) & 0o600)


def migrate(conn: sqlite3.Connection) -> int:
    """Apply pending migrations in one transaction; return the resulting schema version."""
    # IMMEDIATE so two processes opening a fresh file don't both run migration 1.
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"this store was written by a newer fleet-rlm (schema {version}); upgrade fleet-rlm"
                f" (this version understands schema {SCHEMA_VERSION})"
            )
        for step in MIGRATIONS[version:]:
            step(conn)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
