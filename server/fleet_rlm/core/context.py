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
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_rlm.core.ignore import GitIgnore
from fleet_rlm.core.inputs.documents import KIND_NAMES, Converter, Unconvertible, document_kind, image_type
from fleet_rlm.errors import UserError
from fleet_rlm.volumes import VolumeError, Volumes, parse_volume_ref
from fleet_rlm.volumes.safepath import READ_FLAGS, special_name

SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".tox"}
SNIFF_BYTES = 8192
MAX_FILE_BYTES = 256 * 1024 * 1024  # one file; bigger ones are skipped rather than filling memory
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # one image: what vision models accept, with room
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
    kind: str = "text"  # text, a document kind (pdf, docx ...) or image
    parts: list[dict[str, Any]] = field(default_factory=list)  # pages, slides, sheets: absolute spans
    note: str = ""  # what conversion found ("300 pages"), shown in the report
    mime: str | None = None  # images
    size: int = 0  # bytes of the file (images)
    file: str | None = None  # an image's file in the work folder (relative), once it is put there

    def brief(self) -> dict[str, object]:
        """What the opening prompt shows: the parts counted, not listed (``sources`` has them)."""
        data = self.to_dict()
        if self.parts:
            kinds = {p["kind"] for p in self.parts}
            data["parts"] = f"{len(self.parts)} {kinds.pop() if len(kinds) == 1 else 'part'}(s) with spans"
        return data

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"name": self.name, "start": self.start, "end": self.end}
        if self.kind != "text":
            data["kind"] = self.kind
        if self.parts:
            data["parts"] = self.parts
        if self.mime is not None:
            data |= {"mime": self.mime, "bytes": self.size}
        if self.file is not None:
            data["file"] = self.file
        return data


@dataclass(frozen=True)
class ImageSource:
    """An image of the context: kept host-side (a copy in the run's scratch folder, which no sandbox
    can write), listed in ``sources`` and sent to a vision model by its name."""

    name: str
    path: Path
    mime: str
    size: int


@dataclass
class StagedContext:
    path: Path
    length: int
    sources: list[Source]
    skipped: list[str] = field(default_factory=list)  # "name: reason", files that could not be read
    excluded: list[str] = field(default_factory=list)  # hidden, SKIP_DIRS and .gitignore'd paths
    images: list[ImageSource] = field(default_factory=list)
    converted: int = 0  # documents parsed in this staging
    cache_hits: int = 0  # documents whose text came from the conversion cache

    def counts(self) -> dict[str, int]:
        """What went in, counted for every face: documents, their pages, images, cache hits, skipped."""
        documents = [s for s in self.sources if s.kind not in ("text", "image")]
        pages = sum(1 for s in documents for p in s.parts if p["kind"] == "page")
        return {
            "documents": len(documents),
            "pages": pages,
            "images": len(self.images),
            "cached": self.cache_hits,
            "skipped_count": len(self.skipped),
        }

    def report(self) -> str:
        documents = [s for s in self.sources if s.kind not in ("text", "image")]
        lines = [f"{len(self.sources)} source(s), {self.length:,} characters"]
        if documents or self.images:
            cached = f", {self.cache_hits} from the cache" if self.cache_hits else ""
            lines[0] += f"; {len(documents)} document(s) converted{cached}, {len(self.images)} image(s)"
        lines += [f"  {s.name}: {_described(s)}" for s in self.sources[:50]]
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


def _described(source: Source) -> str:
    if source.kind == "image":
        return f"image ({source.mime}, {source.size:,} bytes)"
    chars = f"{source.end - source.start:,} chars"
    if source.kind not in KIND_NAMES:
        return chars
    return f"{chars} ({KIND_NAMES[source.kind]}{', ' + source.note if source.note else ''})"


@dataclass
class _File:
    """A file to read: its display name and how to get an fd of it (a regular file) and its fstat."""

    name: str
    open: Callable[[], tuple[int, os.stat_result]]
    kind_name: str = ""  # the file's own name where ``name`` is another (a URL): its suffix tells the kind


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


@dataclass
class _Read:
    """What one file gave: text (maybe converted) or an image's bytes."""

    text: str = ""
    kind: str = "text"
    parts: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    image: bytes | None = None
    mime: str | None = None


def _read_bytes(item: _File, max_bytes: int) -> tuple[bytes, bytes]:
    """The file's first bytes and all of them, or ``_Skip`` if too large or changed while being read."""
    fd, before = item.open()
    with os.fdopen(fd, "rb") as fh:
        if before.st_size > max_bytes:
            raise _Skip(f"too large ({before.st_size:,} bytes; the limit is {max_bytes:,})")
        head = fh.read(SNIFF_BYTES)
        data = head + fh.read(max_bytes + 1 - len(head))
        after = os.fstat(fh.fileno())
    if len(data) > max_bytes:
        raise _Skip(f"too large (grew past {max_bytes:,} bytes while being read)")
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or len(data) != after.st_size:
        raise _Skip("changed while being read")
    return head, data


