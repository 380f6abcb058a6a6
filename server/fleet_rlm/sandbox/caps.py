"""Caps that hold for a local sandbox as a whole, and the report of which ones this host enforces.

Per-process rlimits do not bound a sandbox: RLIMIT_AS is per process (ten children use ten times the
memory) and the kernel never applies RLIMIT_NPROC to root. So every sandbox gets its own cgroup
(``<the server's own cgroup>/fleet-rlm/sb-<server pid>-<random>``) with a memory limit (swap included)
and a pids limit (processes and threads together). cgroup v2 is used when memory and pids can be
enabled for a child of the server's cgroup, else the v1 ``memory`` and ``pids`` hierarchies when they
are writable, else nothing (non-root without delegation, macOS): then the caps are reported as not
enforced by :func:`describe_caps`, which ``doctor`` shows and ``doctor --strict`` fails on.

The spawned process joins its cgroup in ``preexec_fn`` (after fork, before exec) through file
descriptors the host opened, so nothing runs uncapped and no path the sandbox can reach is involved.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_rlm.sandbox import seccomp
from fleet_rlm.volumes.quota import Quota, human

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

logger = logging.getLogger(__name__)

PARENT = "fleet-rlm"
# Tasks the sandbox needs besides user code: bwrap's monitor and init, the worker's four threads, slack.
WORKER_TASKS = 8
TMP_BYTES = 64 * 1024 * 1024  # /tmp inside bwrap (RAM): small, the work folder is for real files
SHM_BYTES = 16 * 1024 * 1024  # /dev/shm inside bwrap: enough for multiprocessing's semaphores
SANDBOX_UID = 65534  # the uid and gid code runs as inside bwrap (nobody), whoever started the server
# Extra seconds past an execute timeout before the host presumes the worker stuck and kills it: a cap
# doctor reports, so it lives here and the local backend that applies it imports it.
STUCK_GRACE = 10.0
CONTROLLERS = ("memory", "pids")


@dataclass(frozen=True)
class CgroupSupport:
    """What this host offers: the ``fleet-rlm`` parent group per controller, or why there is none."""

    version: int | None = None  # 2, 1, or None when cgroups cannot be used
    parents: tuple[tuple[str, Path], ...] = ()  # (controller, parent dir); one dir for both under v2
    why_not: str = ""

    def parent(self, controller: str) -> Path | None:
        return dict(self.parents).get(controller)


def _mountinfo() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fs type, super options) of every mount of this process."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = (f.replace("\\040", " ") for f in fields[3:5])  # mountinfo escapes spaces
        mounts.append((root, point, tail[0], set(tail[2].split(","))))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _join(root: str, point: str, path: str) -> Path | None:
    """The directory of cgroup ``path`` in a hierarchy mounted at ``point`` (whose root is ``root``)."""
    rel = os.path.relpath(path, root)
    if rel.startswith(".."):
        return None  # our cgroup lies outside what this mount shows
    return Path(point) / rel if rel != "." else Path(point)


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as `echo > file`: cgroupfs accepts the truncation
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _number(text: str, key: str | None = None) -> int | None:
    """The file's number, or the one on its ``key`` line (``oom_kill 3``)."""
    if key is not None:
        found = [line.split()[1] for line in text.splitlines() if line.split()[:1] == [key]]
        text = found[0] if found else ""
    return int(text) if text.isdigit() else None


def _probe(parent: Path) -> None:
    """Create and remove a group: an existing parent proves nothing on a read-only or foreign mount."""
    probe = parent / f"sb-{os.getpid()}-probe"
    probe.mkdir(exist_ok=True)
    probe.rmdir()


def _v2_parent(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]) -> tuple[Path | None, str]:
    v2 = [(root, point) for root, point, fstype, _ in mounts if fstype == "cgroup2"]
    if not v2 or "" not in own:
        return None, "no cgroup v2 mount"
    base = _join(*v2[0], own[""])
    if base is None:
        return None, "the cgroup v2 mount does not show this process's cgroup"
    offered = set(_read(base / "cgroup.controllers").split())
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        return None, f"cgroup v2 at {v2[0][1]} offers no {' or '.join(missing)} controller to this process"
    try:
        if not set(CONTROLLERS) <= set(_read(base / "cgroup.subtree_control").split()):
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        parent = base / PARENT
        parent.mkdir(exist_ok=True)
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        _probe(parent)
    except OSError as exc:
        why = "it holds processes" if exc.errno == errno.EBUSY else exc.strerror
        return None, f"cgroup v2: cannot delegate memory and pids below {base} ({why})"
    return parent, ""


