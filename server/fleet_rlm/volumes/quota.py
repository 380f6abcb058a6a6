"""Volume quotas: bytes and entries per volume, measured after each sandbox step (the local
sandbox caps its work folder the same way).

The host has no per-folder kernel quotas and loop-mounted images need root, so the mechanism is
measure-and-trim: after every step the host measures each mounted volume fd-relatively (links
never followed); when it is over its byte or entry quota, entries whose ctime is at or after the
step's start are removed, newest first, until it is back under, and the step's output says so.
ctime rather than mtime: code can set mtime to the past with ``os.utime``, but creating, writing,
renaming or touching an entry always sets its ctime to now. Data older than the step is never
removed automatically: the message asks to free space instead.

Limits: a single step can use more than the quota while it runs (up to the free disk) before it
is trimmed; an open file removed here keeps its blocks until the sandbox process closes it; sizes
are apparent sizes (``st_size``), so sparse files count in full.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet_rlm.volumes.safepath import Found, VolumeError, closing_fd, kind, open_dir

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

# File timestamps come from the kernel's coarse clock, which can lag time.time() by a tick.
CLOCK_SLACK = 0.05
SHOWN = 5  # removed entries named in the message


@dataclass(frozen=True)
class Quota:
    max_bytes: int
    max_files: int
    bytes_setting: str = "FLEET_VOLUME_QUOTA_MB"  # what raises each limit, named in messages
    files_setting: str = "FLEET_VOLUME_MAX_FILES"


def volume_quota(settings: Settings) -> Quota:
    """The limits of each volume, as the settings set them."""
    return Quota(max_bytes=settings.volume_quota_mb * 1024 * 1024, max_files=settings.volume_max_files)


@dataclass(frozen=True)
class Usage:
    files: int  # entries of any kind: files, folders, links
    bytes: int  # apparent size of the regular files

    def within(self, quota: Quota) -> bool:
        return self.bytes <= quota.max_bytes and self.files <= quota.max_files


def measure(entries: list[Found]) -> Usage:
    return Usage(len(entries), sum(e.size for e in entries if e.is_file))


def human(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def over_message(subject: str, used: Usage, quota: Quota, verb: str = "is") -> str:
    """What is over (``subject``: "volume notes", "the work folder ..."), and the setting that raises it."""
    parts = []
    if used.bytes > quota.max_bytes:
        parts.append(f"{human(used.bytes)} of its {human(quota.max_bytes)} quota ({quota.bytes_setting})")
    if used.files > quota.max_files:
        parts.append(f"{used.files:,} entries of its {quota.max_files:,} limit ({quota.files_setting})")
    return f"{subject} {verb} over quota: " + " and ".join(parts)


def trim(folder_fd: int, subject: str, entries: list[Found], quota: Quota, since: float) -> str | None:
    """Remove what was written at or after ``since`` until the folder is under ``quota``.

    ``entries`` is a fresh ``scan`` of the folder (a volume without its fixed top folders). Returns
    the message for the model, or None when the folder is within its quota or nothing recent is
    there to remove (a volume's older excess is reported by ``volumes ls`` and refused on host writes).
    """
    used = measure(entries)
    if used.within(quota):
        return None
    recent = [e for e in entries if e.ctime >= since - CLOCK_SLACK]
    if not recent:
        return None
    message = over_message(subject, used, quota)
    # Files (and links, pipes...) newest first; then folders, deepest first, which rmdir only
    # removes when empty, so a folder holding older data is never taken with them.
    files = sorted((e for e in recent if not e.is_dir), key=lambda e: e.ctime, reverse=True)
    folders = sorted((e for e in recent if e.is_dir), key=lambda e: len(e.parts), reverse=True)
    removed: list[Found] = []
    for entry in [*files, *folders]:
        if used.within(quota):
            break
        if _remove(folder_fd, entry):
            removed.append(entry)
            used = Usage(used.files - 1, used.bytes - (entry.size if entry.is_file else 0))
    shown = ", ".join(f"{e.rel} ({human(e.size) if e.is_file else kind(e.mode)})" for e in removed[:SHOWN])
    more = f" and {len(removed) - SHOWN} more" if len(removed) > SHOWN else ""
    message += f"; removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} written in this step"
    message += f", newest first: {shown}{more}" if removed else ""
    if used.within(quota):
        return message + f". Free space in {subject} or raise the limit before writing more."
    return message + (
        f". Still over ({human(used.bytes)}, {used.files:,} entries): older data is never removed "
        f"automatically; delete files from {subject} or raise the limit."
    )


def _remove(folder_fd: int, entry: Found) -> bool:
    """unlink/rmdir relative to the parent's fd; False if it changed meanwhile or is not empty."""
    try:
        parent = open_dir(folder_fd, list(entry.parts[:-1]), "")
    except VolumeError:
        return False  # a folder on the way became a link or vanished: leave it
    with closing_fd(parent), contextlib.suppress(OSError):
        if entry.is_dir:
            os.rmdir(entry.parts[-1], dir_fd=parent)
        else:
            os.unlink(entry.parts[-1], dir_fd=parent)
        return True
    return False
