"""Housekeeping a user expects: deleting runs (with their uploads) one by one or by age, the
retention setting that does it by itself, and how much of ``FLEET_HOME`` each kind of data uses.

Runs still queued or running are never deleted: cancel them first.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_rlm.core.uploads import remove_upload_files
from fleet_rlm.errors import Conflict, NotFound, UserError
from fleet_rlm.types import ACTIVE_STATUSES

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.core.workspace import Workspace

DAY = 86400.0
UNUSED_UPLOAD_SECONDS = DAY  # an upload no run took within a day was abandoned


def delete_run(workspace: Workspace, settings: Settings, ref: str) -> None:
    """Delete a finished run (any run reference) with its events, feedback and the uploads no other
    run uses."""
    store, run_id = workspace.store, workspace.resolve_run(ref)
    row = store.runs.get(run_id)
    if row is None:
        raise NotFound(f"no run '{run_id}': it may have been deleted already")
    if row.status in ACTIVE_STATUSES:
        raise Conflict(f"run '{run_id}' is {row.status}: cancel it first, then delete it")
    remove_upload_files(settings, store.runs.purge([run_id]))


def delete_runs_older_than(workspace: Workspace, settings: Settings, days: float, now: float | None = None) -> int:
    """Delete every finished run created more than ``days`` ago; returns how many."""
    if not days > 0:
        raise UserError(f"older_than_days must be more than 0, not {days}")
    store = workspace.store
    ids = store.runs.finished_before((now or time.time()) - days * DAY)
    if ids:
        remove_upload_files(settings, store.runs.purge(ids))
    return len(ids)


def apply_retention(workspace: Workspace, settings: Settings, now: float | None = None) -> int:
    """What ``retention_days`` asks for, plus abandoned uploads; returns the runs deleted."""
    now = now or time.time()
    days = settings.retention_days
    deleted = delete_runs_older_than(workspace, settings, days, now) if days else 0
    store = workspace.store
    unused = store.uploads.unused_before(now - UNUSED_UPLOAD_SECONDS)
    if unused:
        store.uploads.delete(unused)
        remove_upload_files(settings, unused)
    return deleted


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path``; links are counted as themselves, never followed."""
    total, todo = 0, [path]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:  # gone, or not a folder
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                todo.append(Path(entry.path))
            elif stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def disk_use(settings: Settings) -> dict[str, Any]:
    """Bytes of ``FLEET_HOME`` by runs (the store and scratch folders), uploads and volumes."""
    db = settings.store_path
    store_bytes = sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    runs = store_bytes + folder_bytes(settings.work_root)
    return {
        "runs": runs,
        "uploads": folder_bytes(settings.uploads_root),
        "volumes": folder_bytes(settings.volumes_root),
        "total": folder_bytes(settings.home),
        "retention_days": settings.retention_days,
    }