def _v1_parents(
    mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]
) -> tuple[tuple[tuple[str, Path], ...], str]:
    parents = []
    for controller in CONTROLLERS:
        found = [(r, p) for r, p, fstype, opts in mounts if fstype == "cgroup" and controller in opts]
        if not found or controller not in own:
            return (), f"no cgroup v1 {controller} hierarchy is mounted"
        base = _join(*found[0], own[controller])
        if base is None:
            return (), f"the cgroup v1 {controller} mount does not show this process's cgroup"
        try:
            (base / PARENT).mkdir(exist_ok=True)
            _probe(base / PARENT)
        except OSError as exc:
            return (), f"cgroup v1 {controller} at {base} is not writable ({exc.strerror})"
        parents.append((controller, base / PARENT))
    return tuple(parents), ""


@functools.cache
def detect_cgroups() -> CgroupSupport:
    """Find (and create) the ``fleet-rlm`` parent groups: cgroup v2 if delegated, else v1, else none."""
    if not sys.platform.startswith("linux"):
        return CgroupSupport(why_not=f"cgroups are a Linux feature and this is {sys.platform}")
    try:
        mounts, own = _mountinfo(), _own_cgroups()
    except OSError as exc:
        return CgroupSupport(why_not=f"cannot read this process's cgroups ({exc})")
    parent, why_v2 = _v2_parent(mounts, own)
    if parent is not None:
        return CgroupSupport(2, tuple((c, parent) for c in CONTROLLERS))
    parents, why_v1 = _v1_parents(mounts, own)
    if parents:
        return CgroupSupport(1, parents)
    return CgroupSupport(why_not=f"{why_v2}; {why_v1}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: Path) -> None:
    """Remove empty groups left by servers that died without shutting their sandboxes down."""
    for group in parent.glob("sb-*-*"):
        owner = group.name.split("-")[1]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            with contextlib.suppress(OSError):  # EBUSY: processes still inside; never touched here
                group.rmdir()


class SandboxCgroup:
    """One sandbox's cgroup: limits set at creation, joined by the spawned process, killed and removed
    by :meth:`destroy`."""

    def __init__(self, version: int, groups: dict[str, Path], memory_mb: int, tasks_max: int) -> None:
        self.version = version
        self.groups = groups  # controller -> group dir (the same dir for both under v2)
        self.memory_mb = memory_mb
        self.tasks_max = tasks_max
        dirs = dict.fromkeys(groups.values())  # v2: one dir, so one write joins both controllers
        self._join_fds = [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in dirs]
        # Read after every step: a pread of an open file costs a fraction of open+read+close.
        events = "memory.events" if version == 2 else "memory.oom_control"
        try:
            self._oom_fd = os.open(groups["memory"] / events, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # the caps still hold; only the count of OOM kills is not reported
            self._oom_fd = -1

    @classmethod
    def create(cls, memory_mb: int, max_procs: int) -> SandboxCgroup | None:
        """A new group limited to ``memory_mb`` (swap included) and ``max_procs`` + WORKER_TASKS tasks;
        None when the host offers no cgroups (see :func:`detect_cgroups`) or creating one failed."""
        support = detect_cgroups()
        if support.version is None:
            return None
        name = f"sb-{os.getpid()}-{secrets.token_hex(4)}"
        groups: dict[str, Path] = {}
        try:
            for controller, parent in support.parents:
                _remove_stale(parent)
                group = parent / name
                group.mkdir(exist_ok=True)
                groups[controller] = group
            cgroup = cls(support.version, groups, memory_mb, max_procs + WORKER_TASKS)
            cgroup._set_limits()
        except OSError as exc:
            logger.warning("could not create the sandbox cgroup %s (%s); its caps are not enforced", name, exc)
            for group in dict.fromkeys(groups.values()):
                with contextlib.suppress(OSError):
                    group.rmdir()
            return None
        return cgroup

    def _set_limits(self) -> None:
        mem, pids = self.groups["memory"], self.groups["pids"]
        limit = str(self.memory_mb * 1024 * 1024)
        if self.version == 2:
            _write(mem / "memory.max", limit)
            if (mem / "memory.swap.max").exists():
                _write(mem / "memory.swap.max", "0")  # swap must not stretch the cap
        else:
            _write(mem / "memory.limit_in_bytes", limit)
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", limit)  # memory + swap together
        _write(pids / "pids.max", str(self.tasks_max))

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` that moves the forked child into the group before it execs anything."""
        fds = list(self._join_fds)

        def join() -> None:
            pid = str(os.getpid()).encode()
            for fd in fds:
                os.write(fd, pid)

        return join

    def _value(self, controller: str, name: str, key: str | None = None) -> int | None:
        return _number(_read(self.groups[controller] / name), key)

    def oom_kills(self) -> int:
        """Processes of this sandbox the kernel's out-of-memory killer has ended so far."""
        try:
            text = os.pread(self._oom_fd, 4096, 0).decode()
        except OSError:  # destroyed, or the kernel offers no counter
            return 0
        return _number(text, "oom_kill") or 0

    def stats(self) -> dict[str, int | None]:
        """Limits and counters as the kernel reports them (peaks where the kernel keeps them)."""
        v2 = self.version == 2
        return {
            "memory_limit": self._value("memory", "memory.max" if v2 else "memory.limit_in_bytes"),
            "memory_peak": self._value("memory", "memory.peak" if v2 else "memory.max_usage_in_bytes"),
            "oom_kills": self.oom_kills(),
            "pids_max": self._value("pids", "pids.max"),
            "pids_current": self._value("pids", "pids.current"),
            "pids_peak": self._value("pids", "pids.peak"),
            "pids_limit_hits": self._value("pids", "pids.events", "max"),
        }

    def pids(self) -> list[int]:
        """Every process still in the group."""
        return [int(p) for p in _read(self.groups["pids"] / "cgroup.procs").split()]

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill every process still in the group, then remove it; safe to call repeatedly."""
        for fd in [*self._join_fds, self._oom_fd]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._join_fds, self._oom_fd = [], -1  # -1: a later read fails instead of reading a reused fd
        dirs = [d for d in dict.fromkeys(self.groups.values()) if d.exists()]
        deadline = time.monotonic() + timeout
        while dirs and time.monotonic() < deadline:
            # Repeat: a process may fork between reading the list and the kill (pids.max bounds this).
            for pid in self.pids() if self.groups["pids"].exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for group in list(dirs):
                with contextlib.suppress(OSError):  # EBUSY until the killed processes are gone
                    group.rmdir()
                    dirs.remove(group)
            if dirs:
                time.sleep(0.02)
        if dirs:
            logger.warning("sandbox cgroup %s could not be removed within %g s", dirs[0], timeout)


def _swap_capped(support: CgroupSupport) -> bool:
    parent = support.parent("memory")
    name = "memory.swap.max" if support.version == 2 else "memory.memsw.limit_in_bytes"
    return parent is not None and (parent / name).exists()


def _row(name: str, limit: str, how: str = "", why_not: str = "") -> dict[str, Any]:
    return {"name": name, "limit": limit, "enforced": not why_not, "how": how, "why_not": why_not}


def work_quota(quota_mb: int, max_files: int) -> Quota:
    """The quota of a sandbox's work folder, naming the settings that raise it."""
    return Quota(quota_mb * 1024 * 1024, max_files, "FLEET_WORK_QUOTA_MB", "FLEET_WORK_MAX_FILES")


def _host_rows(bwrap: bool, work: Quota, host_call_mb: int, host_call_total_mb: int) -> list[dict[str, Any]]:
    """Caps the host keeps itself: the work folder's disk use and the host-call data it holds."""
    no_bwrap = "no bubblewrap isolation, so code can write anywhere the server can"
    disk = f"{human(work.max_bytes)} and {work.max_files:,} entries in the work folder"
    how = "measured after every step; what was written since the last check is removed, newest first, until under"
    calls = f"{host_call_mb} MB of host-call data per sandbox, {host_call_total_mb} MB for all sandboxes together"
    return [
        _row("work_disk", disk, how, "" if bwrap else no_bwrap),
        _row("host_calls", calls, "counted as each call is read; a call past it is refused with an error inside"),
    ]


def describe_caps(
    isolation: str,
    *,
    memory_mb: int,
    max_procs: int,
    exec_timeout: float | None,
    output_limit: int,
    work: Quota,
    host_call_mb: int,
    host_call_total_mb: int,
) -> list[dict[str, Any]]:
    """Every cap of a local sandbox with these settings: {name, limit, enforced, how, why_not}."""
    support = detect_cgroups()
    cg = f"cgroup v{support.version}" if support.version else ""
    bwrap = isolation == "bwrap"
    no_bwrap = "no bubblewrap isolation, so code uses the host's file system with the server's permissions"
    swap = " (swap included)" if _swap_capped(support) else ""
    per_process = f"RLIMIT_AS {memory_mb} MB of address space per process"
    memory = f"{memory_mb} MB for all processes of the sandbox together"
    if cg:
        rows = [_row("memory", memory, f"{cg} memory limit{swap}, plus {per_process}")]
    else:
        why = f"{support.why_not}: only {per_process} applies, so several processes together can use more"
        rows = [_row("memory", memory, why_not=why)]
    tasks = f"{max_procs} processes and threads (+{WORKER_TASKS} for the worker itself)"
    if cg:
        rows.append(_row("processes", tasks, f"{cg} pids.max = {max_procs + WORKER_TASKS}"))
    elif hasattr(os, "geteuid") and os.geteuid() == 0:
        why = f"running as root, and the kernel never applies RLIMIT_NPROC to root; {support.why_not}"
        rows.append(_row("processes", tasks, why_not=why))
    else:
        rows.append(_row("processes", tasks, "RLIMIT_NPROC (counts every process of the server's user)"))
    ram = f"/tmp {TMP_BYTES >> 20} MB, /dev/shm {SHM_BYTES >> 20} MB, nothing else"
    rows.append(_row("ram_fs", ram, "size-capped tmpfs mounts in bubblewrap", "" if bwrap else no_bwrap))
    root = "read-only: /, /dev, system folders; writable: the work folder and volumes"
    rows.append(_row("root_fs", root, "bubblewrap --remount-ro / and read-only binds", "" if bwrap else no_bwrap))
    held = f"no capabilities, uid and gid {SANDBOX_UID}, no new user namespaces (also when the server is root)"
    how = f"bubblewrap --cap-drop ALL --uid {SANDBOX_UID} --gid {SANDBOX_UID} --disable-userns, checked inside"
    rows.append(_row("privileges", held, how, "" if bwrap else no_bwrap))
    calls = f"{len(seccomp.REFUSED_SYSCALLS)} calls refused: mount family, namespaces, kernel interfaces"
    no_filter = "" if seccomp.supported() else f"no filter is written for {platform.machine()} (x86_64, aarch64)"
    rows.append(_row("syscalls", calls, "a seccomp filter bubblewrap installs", no_filter if bwrap else no_bwrap))
    rows.append(_row("output", f"{output_limit} characters per step (head+tail)", "cut before the model sees it"))
    if exec_timeout:
        how = f"SIGALRM in the worker; the host kills it when silent {STUCK_GRACE:g} s longer"
        rows.append(_row("step_time", f"{exec_timeout:g} s per step", how))
    else:
        rows.append(_row("step_time", "none", why_not="no exec_timeout is set"))
    return rows + _host_rows(bwrap, work, host_call_mb, host_call_total_mb)


def not_enforced(rows: list[dict[str, Any]]) -> list[str]:
    """One readable line per cap that is not enforced (for doctor, --strict and run warnings)."""
    return [f"{r['name']} cap ({r['limit']}) is not enforced: {r['why_not']}" for r in rows if not r["enforced"]]


_CAP_FIXES = {
    "memory": "run the server where it can create cgroups: as root with the cgroup v1 memory and pids "
    "hierarchies writable, or with memory and pids delegated to its cgroup v2 (systemd: Delegate=yes)",
    "ram_fs": "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) and use FLEET_ISOLATION=auto",
    "step_time": "set FLEET_EXEC_TIMEOUT",
    "syscalls": "run on x86_64 or aarch64, where the seccomp filter exists, or use Daytona sandboxes",
}


def caps_check(settings: Settings, isolation: str) -> dict[str, Any]:
    """Each sandbox cap with whether this host enforces it; an unenforced cap is a warning."""
    rows = describe_caps(
        isolation,
        memory_mb=settings.memory_mb,
        max_procs=settings.max_procs,
        exec_timeout=settings.exec_timeout,
        output_limit=settings.output_chars,
        work=work_quota(settings.work_quota_mb, settings.work_max_files),
        host_call_mb=settings.host_call_mb,
        host_call_total_mb=settings.host_call_total_mb,
    )
    missing = not_enforced(rows)
    detail = "; ".join(missing) if missing else "all enforced: " + ", ".join(r["name"] for r in rows)
    check: dict[str, Any] = {"ok": not missing, "detail": detail, "caps": rows, "not_enforced": missing}
    if missing:
        check["warning"] = True  # runs still work, but hostile code is less contained
        names = {r["name"] for r in rows if not r["enforced"]}
        fix_for = {"processes": "memory", "root_fs": "ram_fs", "work_disk": "ram_fs", "privileges": "ram_fs"}
        if isolation != "bwrap":  # bubblewrap missing: installing it is the fix, whatever the machine
            fix_for["syscalls"] = "ram_fs"
        check["fix"] = "; ".join(dict.fromkeys(_CAP_FIXES[fix_for.get(n, n)] for n in sorted(names)))
    return check
