"""Local volumes: named folders that outlive runs.

A volume is ``root/<name>/`` with durable roots ``memory/``, ``artifacts/``, ``buffers/`` and
``meta/``, mounted read-write into sandboxes (the contract: ``base.Volumes``; names and paths are
checked by ``paths``). Because sandboxed code can change a volume at any moment, every operation
here goes through ``safepath``: fd-relative, one component at a time, symbolic links refused (never
followed, even when they point inside), pipes, sockets and devices refused without blocking, writes
through a temp file renamed into place. Quotas: ``quota``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_rlm.volumes.base import Expect, register_volumes
from fleet_rlm.volumes.paths import (
    DURABLE_ROOTS,
    check_volume_name,
    delete_parts,
    is_volume_name,
    path_parts,
    write_parts,
)
from fleet_rlm.volumes.quota import Quota, Usage, human, measure, over_message, trim
from fleet_rlm.volumes.safepath import (
    CREATE_FLAGS,
    DIR_FLAGS,
    DIR_MODE,
    FILE_MODE,
    LINK_HINT,
    Found,
    VolumeChanged,
    VolumeError,
    VolumeNotFound,
    closing_fd,
    kind,
    open_dir,
    open_regular,
    scan,
)

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

DEFAULT_QUOTA_MB = 1024
DEFAULT_MAX_FILES = 100_000

__all__ = ["LocalVolumes"]


def _entry(found: Found) -> dict[str, Any]:
    """A listing row; ``type`` is file, dir, link or other, from an lstat (links never followed)."""
    what = kind(found.mode)
    return {"path": found.rel, "type": what, "size": found.size if what == "file" else 0, "mtime": found.mtime}


def _where(name: str) -> str:
    return f"in volume {name!r}"


class LocalVolumes:
    """Volumes stored as folders under ``root``, each limited to ``quota_mb`` and ``max_files`` entries."""

    def __init__(self, root: Path, *, quota_mb: int = DEFAULT_QUOTA_MB, max_files: int = DEFAULT_MAX_FILES) -> None:
        self.root = Path(root)
        self.quota = Quota(max_bytes=quota_mb * 1024 * 1024, max_files=max_files)

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalVolumes:
        return cls(settings.volumes_root, quota_mb=settings.volume_quota_mb, max_files=settings.volume_max_files)

    # -- names, paths and fds -------------------------------------------------------------------

    check_name = staticmethod(check_volume_name)

    def _root_fd(self, *, create: bool) -> int | None:
        """The volumes folder (host-created, opened with O_NOFOLLOW); None if it does not exist."""
        if create:
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        try:
            return os.open(self.root, DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise VolumeError(f"the volumes folder {self.root} is not a folder (a link or a file): {exc}") from None

    def _volume_fd(self, name: str, *, create: bool = False) -> int:
        """An fd for the volume's own folder (never through a link); created with its roots if asked."""
        self.check_name(name)
        root = self._root_fd(create=create)
        if root is None:
            raise VolumeNotFound(f"no volume {name!r}")
        with closing_fd(root):
            try:
                vol = open_dir(root, [name], "among the volumes", create=create)
            except VolumeNotFound:
                raise VolumeNotFound(f"no volume {name!r}") from None
        if create:
            try:
                for sub in DURABLE_ROOTS:
                    os.close(open_dir(vol, [sub], _where(name), create=True))
            except BaseException:
                os.close(vol)
                raise
        return vol

    @contextlib.contextmanager
    def _folder(self, name: str, parts: list[str]) -> Iterator[int]:
        """An fd for folder ``parts`` of volume ``name`` (the volume's own folder for [])."""
        with closing_fd(self._volume_fd(name)) as vol, closing_fd(open_dir(vol, parts, _where(name))) as fd:
            yield fd

    def ensure(self, name: str) -> Path:
        """Create the volume (and its durable roots) if missing; return its folder."""
        os.close(self._volume_fd(name, create=True))
        return self.root / name

    def path(self, name: str) -> Path:
        """The volume's host folder, for mounting it; refused if it is missing or a link."""
        os.close(self._volume_fd(name))
        return self.root / name

    # -- volumes --------------------------------------------------------------------------------

    def _contents(self, vol: int) -> list[Found]:
        """Everything in a volume except the durable roots themselves (those are the host's)."""
        return [e for e in scan(vol) if not (len(e.parts) == 1 and e.is_dir and e.parts[0] in DURABLE_ROOTS)]

    def usage(self, name: str) -> Usage:
        with closing_fd(self._volume_fd(name)) as vol:
            return measure(self._contents(vol))

    def names(self) -> list[str]:
        """The volumes' names, sorted (without measuring them)."""
        root = self._root_fd(create=False)
        if root is None:
            return []
        with closing_fd(root), os.scandir(root) as entries:
            return sorted(e.name for e in entries if is_volume_name(e.name) and e.is_dir(follow_symlinks=False))

    def list_volumes(self) -> list[dict[str, Any]]:
        """Each volume's entry count and bytes, with its quota (``files`` counts every entry)."""
        out = []
        for name in self.names():
            try:
                used = self.usage(name)
            except VolumeError:
                continue  # removed or replaced by a link since it was listed
            out.append({
                "name": name, "files": used.files, "bytes": used.bytes,
                "quota_bytes": self.quota.max_bytes, "max_files": self.quota.max_files,
            })  # fmt: skip
        return out

    def delete_volume(self, name: str) -> None:
        self.check_name(name)
        root = self._root_fd(create=False)
        if root is None:
            raise VolumeNotFound(f"no volume {name!r}")
        with closing_fd(root):
            try:
                st = os.stat(name, dir_fd=root, follow_symlinks=False)
            except FileNotFoundError:
                raise VolumeNotFound(f"no volume {name!r}") from None
            if not stat.S_ISDIR(st.st_mode):
                raise VolumeError(f"volume {name!r} is not a folder: refusing to delete through it")
            # rmtree with dir_fd opens every folder with O_NOFOLLOW and checks it is the one it
            # lstat'ed, so links are removed, never their targets, even if swapped in meanwhile.
            shutil.rmtree(name, dir_fd=root)

    def enforce_quota(self, name: str, since: float) -> str | None:
        """After a sandbox step started at ``since``: trim what it wrote past the quota.

        Returns the message for the model, or None when the volume is within its quota.
        """
        try:
            vol = self._volume_fd(name)
        except VolumeError:
            return None
        with closing_fd(vol):
            return trim(vol, f"volume {name}", self._contents(vol), self.quota, since)

    # -- files ----------------------------------------------------------------------------------

    def stat(self, name: str, path: str) -> dict[str, Any]:
        """The listing row of one entry (an lstat: a link is reported as ``link``, not followed)."""
        parts = path_parts(name, path)
        with self._folder(name, parts[:-1]) as parent:
            if not parts:
                return _entry(Found.of((), os.fstat(parent)))
            try:
                return _entry(Found.of(tuple(parts), os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)))
            except FileNotFoundError:
                raise VolumeNotFound(f"no file {'/'.join(parts)!r} {_where(name)}") from None

    def list_files(self, name: str, path: str = "", recursive: bool = False) -> list[dict[str, Any]]:
        """Entries under ``path`` (relative to the volume), sorted by path; links listed, not followed."""
        parts = path_parts(name, path)
        with self._folder(name, parts) as folder:
            found = scan(folder, tuple(parts), recursive=recursive)
        return sorted((_entry(e) for e in found), key=lambda e: e["path"])

    def open_file(self, name: str, path: str) -> tuple[int, os.stat_result]:
        """An fd (and its fstat) for a regular file of the volume; the caller closes it.

        Links anywhere on the path are refused; pipes, sockets and devices are refused without blocking.
        """
        parts = path_parts(name, path)
        if not parts:
            raise VolumeError(f"the root of volume {name!r} is a folder, not a file")
        with self._folder(name, parts[:-1]) as parent:
            return open_regular(parent, parts[-1], "/".join(parts), _where(name))

    def read(self, name: str, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes (all if None) starting at byte ``offset``."""
        if offset < 0 or (length is not None and length < 0):
            raise VolumeError("offset and length must not be negative")
        fd, _ = self.open_file(name, path)
        with os.fdopen(fd, "rb") as f:
            f.seek(offset)
            return f.read() if length is None else f.read(length)

    def read_text(self, name: str, path: str, offset: int = 0, length: int | None = None) -> str:
        # errors="replace": a byte range may cut a UTF-8 character in half.
        return self.read(name, path, offset, length).decode("utf-8", errors="replace")

    def write(
        self,
        name: str,
        path: str,
        data: bytes | str,
        *,
        roots: tuple[str, ...] | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Any]:
        """Write a whole file (creating the volume and parent folders); return its entry.

        With ``roots``, the path must lie under one of those top-level folders
        (e.g. ``("memory", "artifacts")`` for writes coming from a model). A write that would take
        the volume over its quota is refused. With ``expect``, the check and the write hold an exclusive
        lock of the folder (conditional writes of every process, one at a time): a new file is linked into
        place, which fails if anything at all is there by then (never following a link); an overwrite
        goes ahead only while the file's content has the expected sha256.
        """
        parts = write_parts(name, path, roots)
        rel = "/".join(parts)
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        with closing_fd(self._volume_fd(name, create=True)) as vol:
            self._check_room(vol, name, parts, len(payload))
            with closing_fd(open_dir(vol, parts[:-1], _where(name), create=True)) as parent:
                if expect is None:
                    st = self._replace(parent, parts[-1], payload, rel, name)
                else:
                    fcntl.flock(parent, fcntl.LOCK_EX)  # released when the fd is closed
                    _check_expected(parent, parts[-1], rel, name, expect)
                    if expect.sha256 is None:
                        st = self._create(parent, parts[-1], payload, rel, name)
                    else:
                        st = self._replace(parent, parts[-1], payload, rel, name)
        return _entry(Found.of(tuple(parts), st))

    def _check_room(self, vol: int, name: str, parts: list[str], size: int) -> None:
        """Refuse a write of ``size`` bytes at ``parts`` over a folder or link, or past the quota."""
        contents = self._contents(vol)
        known = {e.parts: e for e in contents}
        old = known.get(tuple(parts))
        if old is not None and old.is_dir:
            raise VolumeError(f"{'/'.join(parts)!r} in volume {name!r} is a folder, not a file")
        if old is not None and kind(old.mode) == "link":  # the rename would replace it, never follow it
            raise VolumeError(f"{'/'.join(parts)!r} in volume {name!r} is a symbolic link: {LINK_HINT}")
        new_folders = sum(tuple(parts[:i]) not in known for i in range(2, len(parts)))
        used = measure(contents)
        after = Usage(
            used.files + new_folders + (old is None),
            used.bytes + size - (old.size if old is not None and old.is_file else 0),
        )
        if not after.within(self.quota):
            raise VolumeError(
                f"writing {human(size)} to {'/'.join(parts)!r} refused: "
                + over_message(f"volume {name}", after, self.quota, verb="would be")
                + ". Delete files from the volume or raise the limit."
            )

    @staticmethod
    def _replace(parent: int, final: str, payload: bytes, rel: str, name: str) -> os.stat_result:
        """Write a temp file beside ``final`` and rename it over, so readers never see half a file.

        The rename replaces whatever is at ``final`` (a link is replaced, not followed).
        """
        tmp, st = _temp_file(parent, payload)
        try:
            os.replace(tmp, final, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            if isinstance(exc, IsADirectoryError):
                raise VolumeError(f"{rel!r} in volume {name!r} is a folder, not a file") from None
            raise
        return st

    @staticmethod
    def _create(parent: int, final: str, payload: bytes, rel: str, name: str) -> os.stat_result:
        """Write a temp file beside ``final`` and hard-link it there: the link fails if anything is at
        ``final`` (like ``O_EXCL``, a link there is not followed), and readers never see half a file."""
        tmp, st = _temp_file(parent, payload)
        try:
            os.link(tmp, final, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
        except FileExistsError:
            raise VolumeChanged(f"{rel!r} in volume {name!r} changed: it exists now") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            # A file system without hard links: create it in place, still refusing anything already there.
            try:
                fd = os.open(final, CREATE_FLAGS, FILE_MODE, dir_fd=parent)
            except FileExistsError:
                raise VolumeChanged(f"{rel!r} in volume {name!r} changed: it exists now") from None
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                st = os.fstat(f.fileno())
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
        return st

    def delete(self, name: str, path: str) -> None:
        """Delete a file, link or empty folder (never the volume root or a durable root).

        A link is removed itself; its target is never touched.
        """
        parts = delete_parts(name, path)
        rel, final = "/".join(parts), parts[-1]
        with self._folder(name, parts[:-1]) as parent:
            try:
                if stat.S_ISDIR(os.stat(final, dir_fd=parent, follow_symlinks=False).st_mode):
                    os.rmdir(final, dir_fd=parent)
                else:
                    os.unlink(final, dir_fd=parent)
            except FileNotFoundError:
                raise VolumeNotFound(f"no file {rel!r} in volume {name!r}") from None
            except OSError as exc:
                raise _delete_error(exc, rel, name) from None


def _temp_file(parent: int, payload: bytes) -> tuple[str, os.stat_result]:
    """A new file (``O_EXCL``, mode 0600) in the folder ``parent`` holding ``payload``: its name and fstat."""
    tmp = f".fleet-write-{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, CREATE_FLAGS, FILE_MODE, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            return tmp, os.fstat(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise


def _check_expected(parent: int, final: str, rel: str, name: str, expect: Expect) -> None:
    """``VolumeChanged`` unless ``final`` in ``parent`` is as ``expect`` says: absent, or a regular file
    with that content (opened without following a link, a pipe refused without blocking)."""
    if expect.sha256 is None:
        try:
            os.stat(final, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        raise VolumeChanged(f"{rel!r} in volume {name!r} changed: it exists now")
    try:
        fd, _ = open_regular(parent, final, rel, _where(name))
    except VolumeError:
        raise VolumeChanged(f"{rel!r} in volume {name!r} changed: it is not the file expected") from None
    with os.fdopen(fd, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != expect.sha256:
        raise VolumeChanged(f"{rel!r} in volume {name!r} changed: its content is not the one expected")


def _delete_error(exc: OSError, rel: str, name: str) -> VolumeError:
    if exc.errno == errno.ENOTEMPTY:
        return VolumeError(f"folder {rel!r} in volume {name!r} is not empty")
    if exc.errno in (errno.EISDIR, errno.ENOTDIR):
        return VolumeError(f"{rel!r} in volume {name!r} changed while it was being deleted; try again")
    return VolumeError(f"cannot delete {rel!r} in volume {name!r}: {exc.strerror}")


register_volumes("local", LocalVolumes.from_settings)
