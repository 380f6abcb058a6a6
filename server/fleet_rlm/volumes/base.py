"""The volumes seam: what every volume store implements, and the registry that picks one.

A volume is a named tree that outlives runs, with durable roots ``memory/``, ``artifacts/``,
``buffers/`` and ``meta/``, mounted read-write into the sandboxes of the runs that use it. Its store
is the one ``settings.sandbox`` names, so the volumes a face browses are the ones sandboxes mount:
folders on this host for ``local``, Daytona volumes for ``daytona``. Stores register themselves
(``register_volumes``) exactly like a third-party one would; the built-ins are imported on first use,
so importing volumes never imports a cloud SDK.

Contract, for every store: paths are relative POSIX paths inside the volume, checked by
``volumes.paths`` (absolute paths, ``..`` and NUL are ``VolumeError``); a missing volume, file or
folder is ``VolumeNotFound`` (a ``NotFound``); anything else refused or failed is ``VolumeError``
with a message that says why. Links are listed as links and never followed. Entries are dicts
``{"path", "type" (file, dir, link, other), "size" (0 but for files), "mtime"}``. A write given an
``Expect`` happens only over the file it expects (none, for a new file); else ``VolumeChanged``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fleet_rlm.config import ConfigError, sandbox_setting_fix
from fleet_rlm.volumes.quota import Quota, Usage

if TYPE_CHECKING:
    from fleet_rlm.config import Settings


@dataclass(frozen=True)
class Expect:
    """What a conditional write requires at its path, as a person was shown it: nothing at all (``sha256``
    None: a new file), or a regular file whose content has this sha256. Anything else is ``VolumeChanged``."""

    sha256: str | None


@runtime_checkable
class Volumes(Protocol):
    """The named volumes of one store; every method may raise ``VolumeError``."""

    quota: Quota  # limits per volume; replaced when settings change

    def check_name(self, name: str) -> None:
        """Refuse an invalid volume name (``VolumeError``), before anything is looked up."""

    def ensure(self, name: str) -> Path:
        """Create the volume with its durable roots if missing; return ``path(name)``."""

    def path(self, name: str) -> Path:
        """Where sandboxes mount the volume: its host folder for a local store (``VolumeNotFound`` if
        missing), the path inside the sandbox for a remote one (not looked up)."""

    def usage(self, name: str) -> Usage:
        """Entries and bytes in the volume, its durable roots not counted."""

    def names(self) -> list[str]:
        """The volumes' names, sorted."""

    def list_volumes(self) -> list[dict[str, Any]]:
        """``{"name", "files", "bytes", "quota_bytes", "max_files"}`` per volume, sorted by name."""

    def delete_volume(self, name: str) -> None:
        """Delete the volume and everything in it."""

    def enforce_quota(self, name: str, since: float) -> str | None:
        """After a sandbox step started at ``since``: bring the volume back under its quota; the message
        for the model, or None when there is nothing to say (or the store leaves quotas to its host)."""

    def stat(self, name: str, path: str) -> dict[str, Any]:
        """The entry at ``path`` (``""`` is the volume itself)."""

    def list_files(self, name: str, path: str = "", recursive: bool = False) -> list[dict[str, Any]]:
        """Entries under folder ``path``, sorted by path; ``VolumeError`` if it is not a folder."""

    def open_file(self, name: str, path: str) -> tuple[int, os.stat_result]:
        """A readable fd of the regular file at ``path`` and its fstat; the caller closes it."""

    def read(self, name: str, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes (all if None) from byte ``offset`` of a regular file; past the end is ``b""``."""

    def read_text(self, name: str, path: str, offset: int = 0, length: int | None = None) -> str:
        """``read`` decoded as UTF-8, a character cut by the range replaced."""

    def write(
        self,
        name: str,
        path: str,
        data: bytes | str,
        *,
        roots: tuple[str, ...] | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Any]:
        """Replace the whole file at ``path`` (creating the volume and folders); return its entry. With
        ``roots``, the path must lie under one of those top-level folders; with ``expect``, only over that
        file (a new file is created only where nothing is), else ``VolumeChanged`` and nothing written."""

    def delete(self, name: str, path: str) -> None:
        """Delete a file, link or empty folder; never the volume itself or a durable root."""


VolumesFactory = Callable[["Settings"], Volumes]
REGISTRY: dict[str, VolumesFactory] = {}
BUILT_IN = ("local", "daytona")  # modules of this package, imported on first use


def register_volumes(name: str, factory: VolumesFactory) -> None:
    """Make ``factory(settings)`` the store of sandbox backend ``name``."""
    REGISTRY[name] = factory


def volumes_for(settings: Settings) -> Volumes:
    """The volume store of the sandbox ``settings.sandbox`` names; ``ConfigError`` (with the fix) if none."""
    name = settings.sandbox
    if name not in REGISTRY and name in BUILT_IN:
        importlib.import_module(f"fleet_rlm.volumes.{name}")  # registers itself
    if name not in REGISTRY:
        known = ", ".join(sorted({*REGISTRY, *BUILT_IN}))
        raise ConfigError(f"no volumes for sandbox {name!r} in this version (known: {known}): {sandbox_setting_fix()}")
    return REGISTRY[name](settings)
