"""Local volumes: named folders that outlive runs.

A volume is ``root/<name>/`` with durable roots ``memory/``, ``artifacts/``,
``buffers/`` and ``meta/``. Paths inside a volume are relative POSIX paths;
anything that could reach outside the volume (absolute paths, ``..``, NUL,
symlinks pointing out) is refused with a ``VolumeError``.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

DURABLE_ROOTS = ("memory", "artifacts", "buffers", "meta")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_REF = re.compile(r"(?:vol:(?://)?|volume://)([^/]+)(?:/(.*))?", re.DOTALL)


class VolumeError(Exception):
    """A volume operation was refused or failed; the message says why."""


def parse_volume_ref(s: str) -> tuple[str, str] | None:
    """``"vol:notes/memory/a.md"`` or ``"volume://notes/memory/a.md"`` -> ``("notes", "memory/a.md")``.

    Returns None if ``s`` is not a volume reference with a valid volume name.
    The path part is returned as written; ``LocalVolumes`` validates it on use.
    """
    m = _REF.fullmatch(s.strip())
    if not m or not _NAME.fullmatch(m.group(1)):
        return None
    return m.group(1), m.group(2) or ""


def volume_uri(name: str, path: str = "") -> str:
    """The inverse of ``parse_volume_ref``: ``vol:name/path``."""
    return f"vol:{name}/{path.lstrip('/')}" if path else f"vol:{name}"


def _entry(rel: str, st: os.stat_result) -> dict[str, Any]:
    is_dir = stat.S_ISDIR(st.st_mode)
    return {
        "path": rel,
        "type": "dir" if is_dir else "file",
        "size": 0 if is_dir else st.st_size,
        "mtime": st.st_mtime,
    }


class LocalVolumes:
    """Volumes stored as folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- names and paths ------------------------------------------------------

    def _volume_dir(self, name: str, *, must_exist: bool = True) -> Path:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise VolumeError(
                f"invalid volume name {name!r}: use 1-64 letters, digits, '_', '.' or '-',"
                " starting with a letter or digit"
            )
        vol = self.root / name
        if must_exist and not vol.is_dir():
            raise VolumeError(f"no volume {name!r}")
        return vol

    @staticmethod
    def _parts(name: str, path: str) -> list[str]:
        """Validate a volume-relative path and split it into segments."""
        if not isinstance(path, str):
            raise VolumeError(f"path must be a string, not {type(path).__name__}")
        if "\x00" in path:
            raise VolumeError(f"path {path!r} contains a NUL byte")
        if path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", path):
            raise VolumeError(f"path {path!r} is absolute; use a path inside volume {name!r}")
        parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise VolumeError(f"path {path!r} escapes volume {name!r}")
        return parts

    def _resolve(self, name: str, path: str, *, follow_final: bool = True) -> tuple[Path, str]:
        """Return (absolute path, normalised relative path), refusing escapes.

        ``follow_final=False`` resolves only the parent, so a symlink itself
        (rather than its target) can be deleted.
        """
        vol = self._volume_dir(name)
        parts = self._parts(name, path)
        rel = "/".join(parts)
        base = vol.resolve()
        target = vol.joinpath(*parts)
        resolved = target.resolve() if follow_final or not parts else target.parent.resolve() / parts[-1]
        # resolve() follows every existing symlink, so this also catches links
        # (anywhere along the path) that point outside the volume.
        if not resolved.is_relative_to(base):
            raise VolumeError(f"path {path!r} escapes volume {name!r}")
        return resolved, rel

    def _real_parts(self, name: str, resolved: Path) -> tuple[str, ...]:
        """Segments of an already-resolved path, relative to the volume's real folder."""
        return resolved.relative_to(self._volume_dir(name).resolve()).parts

    # -- volumes --------------------------------------------------------------

    def ensure(self, name: str) -> Path:
        """Create the volume (and its durable roots) if missing; return its folder."""
        vol = self._volume_dir(name, must_exist=False)
        for sub in DURABLE_ROOTS:
            (vol / sub).mkdir(parents=True, exist_ok=True)
        return vol

    def path(self, name: str) -> Path:
        return self._volume_dir(name)

    def resolve(self, name: str, path: str) -> Path:
        """The host path of ``path`` inside volume ``name``; refuses anything that escapes it."""
        return self._resolve(name, path)[0]

    def list_volumes(self) -> list[dict[str, Any]]:
        if not self.root.is_dir():
            return []
        out = []
        for child in sorted(self.root.iterdir()):
            if not (_NAME.fullmatch(child.name) and child.is_dir() and not child.is_symlink()):
                continue
            files = size = 0
            for dirpath, _dirs, filenames in os.walk(child):  # does not follow symlinks
                for fn in filenames:
                    st = os.lstat(os.path.join(dirpath, fn))
                    if stat.S_ISREG(st.st_mode):
                        files += 1
                        size += st.st_size
            out.append({"name": child.name, "files": files, "bytes": size})
        return out

    def delete_volume(self, name: str) -> None:
        vol = self._volume_dir(name)
        shutil.rmtree(vol)  # removes symlinks themselves, never their targets

    # -- files ----------------------------------------------------------------

    def list_files(self, name: str, path: str = "", recursive: bool = False) -> list[dict[str, Any]]:
        """Entries under ``path`` (relative to the volume), sorted by path."""
        target, rel = self._resolve(name, path)
        if not target.exists():
            raise VolumeError(f"no folder {rel!r} in volume {name!r}")
        if not target.is_dir():
            raise VolumeError(f"{rel!r} in volume {name!r} is a file, not a folder")
        base = self._volume_dir(name).resolve()
        out = []
        stack = [(target, rel)]
        while stack:
            folder, folder_rel = stack.pop()
            for child in folder.iterdir():
                child_rel = f"{folder_rel}/{child.name}" if folder_rel else child.name
                try:
                    real = child.resolve()
                    st = real.stat()
                except OSError:
                    continue  # dangling symlink
                if not real.is_relative_to(base):
                    continue  # symlink pointing outside: not part of the volume
                out.append(_entry(child_rel, st))
                if recursive and stat.S_ISDIR(st.st_mode) and not child.is_symlink():
                    stack.append((child, child_rel))
        return sorted(out, key=lambda e: e["path"])

    def read(self, name: str, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes (all if None) starting at byte ``offset``."""
        if offset < 0 or (length is not None and length < 0):
            raise VolumeError("offset and length must not be negative")
        target, rel = self._resolve(name, path)
        if target.is_dir():
            raise VolumeError(f"{rel!r} in volume {name!r} is a folder, not a file")
        try:
            with target.open("rb") as f:
                f.seek(offset)
                return f.read() if length is None else f.read(length)
        except FileNotFoundError:
            raise VolumeError(f"no file {rel!r} in volume {name!r}") from None

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
    ) -> dict[str, Any]:
        """Write a whole file (creating the volume and parent folders); return its entry.

        With ``roots``, the path must lie under one of those top-level folders
        (e.g. ``("memory", "artifacts")`` for writes coming from a model).
        """
        parts = self._parts(name, path)
        if not parts:
            raise VolumeError(f"cannot write to the root of volume {name!r}; give a file path")
        if roots is not None and (len(parts) < 2 or parts[0] not in roots):
            allowed = ", ".join(f"{r}/" for r in roots) or "nothing"
            raise VolumeError(
                f"cannot write {path!r} in volume {name!r}: writes are allowed only under {allowed}"
            )
        self.ensure(name)
        target, rel = self._resolve(name, path)
        # Check roots on the real location too: a symlink under memory/ must
        # not become a way to write into buffers/ or meta/.
        real = self._real_parts(name, target)
        if roots is not None and (len(real) < 2 or real[0] not in roots):
            raise VolumeError(
                f"cannot write {path!r} in volume {name!r}: it leads outside {', '.join(roots)}"
            )
        if target.is_dir():
            raise VolumeError(f"{rel!r} in volume {name!r} is a folder, not a file")
        target.parent.mkdir(parents=True, exist_ok=True)
        # mkdir may have followed a symlinked folder created concurrently: re-check.
        target, rel = self._resolve(name, path)
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        # Write a temp file and rename it, so readers never see half a file.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return _entry(rel, target.stat())

    def delete(self, name: str, path: str) -> None:
        """Delete a file, symlink or empty folder (never the volume root or a durable root)."""
        parts = self._parts(name, path)
        if not parts:
            raise VolumeError(f"refusing to delete the root of volume {name!r}; use delete_volume")
        if len(parts) == 1 and parts[0] in DURABLE_ROOTS:
            raise VolumeError(f"refusing to delete durable folder {parts[0]!r} of volume {name!r}")
        target, rel = self._resolve(name, path, follow_final=False)
        real = self._real_parts(name, target)
        if not real or (len(real) == 1 and real[0] in DURABLE_ROOTS):  # reached via a symlink
            raise VolumeError(f"refusing to delete {path!r}: it is the volume root or a durable folder")
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            try:
                target.rmdir()
            except OSError:
                raise VolumeError(f"folder {rel!r} in volume {name!r} is not empty") from None
        else:
            raise VolumeError(f"no file {rel!r} in volume {name!r}")
