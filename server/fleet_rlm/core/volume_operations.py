"""What every face does with volumes, written once: list, read, write and delete, as core views.

``Workspace`` has these for the faces that hold an engine; the CLI's ``volumes`` command uses them
alone on the settings' volume store (no store opened, so it starts instantly). Each call may wait on
I/O (the network, for Daytona volumes): an async face runs it in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from fleet_rlm.core import views
from fleet_rlm.errors import TooLarge, UserError
from fleet_rlm.volumes import Expect, Volumes

MAX_ENTRIES = 1000  # a recursive listing of a big volume must not flood the caller


class VolumeOperations:
    """The volume calls of a workspace; ``volumes`` gives the store (called on each use, cache it)."""

    def __init__(self, volumes: Callable[[], Volumes]) -> None:
        # Made on first use: a sandbox setting no store serves fails the volume calls, not the others.
        self._volumes = volumes

    def check_volume_name(self, name: str) -> None:
        """UserError unless ``name`` is a valid volume name for this store (nothing is read)."""
        self._volumes().check_name(name)

    def volume_list(self) -> views.VolumeList:
        return views.VolumeList(volumes=[views.VolumeInfo(**v) for v in self._volumes().list_volumes()])

    def create_volume(self, name: str) -> None:
        """Create the volume with its durable roots (memory/, artifacts/, buffers/, meta/) if missing."""
        self._volumes().ensure(name)

    def delete_volume(self, name: str) -> None:
        """Delete the volume and every file in it."""
        self._volumes().delete_volume(name)

    def files(
        self, volume: str, path: str = "", recursive: bool = False, limit: int | None = MAX_ENTRIES
    ) -> views.FileList:
        """Entries under ``path`` of a volume, at most ``limit`` (None: all; ``truncated`` says if there are more)."""
        entries = self._volumes().list_files(volume, path, recursive=recursive)
        shown = entries if limit is None else entries[:limit]
        return views.FileList(
            volume=volume, path=path, entries=[views.FileEntry(**e) for e in shown], truncated=len(shown) < len(entries)
        )

    def file_entry(self, volume: str, path: str) -> views.FileEntry:
        """The entry at ``path`` (a link as a link, never followed); NotFound names the volume or file."""
        return views.FileEntry(**self._volumes().stat(volume, path))

    def text(self, volume: str, path: str, offset: int = 0, length: int = 65536) -> views.TextRange:
        """A byte range of a text file of a volume (links and pipes refused, binary files too)."""
        size = self._file_size(volume, path)
        data = self._volumes().read(volume, path, offset, length)
        if b"\x00" in data:
            raise UserError(f"'{path}' in volume '{volume}' looks binary: download it instead of reading it as text")
        return views.text_range(volume, path, data, offset, size)

    def file_bytes(self, volume: str, path: str, max_bytes: int | None = None) -> bytes:
        """The whole of a file of a volume; TooLarge when it has more than ``max_bytes``."""
        # Without a cap the backend's read refuses a link or a pipe itself, naming which it is.
        if max_bytes is not None and self._file_size(volume, path) > max_bytes:
            raise TooLarge(f"'{path}' in volume '{volume}' is over {max_bytes:,} bytes: read it a range at a time")
        return self._volumes().read(volume, path)

    def open_file(self, volume: str, path: str) -> tuple[int, os.stat_result]:
        """A readable fd of a regular file of a volume and its fstat, for streaming; the caller closes it."""
        return self._volumes().open_file(volume, path)

    def write_file(
        self,
        volume: str,
        path: str,
        data: bytes | str,
        *,
        roots: tuple[str, ...] | None = None,
        expect: Expect | None = None,
    ) -> views.FileEntry:
        """Replace the whole file (creating the volume and folders); with ``roots``, only under those folders;
        with ``expect``, only over that file (none: a new file), else ``VolumeChanged``, nothing written."""
        return views.FileEntry(**self._volumes().write(volume, path, data, roots=roots, expect=expect))

    def delete_file(self, volume: str, path: str) -> None:
        """Delete a file, link or empty folder; never the volume itself or a durable root."""
        self._volumes().delete(volume, path)

    def _file_size(self, volume: str, path: str) -> int:
        entry = self._volumes().stat(volume, path)
        if entry["type"] != "file":
            raise UserError(f"'{path}' in volume '{volume}' is not a file (it is a {entry['type']})")
        return int(entry["size"])
