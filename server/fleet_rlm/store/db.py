"""SQLite connection setup and versioned schema migrations.

The schema version lives in ``PRAGMA user_version``. ``MIGRATIONS[i]`` moves a
database from version ``i`` to ``i + 1``; migrations are only ever appended,
never edited, so a store written by any older fleet-rlm can be upgraded.

The database holds questions, answers and traces: its folder is 0700 and its files 0600
(SQLite gives the -wal and -shm files the database file's mode).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

from fleet_rlm.config import private_dir
from fleet_rlm.errors import StoreError, StoreFull, StoreLocked

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "StoreError", "connect", "migrate", "store_error"]

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

# ``gid``: one order over every run's events, in commit order across processes and never reused
# (AUTOINCREMENT), so a reader follows all runs' new events with one cursor (the web app showing a
# run the CLI is running). SQLite cannot add such a column in place: the table is rebuilt.
_V3 = """
ALTER TABLE events RENAME TO events_v2;
CREATE TABLE events (
    gid INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    node TEXT NOT NULL,
    parent TEXT,
    depth INTEGER NOT NULL DEFAULT 0,
    data_json TEXT NOT NULL,
    UNIQUE (run_id, seq)
);
INSERT INTO events (run_id, seq, ts, kind, node, parent, depth, data_json)
    SELECT run_id, seq, ts, kind, node, parent, depth, data_json FROM events_v2 ORDER BY ts, run_id, seq;
