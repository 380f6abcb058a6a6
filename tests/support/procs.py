"""The host's view of processes, for tests that check what a sandbox left behind.

Read from /proc, never from the code under test: a sandbox whose spawner lost track of it (a start
cancelled mid-spawn) is found by what its command line names, and by ancestry, even once it has been
re-parented to pid 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1])


def live_processes() -> dict[int, int]:
    """Pid -> parent pid of every process that is not gone (a zombie waiting for its reaper counts as gone)."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[0] != "Z":
            table[int(entry)] = stat[1]
    return table


def cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def with_descendants(roots: Iterable[int], table: dict[int, int] | None = None) -> set[int]:
    """``roots`` that still live and every live process below them."""
    table = live_processes() if table is None else table
    found = {pid for pid in roots if pid in table}
    grew = True
    while grew:
        more = {pid for pid, parent in table.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (not ``pid`` itself)."""
    return with_descendants([pid]) - {pid}


def naming(marker: str) -> set[int]:
    """Live processes whose command line contains ``marker`` (a sandbox's work folder: bubblewrap's
    command line binds it), with everything below them (the worker inside, whose own line does not)."""
    table = live_processes()
    own = os.getpid()
    return with_descendants([pid for pid in table if pid != own and marker in cmdline(pid)], table)


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``check`` until true or ``timeout`` seconds pass (a bound against hangs, not a timing)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
