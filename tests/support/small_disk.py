"""A small, size-limited file system (a tmpfs) for tests of what happens when the disk fills up.

Mounting needs root, as CI runs: elsewhere, or where mounting is refused (a container without the
capability), the test skips and says why. ``fill`` takes every free block, ``free`` gives it back.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = ".filler"


@contextlib.contextmanager
def small_disk(where: Path, mb: int = 16) -> Iterator[Path]:
    """A tmpfs of ``mb`` MB mounted at ``where`` (created) for the block; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited file system (tmpfs) needs root; CI runs the suite as root")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0700", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {where}: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # a process still has a file open


def fill(disk: Path) -> Path:
    """Write to a file on ``disk`` until it has no block left; returns the file (``free`` removes it)."""
    filler = disk / FILLER
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1 << 9, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def free(disk: Path) -> None:
    """Give back what ``fill`` took."""
    (disk / FILLER).unlink(missing_ok=True)


def free_bytes(disk: Path) -> int:
    info = os.statvfs(disk)
    return info.f_bavail * info.f_frsize


@contextlib.contextmanager
def small_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """FLEET_HOME on a 16 MB tmpfs for the block (the disk is yielded); what was filled is freed after."""
    with small_disk(tmp_path / "disk") as mounted:
        monkeypatch.setenv("FLEET_HOME", str(mounted / "home"))
        try:
            yield mounted
        finally:
            free(mounted)
