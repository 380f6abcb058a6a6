"""Files uploaded through the web app, kept as context for the runs that read them.

An upload is a folder ``FLEET_HOME/uploads/<upload_id>/`` (0700) holding one file (0600) under its
sanitized original name, plus a store row. A run that names it (``upload_ids``) reads it as a
context path, allowed even when ``FLEET_CONTEXT_ROOTS`` is set, and is recorded as using it. An
upload lives as long as some run uses it (optimization replays and follow-ups read it again):
deleting its last run deletes it (``housekeeping``); one no run ever took goes after a day.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
import time
import unicodedata
from typing import TYPE_CHECKING, Any, BinaryIO

from fleet_rlm.config import private_dir
from fleet_rlm.errors import NotFound, TooLarge, UserError

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.store import Store
    from fleet_rlm.types import RunRequest

UPLOAD_ID = re.compile(r"u[0-9a-f]{8,40}")
MAX_NAME_BYTES = 200


def safe_name(filename: str | None) -> str:
    """The file's own name without folders, control characters or a leading dot; never empty."""
    base = re.split(r"[/\\]", filename or "")[-1]
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C").strip().lstrip(".").strip()
    while len(base.encode()) > MAX_NAME_BYTES:
        base = base[:-1]
    return base or "upload"


def limit_bytes(settings: Settings) -> int:
    return settings.upload_max_mb * 1024 * 1024


def too_large(settings: Settings) -> TooLarge:
    return TooLarge(
        f"the upload is larger than {settings.upload_max_mb} MB: split it, put it in a volume, "
        "or raise upload_max_mb in the settings"
    )


class UploadWriter:
    """Writes one upload as it arrives; ``commit`` records it, ``discard`` removes it."""

    def __init__(self, settings: Settings, filename: str | None) -> None:
        self.settings = settings
        self.name = safe_name(filename)
        self.upload_id = f"u{int(time.time() * 1000):x}{secrets.token_hex(6)}"
        self.folder = private_dir(settings.uploads_root) / self.upload_id
        self.folder.mkdir(mode=0o700)
        self.size = 0
        fd = os.open(self.folder / self.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        self._out: BinaryIO = os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        """Append a chunk; past the size limit the upload is removed and TooLarge raised."""
        self.size += len(chunk)
        if self.size > limit_bytes(self.settings):
            self.discard()
            raise too_large(self.settings)
        self._out.write(chunk)

    def commit(self, workspace: Workspace) -> dict[str, Any]:
        """Record the upload in the workspace; its id, name and size."""
        self._out.close()
        workspace.store.uploads.add(self.upload_id, self.name, self.size)
        return {"upload_id": self.upload_id, "name": self.name, "size": self.size}

    def discard(self) -> None:
        self._out.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def upload_paths(store: Store, settings: Settings, upload_ids: list[str]) -> list[str]:
    """The files of these uploads, as context paths; NotFound names an unknown one."""
    paths = []
    for upload_id in upload_ids:
        row = store.uploads.get(upload_id) if isinstance(upload_id, str) and UPLOAD_ID.fullmatch(upload_id) else None
        if row is None:
            raise NotFound(f"no upload '{upload_id}': upload the file again (POST /api/uploads)")
        path = settings.uploads_root / upload_id / row.name
        if not path.is_file():
            raise UserError(f"upload '{upload_id}' lost its file: upload it again")
        paths.append(str(path))
    return paths


def remove_upload_files(settings: Settings, upload_ids: list[str]) -> None:
    for upload_id in upload_ids:
        if UPLOAD_ID.fullmatch(upload_id):  # ids come from our store, but never build a path from anything else
            shutil.rmtree(settings.uploads_root / upload_id, ignore_errors=True)


async def start_run(engine: Engine, req: RunRequest, upload_ids: list[str]) -> str:
    """Start a run of ``req`` that also reads these uploads (the request is left as given), and record
    that it uses them."""
    store = engine.workspace.store
    paths = [*req.context_paths, *upload_paths(store, engine.settings, upload_ids)]
    run_id = await engine.start_run(dataclasses.replace(req, context_paths=paths))
    if upload_ids:
        await store.write(store.uploads.attach, run_id, list(dict.fromkeys(upload_ids)))
    return run_id
