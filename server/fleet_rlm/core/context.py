"""Context sources: files, folders, pasted text and volume paths, staged into one text file.

The REPL's ``context`` is the concatenation of the sources, each after a one-line header;
``sources`` gives each one's character span so code can slice a single document out. The
staged file reaches the sandbox through the file system, never through the protocol pipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fleet_rlm.volumes import LocalVolumes, parse_volume_ref

SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".tox"}
SNIFF_BYTES = 8192


class ContextError(ValueError):
    """A context source cannot be used; the message names it and says why."""


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
    skipped: list[str] = field(default_factory=list)  # "path: reason"

    def report(self) -> str:
        lines = [f"{len(self.sources)} source(s), {self.length:,} characters"]
        lines += [f"  {s.name}: {s.end - s.start:,} chars" for s in self.sources[:50]]
        if len(self.sources) > 50:
            lines.append(f"  … and {len(self.sources) - 50} more")
        lines += [f"  skipped {s}" for s in self.skipped[:20]]
        return "\n".join(lines)


def _is_text(path: Path) -> bool:
    with path.open("rb") as fh:
        return b"\0" not in fh.read(SNIFF_BYTES)


def _walk(root: Path) -> list[Path]:
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
    return files


def _expand(spec: str, volumes: LocalVolumes | None) -> list[tuple[str, Path]]:
    """(display name, file) pairs for one --context argument."""
    ref = parse_volume_ref(spec)
    if ref is not None:
        if volumes is None:
            raise ContextError(f"{spec}: volumes are not available here")
        name, inner = ref
        root = volumes.path(name)
        target = volumes.resolve(name, inner) if inner else root

        def display(f: Path) -> str:
            return f"vol:{name}/{f.relative_to(root)}"
    else:
        target = Path(spec).expanduser()

        def display(f: Path) -> str:
            return spec if f == target else f"{spec.rstrip('/')}/{f.relative_to(target)}"

    if not target.exists():
        raise ContextError(f"{spec}: no such file or folder")
    files = [target] if target.is_file() else _walk(target)
    if not files:
        raise ContextError(f"{spec}: the folder holds no files")
    return [(display(f), f) for f in files]


def stage_context(
    dest: Path,
    *,
    paths: list[str] | None = None,
    texts: list[str] | None = None,
    volumes: LocalVolumes | None = None,
    roots: list[Path] | None = None,
) -> StagedContext:
    """Write every source into ``dest`` (UTF-8) and return where each one landed.

    With ``roots``, host files (after following links) must lie under one of them."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[str, Path | str]] = []
    for spec in paths or []:
        entries.extend(_expand(spec, volumes))
    entries.extend((f"text-{i}" if len(texts or []) > 1 else "text", t) for i, t in enumerate(texts or [], 1))
    sources: list[Source] = []
    skipped: list[str] = []
    offset = 0
    single = len(entries) == 1
    with dest.open("w", encoding="utf-8") as out:
        for name, item in entries:
            if isinstance(item, Path):
                if roots is not None and not any(item.resolve().is_relative_to(r) for r in roots):
                    skipped.append(f"{name}: outside FLEET_CONTEXT_ROOTS")
                    continue
                if not _is_text(item):
                    skipped.append(f"{name}: binary")
                    continue
                text = item.read_text(encoding="utf-8", errors="replace")
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
    if entries and not sources:
        raise ContextError("no text found in the given context (only binary files)")
    return StagedContext(dest, offset, sources, skipped)


def preview(path: Path, length: int, chars: int = 500) -> str:
    """Head and tail of a staged context without reading all of it."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        if length <= 2 * chars:
            return fh.read()
        head = fh.read(chars)
        fh.seek(max(0, path.stat().st_size - 4 * chars))
        tail = fh.read()[-chars:]
    return f"{head}\n... [{length - 2 * chars:,} characters not shown] ...\n{tail}"
