"""Cloning a git repository into a volume's ``buffers/`` for the agent, within limits.

The clone itself is the product's one (``core.inputs.repo``: the fetch policy, git pinned to the checked
address, no redirects, no config, hooks, credentials or submodules, links checked out as plain files,
a size watch). Only regular files are then copied into the volume (links and anything else are skipped,
never followed), through the volume's safe write path, up to ``agent_fetch_max_mb`` in total.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_rlm.core.inputs.repo import clone as clone_repo
from fleet_rlm.core.inputs.repo import git_available

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.core.volume_operations import VolumeOperations

__all__ = ["Copied", "add_repo", "clone", "copy_tree", "git_available"]
MAX_FILES = 5000


@dataclass
class Copied:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


async def clone(url: str, ref: str | None, settings: Settings, into: Path) -> Path:
    """Clone ``url`` at ``ref`` under ``into`` within the agent's size limit; the work tree."""
    return await clone_repo(
        url, ref, settings, into, max_mb=settings.agent_fetch_max_mb, limit_setting="agent_fetch_max_mb"
    )


def copy_tree(work: Path, volumes: VolumeOperations, volume: str, dest: str, max_bytes: int) -> Copied:
    """Copy the regular files of a work tree (not ``.git``) to ``dest`` in the volume, links never followed."""
    copied = Copied()
    for root, dirs, files in os.walk(work, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".git" and not os.path.islink(os.path.join(root, d)))
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, work).replace(os.sep, "/")
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link (O_NOFOLLOW refuses it) or gone
                copied.skipped.append(rel)
                continue
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    copied.skipped.append(rel)
                    continue
                data = f.read(max_bytes - copied.bytes + 1)
            if copied.bytes + len(data) > max_bytes or copied.files >= MAX_FILES:
                copied.skipped.append(rel)
                continue
            volumes.write_file(volume, f"{dest}/{rel}", data, roots=("buffers",))
            copied.files += 1
            copied.bytes += len(data)
    return copied


async def add_repo(
    url: str, ref: str | None, settings: Settings, volumes: VolumeOperations, volume: str, dest: str
) -> Copied:
    """Clone into a private scratch folder, copy into the volume, remove the scratch folder."""
    settings.make_home()
    scratch = Path(tempfile.mkdtemp(prefix="agent-clone-", dir=settings.work_root))
    try:
        work = await clone(url, ref, settings, scratch)
        max_bytes = settings.agent_fetch_max_mb * 1024 * 1024
        return await asyncio.to_thread(copy_tree, work, volumes, volume, dest, max_bytes)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
