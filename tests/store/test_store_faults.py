"""The store's writer when SQLite cannot write: the disk is full, or another process holds the lock.

Each failure reaches the writer's callers as the one error a person reads (``StoreFull``,
``StoreLocked``, both in ``fleet_rlm.errors``), never as SQLite's own words about a savepoint or a
transaction it already ended; and the writer lives on, so once space is back the store writes again.
The full disk is a real one: a small tmpfs (``tests/support/small_disk``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_rlm.errors import StoreFull, StoreLocked, Unavailable
from fleet_rlm.store import RunRecord, Store
from tests.support.bounded import finishes
from tests.support.small_disk import fill, free, small_disk

BIG = "x" * 3_000_000  # more than SQLite's page cache holds: the statement itself writes, and fails


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", mb=8) as mounted:
        yield mounted


@pytest.fixture
def full_store(disk: Path) -> Iterator[Store]:
    """A store with one run, on a disk then filled to the last block."""
    store = Store(disk / "fleet.db")
    store.runs.create(RunRecord(id="r1", question="q"))
    store.runs.append_event("r1", "run.started", {"question": "q"})
    fill(disk)
    try:
        yield store
    finally:
        free(disk)
        store.close()


def _batch_behind(store: Store) -> threading.Event:
    """Hold the writer in a job of its own until the returned event is set, so that what is queued
    meanwhile commits as one batch (each job in its own savepoint)."""
    gate = threading.Event()
    store.writer.submit(lambda _tx: gate.wait(60))
    return gate


def test_a_full_disk_fails_a_batch_with_the_store_full_error_not_a_lost_savepoint(full_store: Store) -> None:
    """SQLite rolls the whole transaction back on SQLITE_FULL: ``ROLLBACK TO job`` then fails with "no such
    savepoint". The batch's writes fail with the error that says what happened, and none of them is kept."""
    gate = _batch_behind(full_store)
    full_store.runs.queue_event("r1", "warning", {"message": "queued beside it"})
    big = full_store.submit(full_store.runs.append_event, "r1", "code.executed", {"stdout": BIG})
    gate.set()
    with pytest.raises(StoreFull, match=r"^the store's disk is full") as caught:
        finishes(big.result)
    assert isinstance(caught.value, Unavailable) and "savepoint" not in str(caught.value)
    assert [e["kind"] for e in full_store.runs.events("r1")] == ["run.started"]


def test_a_full_disk_fails_a_lone_write_with_the_store_full_error(full_store: Store) -> None:
    with pytest.raises(StoreFull, match=r"^the store's disk is full"):
        finishes(lambda: full_store.runs.update("r1", status="failed", error="e" * 200_000))
    with pytest.raises(StoreFull, match=r"^the store's disk is full"):
        finishes(lambda: full_store.runs.append_event("r1", "warning", {"message": "m" * 200_000}))


def test_the_store_writes_again_once_space_is_freed(full_store: Store, disk: Path) -> None:
    with pytest.raises(StoreFull):
        finishes(lambda: full_store.runs.append_event("r1", "code.executed", {"stdout": BIG}))
    free(disk)
    event = finishes(lambda: full_store.runs.append_event("r1", "run.finished", {"status": "failed"}))
    assert event["seq"] == 2  # the lost event took no seq: the log has no gap
    finishes(lambda: full_store.runs.update("r1", status="failed"))
    run = full_store.runs.get("r1")
    assert run is not None and run.status == "failed"
    assert [e["kind"] for e in full_store.runs.events("r1")] == ["run.started", "run.finished"]


def test_a_write_behind_another_process_s_lock_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's ``BEGIN IMMEDIATE`` outwaits its busy timeout: the same sentence as a store that
    cannot be opened for the lock, whichever write met it."""
    monkeypatch.setattr("fleet_rlm.store.db._BUSY_SECONDS", 0.2)
    path = tmp_path / "fleet.db"
    with Store(path) as store:
        store.runs.create(RunRecord(id="r1", question="q"))  # the writer's connection is open
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a long write
        try:
            with pytest.raises(StoreLocked, match=r"stayed locked for 0\.2 s by another fleet-rlm process; try again"):
                finishes(lambda: store.runs.update("r1", status="running"))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.runs.update("r1", status="running")  # and the writer goes on
        run = store.runs.get("r1")
        assert run is not None and run.status == "running"