DROP TABLE events_v2
"""

# Files uploaded through the web app (kept under FLEET_HOME/uploads/<id>/) and the runs that read
# them: an upload lives as long as a run uses it (optimization replays and follow-ups reuse it).
# Feedback on a run's answer, kept for optimization. Both go with their run (ON DELETE CASCADE).
_V4 = """
CREATE TABLE uploads (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE run_uploads (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    upload_id TEXT NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    PRIMARY KEY (run_id, upload_id)
) WITHOUT ROWID;
CREATE INDEX run_uploads_upload ON run_uploads (upload_id);
CREATE TABLE feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    correct INTEGER NOT NULL,
    expected TEXT,
    comment TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX feedback_run ON feedback (run_id, id)
"""

# Optimization (``optimize/``, tables in ``store/optimize.py``). A run now says which program version
# answered it and what it is: ``run`` (a user's), ``eval`` (an optimization replaying a dataset row;
# ``parent_run_id`` is the optimization) or ``optimize`` (the optimization itself: its row and
# event log are its status and progress stream). Datasets keep their rows and train/holdout split;
# a program version keeps DSPy's saved state; activations are the promote/rollback history (the
# newest is active; version NULL: the built-in program); the eval cache lets a rerun skip what an
# interrupted optimization already evaluated.
_V5 = """
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'run';
ALTER TABLE runs ADD COLUMN program_version TEXT;
CREATE INDEX runs_kind ON runs (kind, created_at DESC);
CREATE TABLE datasets (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL,
    holdout_fraction REAL NOT NULL,
    seed INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE dataset_rows (
    dataset_id TEXT NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    split TEXT NOT NULL,
    question TEXT NOT NULL,
    context_text TEXT,
    context_paths_json TEXT NOT NULL DEFAULT '[]',
    answer TEXT NOT NULL,
    verdict INTEGER,
    comment TEXT,
    run_id TEXT,
    PRIMARY KEY (dataset_id, idx)
) WITHOUT ROWID;
CREATE TABLE program_versions (
    id TEXT PRIMARY KEY,
    base_id TEXT,
    optimization_id TEXT,
    dataset_id TEXT,
    optimizer TEXT NOT NULL,
    metric TEXT NOT NULL,
    scores_json TEXT NOT NULL DEFAULT '{}',
    state_json TEXT NOT NULL,
    changes_json TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE TABLE program_activations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    version_id TEXT,
    action TEXT NOT NULL,
    reason TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE optimizations (
    id TEXT PRIMARY KEY,
    lineage TEXT NOT NULL,
    dataset_id TEXT NOT NULL,
    optimizer TEXT NOT NULL,
    metric TEXT NOT NULL,
    base_version TEXT,
    params_json TEXT NOT NULL DEFAULT '{}',
    version_id TEXT,
    scores_json TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE TABLE eval_cache (
    lineage TEXT NOT NULL,
    program_hash TEXT NOT NULL,
    example_key TEXT NOT NULL,
    run_id TEXT,
    answer TEXT,
    steps_json TEXT NOT NULL DEFAULT '[]',
    llm_calls INTEGER NOT NULL DEFAULT 0,
    cost REAL,
    created_at REAL NOT NULL,
    PRIMARY KEY (lineage, program_hash, example_key)
) WITHOUT ROWID
"""

# The workspace agent (``agent/``, tables in ``store/agent.py``): conversations with their messages
# (each also kept in the Agent Framework's own form, ``af_json``, to rebuild the history), turns (one
# workflow run each, possibly paused), tool approvals and their audit log, the runs a conversation
# started, its attached uploads, and the workflows' checkpoints (a paused turn's durable state).
_V6 = """
CREATE TABLE agent_conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    session_id TEXT NOT NULL,
    volume TEXT NOT NULL,
    grants_json TEXT NOT NULL DEFAULT '[]',
    mcp_servers_json TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE agent_turns (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (id) ON DELETE CASCADE,
    status TEXT NOT NULL,
    error TEXT,
    owner_pid INTEGER,
    owner_host TEXT,
    owner_start TEXT,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX agent_turns_conversation ON agent_turns (conversation_id, created_at);
CREATE TABLE agent_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (id) ON DELETE CASCADE,
    turn_id TEXT NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT,
    call_id TEXT,
    tool TEXT,
    arguments_json TEXT,
    af_json TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX agent_messages_conversation ON agent_messages (conversation_id, id);
CREATE TABLE agent_approvals (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (id) ON DELETE CASCADE,
    turn_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    summary TEXT NOT NULL,
    status TEXT NOT NULL,
    decided_by TEXT,
    reason TEXT,
    always INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decided_at REAL,
    executed_at REAL
);
CREATE INDEX agent_approvals_status ON agent_approvals (status, created_at);
CREATE INDEX agent_approvals_turn ON agent_approvals (turn_id);
CREATE TABLE agent_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    approval_id TEXT,
    action TEXT NOT NULL,
    tool TEXT NOT NULL,
    summary TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX agent_audit_conversation ON agent_audit (conversation_id, id);
CREATE TABLE agent_runs (
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (id) ON DELETE CASCADE,
    run_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, run_id)
) WITHOUT ROWID;
CREATE TABLE agent_attachments (
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (id) ON DELETE CASCADE,
    upload_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, upload_id)
) WITHOUT ROWID;
CREATE TABLE agent_checkpoints (
    id TEXT PRIMARY KEY,
    workflow_name TEXT NOT NULL,
    created_at REAL NOT NULL,
    data_json TEXT NOT NULL
);
CREATE INDEX agent_checkpoints_workflow ON agent_checkpoints (workflow_name, created_at)
"""

# Why an approval cannot be approved (its card cannot show the call exactly); NULL: it can.
_V7 = "ALTER TABLE agent_approvals ADD COLUMN blocked TEXT"

# Replay and fork (``core/tape.py``, ``store/records.py``, docs/replay.md). A run's record: every model
# reply and host-call result under its position in the run (``slot``), with the hash of the request it
# answered; bodies are kept once per content (a replay's replies and repeated replies add no bytes).
# ``runs.fork_at``: the step a fork branched from its parent run at ("root:3", "root.1:2").
_V8 = """
CREATE TABLE run_records (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    n INTEGER NOT NULL,
    slot TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    request_chars INTEGER NOT NULL,
    body_hash TEXT NOT NULL,
    usage_json TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, n)
) WITHOUT ROWID;
CREATE INDEX run_records_body ON run_records (body_hash);
CREATE TABLE record_bodies (
    hash TEXT PRIMARY KEY,
    body TEXT NOT NULL
) WITHOUT ROWID;
ALTER TABLE runs ADD COLUMN fork_at TEXT
"""

# A pinned run is kept: retention (``retention_days``, ``runs --delete-older-than``) passes it by.
_V9 = "ALTER TABLE runs ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0"

# Append-only. Index i upgrades schema version i -> i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _sql(_V1), _sql(_V2), _sql(_V3), _sql(_V4), _sql(_V5), _sql(_V6), _sql(_V7), _sql(_V8), _sql(_V9),
]  # fmt: skip
SCHEMA_VERSION = len(MIGRATIONS)


_BUSY_SECONDS = 5.0  # how long a connection waits for another process's lock


def _busy(exc: BaseException) -> bool:
    """Another connection holds the lock (SQLITE_BUSY and its extended codes)."""
    return isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY


def _full(exc: BaseException) -> bool:
    """The disk has no space left for the write (SQLITE_FULL: SQLite's word for ENOSPC)."""
    return isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL


def store_error(exc: BaseException, path: Path) -> BaseException:
    """``exc`` as the person reads it when it is the store's lock or its disk (``StoreLocked``,
    ``StoreFull``, which every face maps: CLI exit 1, HTTP 503, a tool error); anything else as it is."""
    if _busy(exc):
        return StoreLocked(
            f"the store {path} stayed locked for {_BUSY_SECONDS:g} s by another fleet-rlm process;"
            " try again when it is less busy"
        )
    if _full(exc):
        return StoreFull(
            f"the store's disk is full: nothing can be recorded in {path.parent} until space is freed there"
        )
    return exc


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the database at ``path`` and bring its schema up to date."""
    private_dir(path.parent)
    _make_private(path)
    # isolation_level=None: we issue BEGIN/COMMIT ourselves so that writes can
    # take the write lock up front (BEGIN IMMEDIATE) across processes.
    conn = sqlite3.connect(str(path), timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False)
    try:
        _use_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn)
    except BaseException as exc:
        conn.close()
        error = store_error(exc, path)
        if error is not exc:
            raise error from None
        raise
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode (it stays so: later opens find it there).

    SQLite does not call the busy handler for this switch: while another process is opening the
    same fresh store (two first ``fleet-rlm run`` at once), it fails at once with "database is
    locked". So it is retried here, with backoff, for as long as any other lock is waited for."""
    deadline = time.monotonic() + _BUSY_SECONDS
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _make_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does; tighten an older store's files."""
    # O_EXCL: never open a file SQLite may have open in this process (a store's reader and writer
    # connections, two stores): closing any descriptor of it drops all of this process's POSIX
    # locks on it, SQLite's included, and a database whose locks vanish can be corrupted.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
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
        if conn.in_transaction:  # SQLite ends it itself on some errors (a full disk)
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
