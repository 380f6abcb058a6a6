"""What ``/proc`` says about a process tree: resident memory, open descriptors, descendants and
their command lines. Linux only, standard library only; a process that ends while it is being
read is simply left out."""

from __future__ import annotations

import os
from dataclasses import dataclass

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    rss_kb: int


def table() -> dict[int, Proc]:
    """Every process now, by pid."""
    procs = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
        except OSError:
            continue
        pid = int(entry.name)
        procs[pid] = Proc(pid, int(fields[1]), int(fields[21]) * PAGE_KB)
    return procs


def descendants(pid: int, procs: dict[int, Proc] | None = None) -> list[Proc]:
    """The processes below ``pid`` (children, their children ...), not ``pid`` itself."""
    procs = table() if procs is None else procs
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(procs[child])
        todo.extend(children.get(child, []))
    return found


def tree_rss_kb(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    procs = table()
    own = procs[pid].rss_kb if pid in procs else 0
    return own + sum(p.rss_kb for p in descendants(pid, procs))


def rss_kb(pid: int) -> int:
    """Resident memory of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * PAGE_KB
    except OSError:
        return 0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and of every child it has reaped (their children's too:
    each parent reaps its own), e.g. a server and the sandboxes of its finished runs."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(t) for t in fields[11:15]) / TICKS  # utime, stime, cutime, cstime


def open_fds(pid: int) -> int:
    """Descriptors the process holds open (needs the same user, or root)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def connections_to(pid: int, port: int) -> int:
    """The process's TCP connections to a loopback ``port`` (a client's kept-alive pool)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = 0
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                found += fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == port
    return found


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []
