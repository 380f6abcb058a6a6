"""File system primitives for trees that hostile code can change at any moment (volumes).

A sandbox has every volume mounted read-write, so between two host calls it can swap a folder
for a symbolic link, plant links pointing anywhere, or leave named pipes and sockets behind.
Checking a path and then using it races with that. These helpers never use a path string twice:
they walk from an open directory fd one component at a time with ``O_NOFOLLOW``, so the kernel
resolves each step against the folder already held, and a link anywhere is refused, never
followed. Files are opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open fd, so a pipe,
socket or device is refused without blocking. Creating, renaming and deleting are ``*at`` calls
relative to the parent's fd, which never follow the final component either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from fleet_rlm import errors

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_MODE = 0o700
FILE_MODE = 0o600
LINK_HINT = "links inside volumes are never followed, even when they point inside; delete the link"


class VolumeError(errors.UserError):
    """A volume operation was refused or failed; the message says why."""


class VolumeNotFound(VolumeError, errors.NotFound):
    """Nothing is at that path: no such volume, file or folder."""


class VolumeChanged(VolumeError, errors.Conflict):
    """A conditional write found the path other than it expected (created, changed or removed since)."""


def kind(mode: int) -> str:
    """``file``, ``dir``, ``link`` or ``other`` (pipes, sockets, devices), from a mode never followed."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def special_name(mode: int) -> str:
    """What a non-regular, non-folder entry is, for messages."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _refusal(dir_fd: int, name: str, rel: str, where: str, *, want: str) -> VolumeError:
    """Why ``name`` (in ``dir_fd``) could not be opened as a ``want`` ("folder" or "file")."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return VolumeNotFound(f"no {want} {rel!r} {where}")
    if stat.S_ISLNK(st.st_mode):
        return VolumeError(f"{rel!r} {where} is a symbolic link: {LINK_HINT}")
    if kind(st.st_mode) == {"folder": "dir", "file": "file"}[want]:  # it was something else a moment ago
        return VolumeError(f"{rel!r} {where} changed while it was being opened; try again")
    if stat.S_ISDIR(st.st_mode):
        return VolumeError(f"{rel!r} {where} is a folder, not a file")
    if stat.S_ISREG(st.st_mode):
        return VolumeError(f"{rel!r} {where} is a file, not a folder")
    return VolumeError(f"{rel!r} {where} is {special_name(st.st_mode)}, not a {want}: refusing to open it")


def open_dir(base_fd: int, parts: list[str], where: str, *, create: bool = False) -> int:
    """A new fd for the folder ``parts`` below ``base_fd``; the caller closes it.

    With ``create``, missing folders are made (mode 0700). Whatever ends up at a name is checked
    by opening it with O_NOFOLLOW|O_DIRECTORY, so a link planted in a race is refused too.
    """
    fd = os.dup(base_fd)
    for i, part in enumerate(parts):
        rel = "/".join(parts[: i + 1])
        try:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise VolumeNotFound(f"no folder {rel!r} {where}") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            refusal = _refusal(fd, part, rel, where, want="folder")
            os.close(fd)
            raise refusal from exc
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        fd = child
    return fd


def open_regular(dir_fd: int, name: str, rel: str, where: str) -> tuple[int, os.stat_result]:
    """Open ``name`` in ``dir_fd`` for reading if it is a regular file; (fd, fstat) — the caller closes.

    A named pipe opens at once under O_NONBLOCK and is then refused by the fstat check; a socket
    fails to open (ENXIO); a link fails (ELOOP). Nothing here can block.
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        raise VolumeError(f"{rel!r} {where} is not readable (permission denied)") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT, errno.EOPNOTSUPP):
            raise _refusal(dir_fd, name, rel, where, want="file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise VolumeError(f"{rel!r} {where} is a folder, not a file")
        raise VolumeError(f"{rel!r} {where} is {special_name(st.st_mode)}, not a file: refusing to open it")
    return fd, st


@dataclass(frozen=True)
class Found:
    """One entry met by ``scan``: its path parts and what ``lstat`` said about it."""

    parts: tuple[str, ...]
    mode: int
    size: int
    mtime: float
    ctime: float

    @classmethod
    def of(cls, parts: tuple[str, ...], st: os.stat_result) -> Found:
        return cls(parts, st.st_mode, st.st_size, st.st_mtime, st.st_ctime)

    @property
    def rel(self) -> str:
        return "/".join(self.parts)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)


def scan(dir_fd: int, prefix: tuple[str, ...] = (), *, recursive: bool = True) -> list[Found]:
    """Every entry below ``dir_fd`` (lstat, links never followed), folders before their contents.

    A subfolder is entered only by opening it with O_NOFOLLOW from its parent's fd, so one swapped
    for a link meanwhile is listed but not entered; entries that vanish mid-scan are left out.
    """
    out: list[Found] = []
    stack = [(os.dup(dir_fd), prefix)]
    while stack:
        fd, parts = stack.pop()
        with closing_fd(fd), os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                child = (*parts, entry.name)
                out.append(Found.of(child, st))
                if recursive and stat.S_ISDIR(st.st_mode):
                    try:
                        stack.append((os.open(entry.name, DIR_FLAGS, dir_fd=fd), child))
                    except OSError:
                        continue  # replaced by a link or removed since the lstat: not entered
    return out
