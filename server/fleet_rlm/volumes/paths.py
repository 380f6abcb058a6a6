"""Volume names and volume-relative paths, checked the same way by every volume store.

A path inside a volume is a relative POSIX path; absolute paths, ``..``, NUL and names longer than
file systems take are refused with ``VolumeError`` before any store touches anything. The checked
path comes back as its segments (``""`` and ``.`` dropped), which is all a store ever uses.
"""

from __future__ import annotations

import os
import re

from fleet_rlm.volumes.safepath import VolumeError

DURABLE_ROOTS = ("memory", "artifacts", "buffers", "meta")
MAX_NAME_BYTES = 255  # NAME_MAX of Linux and macOS file systems: a longer name fails with ENAMETOOLONG
# Below PATH_MAX (4,096), leaving room for the folder the volume is mounted at: the sandbox, and Daytona's
# file API, open a volume's files by absolute path.
MAX_PATH_BYTES = 3072
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_REF = re.compile(r"(?:vol:(?://)?|volume://)([^/]+)(?:/(.*))?", re.DOTALL)


def is_volume_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def check_volume_name(name: str) -> None:
    """``VolumeError`` unless ``name`` is 1-64 letters, digits, ``_``, ``.`` or ``-``, a letter or digit first."""
    if not isinstance(name, str) or not is_volume_name(name):
        raise VolumeError(
            f"invalid volume name {name!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )


def parse_volume_ref(s: str) -> tuple[str, str] | None:
    """``"vol:notes/memory/a.md"`` or ``"volume://notes/memory/a.md"`` -> ``("notes", "memory/a.md")``.

    Returns None if ``s`` is not a volume reference with a valid volume name.
    The path part is returned as written; the store checks it on use.
    """
    m = _REF.fullmatch(s.strip())
    if not m or not is_volume_name(m.group(1)):
        return None
    return m.group(1), m.group(2) or ""


def volume_uri(name: str, path: str = "") -> str:
    """The inverse of ``parse_volume_ref``: ``vol:name/path``."""
    return f"vol:{name}/{path.lstrip('/')}" if path else f"vol:{name}"


def path_parts(name: str, path: str) -> list[str]:
    """The segments of ``path`` inside volume ``name`` ([] for the volume itself); refused if it could leave it."""
    if not isinstance(path, str):
        raise VolumeError(f"path must be a string, not {type(path).__name__}")
    if "\x00" in path:
        raise VolumeError(f"path {path!r} contains a NUL byte")
    if path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", path):
        raise VolumeError(f"path {path!r} is absolute; use a path inside volume {name!r}")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise VolumeError(f"path {path!r} escapes volume {name!r}")
    _check_length(parts)
    return parts


def write_parts(name: str, path: str, roots: tuple[str, ...] | None) -> list[str]:
    """``path_parts`` of a file that may be written: not the volume itself, and under one of ``roots`` if given."""
    parts = path_parts(name, path)
    if not parts:
        raise VolumeError(f"cannot write to the root of volume {name!r}; give a file path")
    if roots is not None and (len(parts) < 2 or parts[0] not in roots):
        allowed = ", ".join(f"{r}/" for r in roots) or "nothing"
        raise VolumeError(f"cannot write {path!r} in volume {name!r}: writes are allowed only under {allowed}")
    return parts


def delete_parts(name: str, path: str) -> list[str]:
    """``path_parts`` of an entry that may be deleted: neither the volume itself nor a durable root."""
    parts = path_parts(name, path)
    if not parts:
        raise VolumeError(f"refusing to delete the root of volume {name!r}; use delete_volume")
    if len(parts) == 1 and parts[0] in DURABLE_ROOTS:
        raise VolumeError(f"refusing to delete durable folder {parts[0]!r} of volume {name!r}")
    return parts


def _check_length(parts: list[str]) -> None:
    """Refuse what the file system would (ENAMETOOLONG) before anything is opened, naming both limits."""
    for part in parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise _too_long(f"the name {_shown(part)!r}", len(os.fsencode(part)))
    size = len(os.fsencode("/".join(parts)))
    if size > MAX_PATH_BYTES:
        raise _too_long("the path", size)


def _too_long(what: str, size: int) -> VolumeError:
    return VolumeError(
        f"{what} is {size:,} bytes, too long for a volume ({MAX_NAME_BYTES} bytes per name,"
        f" {MAX_PATH_BYTES:,} bytes per path): use a shorter one"
    )


def _shown(text: str, chars: int = 40) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"
