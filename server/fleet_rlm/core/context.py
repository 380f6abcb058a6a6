"""Context sources: files, folders, pasted text and volume paths, staged into one text file.

The REPL's ``context`` is the concatenation of the sources, each after a one-line header;
``sources`` gives each one's character span so code can slice a single document out. The
staged file reaches the sandbox through the file system, never through the protocol pipe.

Real folders hold dangling links, pipes, sockets, unreadable files, files that change while
read, non-UTF-8 text and huge binaries. None of them fails or hangs a run: each is skipped with a
line in the report. Files are opened with ``O_NONBLOCK`` and only read when ``fstat`` on the open
fd says they are regular; a NUL byte in the first 8 KB marks a binary; a file whose size or mtime
moved while it was read is dropped; text is decoded as UTF-8 with replacement characters. Hidden
entries, ``SKIP_DIRS`` and, in a git work tree, ``.gitignore``'d paths are left out unless
``include_hidden``. Host paths may be links where the user named them and for files inside a
folder (confined by ``roots``); links to folders are not followed. ``vol:`` sources go through
``LocalVolumes``, which never follows a link and never opens anything but a regular file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet_rlm.core.ignore import GitIgnore
from fleet_rlm.errors import UserError
from fleet_rlm.volumes import VolumeError, Volumes, parse_volume_ref
from fleet_rlm.volumes.safepath import READ_FLAGS, special_name

SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".tox"}
SNIFF_BYTES = 8192
MAX_FILE_BYTES = 256 * 1024 * 1024  # one file; bigger ones are skipped rather than filling memory
SHOWN = 20  # report lines per list


class ContextError(UserError):
    """A context source cannot be used; the message names it and says why."""


class _Skip(Exception):
    """This file is left out; the message is the reason shown in the report."""


@dataclass
class Source:
    name: str
    start: int = 0
    end: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "start": self.start, "end": self.end}


@dataclass
class StagedContext:
    path: Path
    length: int
    sources: list[Source]
    skipped: list[str] = field(default_factory=list)  # "name: reason", files that could not be read
    excluded: list[str] = field(default_factory=list)  # hidden, SKIP_DIRS and .gitignore'd paths

    def report(self) -> str:
        lines = [f"{len(self.sources)} source(s), {self.length:,} characters"]
        lines += [f"  {s.name}: {s.end - s.start:,} chars" for s in self.sources[:50]]
        if len(self.sources) > 50:
            lines.append(f"  … and {len(self.sources) - 50} more")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} file(s):")
            lines += [f"  {s}" for s in self.skipped[:SHOWN]]
            lines += [f"  … and {len(self.skipped) - SHOWN} more"] if len(self.skipped) > SHOWN else []
        if self.excluded:
            shown = ", ".join(self.excluded[:SHOWN]) + (" …" if len(self.excluded) > SHOWN else "")
            lines.append(f"left out {len(self.excluded)} hidden or ignored path(s) (ask to include them): {shown}")
        return "\n".join(lines)


@dataclass
class _File:
    """A file to read: its display name and how to get an fd of it (a regular file) and its fstat."""

    name: str
    open: Callable[[], tuple[int, os.stat_result]]


@dataclass
class _Found:
    files: list[_File] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)


def _hidden(name: str, is_dir: bool) -> bool:
    """Left out unless hidden entries are asked for: dot names and tool folders (SKIP_DIRS)."""
    return name.startswith(".") or (is_dir and name in SKIP_DIRS)


# -- host files ---------------------------------------------------------------------------------


def _open_host(path: Path, roots: list[Path] | None) -> tuple[int, os.stat_result]:
    """Open a host file for reading, never blocking; only a regular file under ``roots`` passes."""
    real = Path(os.path.realpath(path))
    if roots is not None and not any(real.is_relative_to(r) for r in roots):
        raise _Skip("outside FLEET_CONTEXT_ROOTS")
    try:
        # realpath left no link to follow; O_NOFOLLOW refuses one swapped in since.
        fd = os.open(real, READ_FLAGS)
    except FileNotFoundError:
        raise _Skip("vanished or a dangling link") from None
    except PermissionError:
        raise _Skip("unreadable (permission denied)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Skip("changed while being read (became a link)") from None
        if exc.errno == errno.ENXIO:
            raise _Skip("a socket, not a regular file") from None
        raise _Skip(f"cannot open it ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _Skip("a folder" if stat.S_ISDIR(st.st_mode) else f"{special_name(st.st_mode)}, not a regular file")
    return fd, st


def _read_small(path: Path) -> str | None:
    """A small host text file (a .gitignore), or None; never blocks, never fails."""
    try:
        fd, _ = _open_host(path, None)
    except _Skip:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(1024 * 1024).decode("utf-8", errors="replace")


def _candidate(found: _Found, name: str, path: Path, mode: int, roots: list[Path] | None) -> None:
    """Queue a host entry (lstat'ed as ``mode``) for reading, or record why it is skipped."""
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            found.skipped.append(f"{name}: dangling link")
            return
        if stat.S_ISDIR(mode):
            found.skipped.append(f"{name}: link to a folder (not followed)")
            return
    if not stat.S_ISREG(mode):
        found.skipped.append(f"{name}: {special_name(mode)}, not a regular file")
        return
    found.files.append(_File(name, lambda: _open_host(path, roots)))


def _walk_host(top: Path, spec: str, roots: list[Path] | None, include_hidden: bool, found: _Found) -> None:
    """Every readable candidate under ``top`` (pre-order, sorted), without following folder links."""
    ignore = None if include_hidden else GitIgnore.find(top, _read_small)
    prefix = spec.rstrip("/")
    stack = [(top, "")]
    while stack:
        folder, rel = stack.pop()
        if ignore is not None:
            ignore.enter(folder, rel)
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            found.skipped.append(f"{prefix}/{rel}/: unreadable folder ({exc.strerror})")
            continue
        subfolders = []
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue  # vanished since the listing
            is_dir = stat.S_ISDIR(mode)
            if not include_hidden and (_hidden(entry.name, is_dir) or (ignore and ignore.ignored(child, is_dir))):
                found.excluded.append(child + ("/" if is_dir else ""))
            elif is_dir:
                subfolders.append((Path(entry.path), child))
            else:
                _candidate(found, f"{prefix}/{child}", Path(entry.path), mode, roots)
        stack.extend(reversed(subfolders))


# -- volume files -------------------------------------------------------------------------------


def _volume_files(spec: str, name: str, inner: str, volumes: Volumes, include_hidden: bool, found: _Found) -> None:
    """Candidates from a volume, through its fd-relative API: links and special files are skipped."""
    try:
        top = volumes.stat(name, inner)
        rows = volumes.list_files(name, inner, recursive=True) if top["type"] == "dir" else [top]
    except VolumeError as exc:
        raise ContextError(f"{spec}: {exc}") from None
    depth = len(top["path"].split("/")) if top["path"] else 0  # what the user named is never hidden
    for row in rows:
        display = f"vol:{name}/{row['path']}"
        below = row["path"].split("/")[depth:]
        flags = [_hidden(p, i < len(below) - 1 or row["type"] == "dir") for i, p in enumerate(below)]
        if any(flags) and not include_hidden:
            if flags.index(True) == len(below) - 1:  # report the hidden entry itself, not all it holds
                found.excluded.append(display + ("/" if row["type"] == "dir" else ""))
            continue
        if row["type"] == "link":
            found.skipped.append(f"{display}: symbolic link (links in volumes are never followed)")
        elif row["type"] == "other":
            found.skipped.append(f"{display}: a pipe, socket or device, not a regular file")
        elif row["type"] == "file":
            found.files.append(_File(display, _volume_opener(volumes, name, row["path"])))


def _volume_opener(volumes: Volumes, name: str, path: str) -> Callable[[], tuple[int, os.stat_result]]:
    def open_() -> tuple[int, os.stat_result]:
        try:
            return volumes.open_file(name, path)
        except VolumeError as exc:  # changed since it was listed
            raise _Skip(str(exc)) from None

    return open_


# -- staging ------------------------------------------------------------------------------------


def _expand(spec: str, volumes: Volumes | None, roots: list[Path] | None, include_hidden: bool) -> _Found:
    """The candidates (and what was skipped or left out) for one --context argument."""
    found = _Found()
    ref = parse_volume_ref(spec)
    if ref is not None:
        if volumes is None:
            raise ContextError(f"{spec}: volumes are not available here")
        _volume_files(spec, *ref, volumes, include_hidden, found)
        return found
    target = Path(spec).expanduser()
    try:
        mode = os.stat(target).st_mode  # the user named it: a link here is followed
    except FileNotFoundError:
        raise ContextError(f"{spec}: no such file or folder") from None
    except OSError as exc:
        raise ContextError(f"{spec}: cannot use it ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        _walk_host(target, spec, roots, include_hidden, found)
        if not found.files and not found.skipped:
            hint = f" ({len(found.excluded)} hidden or ignored: include hidden files to read them)"
            raise ContextError(f"{spec}: the folder holds no files{hint if found.excluded else ''}")
    else:
        _candidate(found, spec, target, mode, roots)
    return found


def _read_text(item: _File, max_bytes: int) -> str:
    """The file's text, or ``_Skip`` if it is binary, too large, or changed while being read."""
    fd, before = item.open()
    with os.fdopen(fd, "rb") as fh:
        if before.st_size > max_bytes:
            raise _Skip(f"too large ({before.st_size:,} bytes; the limit is {max_bytes:,})")
        head = fh.read(SNIFF_BYTES)
        if b"\0" in head:
            raise _Skip("binary")
        data = head + fh.read(max_bytes + 1 - len(head))
        after = os.fstat(fh.fileno())
    if len(data) > max_bytes:
        raise _Skip(f"too large (grew past {max_bytes:,} bytes while being read)")
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or len(data) != after.st_size:
        raise _Skip("changed while being read")
    return data.decode("utf-8", errors="replace")


def _sniff_text(item: _File, max_bytes: int) -> bool:
    """Would staging keep this file? Its first bytes say so without reading the rest."""
    try:
        fd, st = item.open()
    except _Skip:
        return False
    with os.fdopen(fd, "rb") as fh:
        return st.st_size <= max_bytes and b"\0" not in fh.read(SNIFF_BYTES)


def check_host_paths(
    paths: list[str], roots: list[Path] | None, include_hidden: bool = False, max_file_bytes: int = MAX_FILE_BYTES
) -> None:
    """Refuse, before a run exists, host paths that would stage no text at all (a folder of only
    binaries, an empty folder, a lone unreadable file): the same ``ContextError`` staging raises.
    Stops at the first file that looks like text, so a good folder costs one listing and one read."""
    skipped: list[str] = []
    for spec in paths:
        found = _expand(spec, None, roots, include_hidden)
        if any(_sniff_text(item, max_file_bytes) for item in found.files):
            return
        skipped += found.skipped + [f"{f.name}: binary, too large or unreadable" for f in found.files]
    reasons = "; ".join(skipped[:5]) or "nothing to read"
    raise ContextError(f"no text found in the given context: every file was skipped ({reasons})")


def stage_context(
    dest: Path,
    *,
    paths: list[str] | None = None,
    texts: list[str] | None = None,
    volumes: Volumes | None = None,
    roots: list[Path] | None = None,
    include_hidden: bool = False,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> StagedContext:
    """Write every source into ``dest`` (UTF-8) and return where each one landed.

    With ``roots``, host files (after following links) must lie under one of them; volume
    sources are not host paths and are not confined by it. ``include_hidden`` reads hidden
    entries, ``SKIP_DIRS`` and ``.gitignore``'d paths too."""
    found = _Found()
    for spec in paths or []:
        one = _expand(spec, volumes, roots, include_hidden)
        found.files += one.files
        found.skipped += one.skipped
        found.excluded += one.excluded
    entries: list[tuple[str, _File | str]] = [(f.name, f) for f in found.files]
    entries += [(f"text-{i}" if len(texts or []) > 1 else "text", t) for i, t in enumerate(texts or [], 1)]
    sources: list[Source] = []
    skipped = found.skipped
    offset = 0
    single = len(entries) == 1
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ContextError(f"cannot stage the context: {dest} is not a regular file")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        for name, item in entries:
            if isinstance(item, _File):
                try:
                    text = _read_text(item, max_file_bytes)
                except _Skip as exc:
                    skipped.append(f"{name}: {exc}")
                    continue
            else:
                text = item
            if not single:  # one source needs no header
                header = f"===== {name} ({len(text):,} chars) =====\n"
                out.write(header)
                offset += len(header)
            out.write(text)
            sources.append(Source(name, offset, offset + len(text)))
            offset += len(text)
            if not single:
                out.write("\n\n")
                offset += 2
    if (paths or texts) and not sources:
        reasons = "; ".join(skipped[:5]) or "nothing to read"
        raise ContextError(f"no text found in the given context: every file was skipped ({reasons})")
    return StagedContext(dest, offset, sources, skipped, found.excluded)


def preview(path: Path, length: int, chars: int = 500) -> str:
    """Head and tail of a staged context without reading all of it."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        if length <= 2 * chars:
            return fh.read()
        head = fh.read(chars)
        fh.seek(max(0, path.stat().st_size - 4 * chars))
        tail = fh.read()[-chars:]
    return f"{head}\n... [{length - 2 * chars:,} characters not shown] ...\n{tail}"