def _read(item: _File, max_bytes: int, converter: Converter | None) -> _Read:
    """The file's text (a document's converted), an image, or ``_Skip`` with the reason."""
    head, data = _read_bytes(item, max_bytes)
    kind = document_kind(item.kind_name or item.name, head) if converter is not None else None
    if kind is not None:
        assert converter is not None
        try:
            done = converter.convert(kind, data)
        except Unconvertible as exc:
            raise _Skip(str(exc)) from None
        return _Read(done.text, kind, done.parts, done.note)
    mime = image_type(head)
    if mime is not None:
        if len(data) > MAX_IMAGE_BYTES:
            raise _Skip(f"an image too large ({len(data):,} bytes; the limit is {MAX_IMAGE_BYTES:,})")
        return _Read(kind="image", image=data, mime=mime)
    if b"\0" in head:
        raise _Skip("binary")
    return _Read(data.decode("utf-8", errors="replace"))


def _sniff_text(item: _File, max_bytes: int) -> bool:
    """Would staging keep this file (text, a document or an image)? Its first bytes say so."""
    try:
        fd, st = item.open()
    except _Skip:
        return False
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if st.st_size > max_bytes:
        return False
    kind = document_kind(item.kind_name or item.name, head)
    return b"\0" not in head or kind is not None or image_type(head) is not None


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
    converter: Converter | None = None,
    named: list[tuple[str, Path]] | None = None,
) -> StagedContext:
    """Write every source into ``dest`` (UTF-8) and return where each one landed.

    With ``roots``, host files (after following links) must lie under one of them; volume
    sources are not host paths and are not confined by it. ``include_hidden`` reads hidden
    entries, ``SKIP_DIRS`` and ``.gitignore``'d paths too. With a ``converter``, documents become
    text and images are kept (copied beside ``dest``); without one they are skipped as binary.
    ``named`` are host-owned files or folders shown under another name (a fetched page by its URL,
    a cloned repository by its URL and ref)."""
    found = _Found()
    for spec in paths or []:
        one = _expand(spec, volumes, roots, include_hidden)
        found.files += one.files
        found.skipped += one.skipped
        found.excluded += one.excluded
    for display, path in named or []:
        one = _expand(str(path), None, None, include_hidden)
        prefix = str(path).rstrip("/")
        for file in one.files:
            file.kind_name, file.name = file.name, display + file.name[len(prefix) :]
        found.files += one.files
        found.skipped += [display + line[len(prefix) :] for line in one.skipped]
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
    images: list[ImageSource] = []
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        for name, item in entries:
            read = _Read(item) if isinstance(item, str) else None
            if isinstance(item, _File):
                try:
                    read = _read(item, max_file_bytes, converter)
                except _Skip as exc:
                    skipped.append(f"{name}: {exc}")
                    continue
            assert read is not None
            if read.image is not None:
                images.append(_keep_image(dest.parent, len(images), name, read))
                sources.append(Source(name, offset, offset, "image", mime=read.mime, size=len(read.image)))
                continue
            text = read.text
            if not single:  # one source needs no header
                header = f"===== {name} ({len(text):,} chars) =====\n"
                out.write(header)
                offset += len(header)
            out.write(text)
            parts = [{**p, "start": p["start"] + offset, "end": p["end"] + offset} for p in read.parts]
            sources.append(Source(name, offset, offset + len(text), read.kind, parts, read.note))
            offset += len(text)
            if not single:
                out.write("\n\n")
                offset += 2
    if (paths or texts or named) and not sources:
        reasons = "; ".join(skipped[:5]) or "nothing to read"
        raise ContextError(f"no text found in the given context: every file was skipped ({reasons})")
    staged = StagedContext(dest, offset, sources, skipped, found.excluded, images)
    if converter is not None:
        staged.converted, staged.cache_hits = converter.converted, converter.cache_hits
    return staged


def image_file_name(name: str) -> str:
    """An image's file name in the work folder: its own, made safe (no folders, no odd characters)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", name.rsplit("/", 1)[-1]).strip("._") or "image"
    return base[-100:]


def _keep_image(folder: Path, index: int, name: str, read: _Read) -> ImageSource:
    """A host-only copy of an image, in the staging's own folder (the run's scratch)."""
    assert read.image is not None and read.mime is not None
    path = folder / "images" / f"{index}.{read.mime.rsplit('/', 1)[1]}"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(read.image)
    return ImageSource(name, path, read.mime, len(read.image))


def preview(path: Path, length: int, chars: int = 500) -> str:
    """Head and tail of a staged context without reading all of it."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        if length <= 2 * chars:
            return fh.read()
        head = fh.read(chars)
        fh.seek(max(0, path.stat().st_size - 4 * chars))
        tail = fh.read()[-chars:]
    return f"{head}\n... [{length - 2 * chars:,} characters not shown] ...\n{tail}"
