"""Is a process that owns a run (or an agent turn) still running? Host-local liveness from /proc.

A process is recognised by pid and start stamp (boot id + start time), so a pid the OS recycled for
another process does not keep a dead owner's work "running". Where /proc is missing (macOS, Windows)
the kernel is asked about the pid alone.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Does a process with this pid exist (whoever owns it)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


@cache
def boot_id() -> str:
    """This boot of the machine ("" where /proc does not say)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start stamp) of ``pid`` from /proc; None where /proc lacks it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The name (field 2) may contain spaces and ')': the fields we want follow its last ')'.
    after_name = stat[stat.rindex(b")") + 2 :].split()
    return after_name[0].decode(), f"{boot_id()}:{after_name[19].decode()}"  # fields 3 and 22


def process_start(pid: int) -> str | None:
    """Which process ``pid`` is, beyond its number: boot id + start time in clock ticks.

    None where /proc is not available (macOS, Windows) or the process is gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def owner_alive(pid: int, start: str | None) -> bool:
    """Is the process that owns a run still running? Not if it exited (a zombie has), nor if
    the pid now belongs to another process (another start stamp)."""
    stat = _proc_stat(pid)
    if stat is None:
        return pid_alive(pid)  # no /proc here (or it hides the pid): ask the kernel
    state, now = stat
    return state not in ("Z", "X") and start in (None, now)
