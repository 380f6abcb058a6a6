"""Async host side of the local code sandbox: spawns ``worker.py`` (under bubblewrap when usable)
and speaks its protocol (see the worker module docstring).

The worker runs the model's code in its own process, so everything it sends is treated as forged:
each message is size-bounded, depth-checked and matched against the one request in flight; anything
else fails the sandbox at once. Inputs and host-call arguments travel through the pipe as data; the
host never opens a path inside the sandbox's folders."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from fleet_rlm.sandbox import seccomp
from fleet_rlm.sandbox.base import (
    MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    MB,
    Backend,
    ExecResult,
    HostCallBudget,
    HostFunction,
    ProtocolViolation,
    SandboxError,
    SandboxSpec,
    answer_host_call,
    exec_result,
    input_file_path,
    nesting_depth,
    register_backend,
)
from fleet_rlm.sandbox.caps import SANDBOX_UID, SHM_BYTES, STUCK_GRACE, TMP_BYTES, SandboxCgroup, work_quota
from fleet_rlm.volumes.quota import trim
from fleet_rlm.volumes.safepath import DIR_FLAGS, closing_fd, scan

logger = logging.getLogger(__name__)
__all__ = ["ExecResult", "HostFunction", "LocalSandbox", "SandboxError", "detect_isolation"]

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
SANDBOX_ROOT = "/fleet"
SANDBOX_WORK_DIR = "/fleet/work"
STARTUP_TIMEOUT = 30.0
KILL_GRACE = 2.0  # seconds a worker gets to exit after "shutdown" before SIGKILL
MAX_HOST_CALLS = 1024  # host calls one sandbox may have outstanding; more are refused, not queued
BLOB_CHUNK = 1024 * 1024


def _python() -> str:
    # The real base interpreter: a venv's python is a symlink into the home, which the sandbox can't see.
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _system_binds() -> list[str]:
    """Read-only binds (or symlinks, on merged-/usr systems) of what the interpreter needs.

    No /proc: it would show host paths (bind sources in mountinfo, bwrap's command line as pid 1)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    prefix = os.path.realpath(sys.base_prefix)
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]  # e.g. /root/.pyenv/versions/3.11.7 and nothing else of ~
    # RAM-backed space is size-capped (/tmp, /dev/shm) or read-only (/dev; / via _SEAL at the end).
    args += ["--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    return [*args, "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]


_BWRAP_BASE = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
# Run as root, bwrap leaves its child uid 0 with every capability, free to remount the binds writable
# (a write to /fleet/worker.py then lands in the checkout). So the code holds no capability, is an
# unprivileged uid inside its own user namespace, cannot make another one, and a seccomp filter
# refuses the mount family and namespaces even if one of these flags went missing.
_PRIVILEGES = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
_SEAL = ["--remount-ro", "/"]  # bwrap's root is an unsized tmpfs; last, since mount points are made on it
# What the isolation probe runs inside: the effective and permitted capability sets, the uid, and
# whether unshare(0) and a writable remount of /usr were refused (1) or allowed (0).
_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
head, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
libc.capget(head, data)
unshare = libc.syscall(%d, 0) != 0 if %d >= 0 else 0
remount = libc.mount(None, b"/usr", None, 32 | 4096, None) != 0
print(data[0] | data[3] << 32, data[1] | data[4] << 32, os.getuid(), int(unshare), int(remount))
"""


@functools.cache
def _disable_userns(bwrap: str) -> list[str]:
    """``--disable-userns`` where this bwrap has it (0.8 and later); seccomp refuses unshare anyway."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return ["--disable-userns"] if "--disable-userns" in usage else []


@contextlib.contextmanager
def _seccomp_fd(wanted: bool = True) -> Iterator[list[str]]:
    """bwrap's ``--seccomp FD`` arguments, with FD a pipe holding the filter for one spawn (bwrap
    reads it to the end); no arguments unisolated, or on an architecture without a filter (doctor
    says so)."""
    if not wanted or not seccomp.supported():
        yield []
        return
    program = seccomp.filter_program()
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)  # a few hundred bytes: never more than a pipe holds
        os.close(write_end)
        write_end = -1
        yield ["--seccomp", str(read_end)]
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def _bwrap(extra: list[str]) -> list[str]:
    bwrap = shutil.which("bwrap") or "bwrap"
    return [bwrap, *_BWRAP_BASE, *_PRIVILEGES, *_disable_userns(bwrap), *extra]


_probing = threading.Lock()


def detect_isolation() -> tuple[str, str]:
    """Return ("bwrap", description) if bubblewrap really works here, else ("none", how to fix).

    Probed once per process; a caller arriving while another thread probes (the run command's
    warm-up) waits for that probe instead of starting its own."""
    with _probing:
        return _probe_isolation()


@functools.cache
def _probe_isolation() -> tuple[str, str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "none", (
            "bubblewrap not found: install the Debian package 'bubblewrap' (apt-get install bubblewrap) "
            "to isolate the sandbox; code now runs unisolated (scrubbed env and rlimits only)"
        )
    # bwrap can be installed yet unusable (no user namespaces, seccomp'd container): try it once, with
    # the flags a sandbox gets, and read from inside what the code would hold.
    unshare = seccomp.syscall_number("unshare")
    probe = _PROBE % (unshare, unshare)
    try:
        with _seccomp_fd() as filter_args:
            cmd = [*_bwrap(filter_args), *_system_binds(), *_SEAL, _python(), "-I", "-S", "-c", probe]
            fds = [int(filter_args[1])] if filter_args else []
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL, pass_fds=fds
            )
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        proc, version = None, str(exc)
    if proc is None or proc.returncode != 0:
        detail = version if proc is None else proc.stderr.strip()[:300]
        return "none", (
            f"bubblewrap is installed but cannot create a sandbox here ({detail}); enable unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run with isolation='none'"
        )
    try:
        effective, permitted, uid, unshare_refused, remount_refused = map(int, proc.stdout.split())
    except ValueError:
        return "none", f"the bubblewrap probe printed {proc.stdout[:200]!r}, not its capability report"
    if effective or permitted or uid == 0 or not remount_refused:
        return "none", (  # never the case with the flags above; refuse rather than trust such a sandbox
            f"bubblewrap left the code privileged here (capabilities {effective:#x}, uid {uid}, remount "
            f"{'refused' if remount_refused else 'allowed'}); isolation is off until that is fixed"
        )
    filtered = (
        "a seccomp filter refusing mount, namespaces and kernel calls"
        if unshare_refused
        else (f"no seccomp filter (none for {platform.machine()})")
    )
    return "bwrap", (
        f"{version.strip() or 'bubblewrap'}, no network, no /proc, read-only root and system folders, "
        "/tmp and /dev/shm size-capped, only the work dir and volumes writable; the code runs as uid "
        f"{uid} with no capabilities (measured inside), no nested user namespaces, {filtered}"
    )


ROOT_UNISOLATED = (
    "running as root and bubblewrap cannot isolate the sandbox here (`fleet-rlm doctor` says why), so the "
    "model's code would run as root on this machine: install bubblewrap (Debian/Ubuntu: apt-get install "
    "bubblewrap), or set FLEET_ISOLATION=none to accept that risk"
)


def _refuse_root_unisolated(available: str) -> None:
    """As root, code is never run unisolated by default: only an explicit FLEET_ISOLATION=none does."""
    if available != "bwrap" and hasattr(os, "geteuid") and os.geteuid() == 0:
        raise SandboxError(ROOT_UNISOLATED)


def choose_isolation(isolation: str) -> Literal["bwrap", "none"]:
    """What ``isolation`` (auto, bwrap, none) means here; SandboxError where it cannot be had."""
    available, why = detect_isolation()
    if isolation == "auto":
        _refuse_root_unisolated(available)
        return "bwrap" if available == "bwrap" else "none"
    if isolation == "bwrap" and available != "bwrap":
        raise SandboxError(why)
    if isolation not in ("bwrap", "none"):
        raise ValueError(f"isolation must be 'auto', 'bwrap' or 'none', not {isolation!r}")
    return "bwrap" if isolation == "bwrap" else "none"


T = TypeVar("T")


async def _outlasting_cancel(job: Coroutine[Any, Any, T]) -> T:
    """``job``'s result, awaited to its end even when the caller is cancelled meanwhile (once or many
    times: an anyio scope cancels at every await); such a cancel is raised once the job is done, the
    caught one itself (anyio knows its own by their message, and lets any other through its scope)."""
    task = asyncio.ensure_future(job)
    cancel: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancel = exc
    if cancel is not None:
        raise cancel
    return task.result()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                parent = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        frontier = [kid for parent in frontier for kid in children.get(parent, ()) if kid not in found]
        found += frontier
    return found


class LocalSandbox:
    """A persistent Python REPL in a sandboxed subprocess, driven from asyncio."""

    def __init__(
        self,
        work_dir: Path,
        *,
        host_functions: dict[str, HostFunction] | None = None,
        volumes: dict[str, Path] | None = None,
        isolation: Literal["auto", "bwrap", "none"] = "auto",
        memory_mb: int = 2048,
        max_procs: int = 64,
        exec_timeout: float | None = 300.0,
        output_limit: int = 1_000_000,
        env: dict[str, str] | None = None,
        host_call_mb: int = 128,
        host_call_total_mb: int = 512,
        work_quota_mb: int = 1024,
        work_max_files: int = 100_000,
        read_only_volumes: bool = False,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.volumes = {name: Path(p).resolve() for name, p in (volumes or {}).items()}
        for name in self.volumes:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"invalid volume name {name!r}")
        isolation = choose_isolation(isolation)
        self.isolation: str = isolation
        bwrap = isolation == "bwrap"
        self.volumes_read_only = read_only_volumes and bwrap  # only bubblewrap can mount them so
        self.sandbox_work_dir = SANDBOX_WORK_DIR if bwrap else str(self.work_dir)
        self.volume_paths = {
            name: f"{SANDBOX_ROOT}/volumes/{name}" if bwrap else str(path) for name, path in self.volumes.items()
        }
        if memory_mb < 64:  # the interpreter and its protocol threads need this much address space
            raise ValueError(f"memory_mb must be at least 64, not {memory_mb}")
        self.memory_mb = memory_mb
        self.max_procs = max_procs
        self._cgroup: SandboxCgroup | None = None
        self._oom_kills = 0  # the group's count as last reported (a new group starts at 0)
        self.exec_timeout = exec_timeout
        self.output_limit = output_limit
        self.work_quota = work_quota(work_quota_mb, work_max_files)
        self._work_checked = 0.0  # when the work folder was last measured: what is newer may be trimmed
        self._host_bytes = HostCallBudget(host_call_mb, host_call_total_mb)
        self.env = dict(env or {})
        self.bytes_sent = 0  # protocol traffic, for diagnostics
        self.bytes_received = 0
        self._functions: dict[str, HostFunction] = dict(host_functions or {})
        self._output_fields: list[dict[str, Any]] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # The one request in flight (requests are serialised): its id, op, reply and output sink.
        self._inflight: tuple[int, str, asyncio.Future[dict[str, Any]]] | None = None
        self._on_output: Callable[[str], None] | None = None
        self._streamed = 0  # output characters accepted for the execute in flight
        self._calls: set[int] = set()  # host-call ids still being answered
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._request_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._failure: str | None = None  # set once the worker is gone; every later call raises it
        self._abandoned: str | None = None  # why a start that failed or was cancelled left it unusable
        self._closed = False

    @property
    def warnings(self) -> list[str]:
        from fleet_rlm.sandbox.caps import describe_caps, not_enforced

        budget = self._host_bytes
        rows = describe_caps(
            self.isolation,
            memory_mb=self.memory_mb,
            max_procs=self.max_procs,
            exec_timeout=self.exec_timeout,
            output_limit=self.output_limit,
            work=self.work_quota,
            host_call_mb=budget.limit // MB,
            host_call_total_mb=budget.process_limit // MB,
        )
        missing = [r["name"] for r in rows if not r["enforced"]]
        if self._proc is not None and self._cgroup is None and not missing:  # cgroups exist, creation failed
            missing = ["memory", "processes"]
        if self.isolation == "none":
            head = "code runs WITHOUT isolation (bubblewrap unavailable or FLEET_ISOLATION=none)"
            return [f"{head}; caps not held: {', '.join(missing)}; see `fleet-rlm doctor`"]
        if missing:
            details = "; ".join(not_enforced(rows)) or "the sandbox's cgroup could not be created (see the log)"
            return [f"sandbox caps not held: {', '.join(missing)} ({details}); `fleet-rlm doctor` says how to fix"]
        return []

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._failure is None

    @property
    def pid(self) -> int | None:
        """Pid of the spawned process (bwrap itself under bwrap isolation)."""
        return self._proc.pid if self._proc is not None else None

    # ---- lifecycle -------------------------------------------------------------------------------
    def _command(self, filter_args: list[str]) -> tuple[list[str], dict[str, str] | None, str | None]:
        limits = ["--memory-mb", str(self.memory_mb), "--max-procs", str(self.max_procs)]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.sandbox_work_dir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            # RLIMIT_AS counts reserved address space, and each extra glibc malloc arena reserves 64 MB. A
            # second arena appears only when threads contend for malloc, so on a busy machine a 128 MB
            # sandbox hit MemoryError at 60 MB of data: one arena keeps the cap the same under any load.
            "MALLOC_ARENA_MAX": "1",
            **self.env,
        }
        if self.isolation == "none":
            cmd = [_python(), "-I", "-S", "-u", str(WORKER_SCRIPT), "--workdir", str(self.work_dir), *limits]
            return cmd, env, str(self.work_dir)
        cmd = [*_bwrap(filter_args), *_system_binds()]
        cmd += ["--ro-bind", str(WORKER_SCRIPT), f"{SANDBOX_ROOT}/worker.py"]
        cmd += ["--bind", str(self.work_dir), SANDBOX_WORK_DIR]
        bind = "--ro-bind" if self.volumes_read_only else "--bind"
        for name, path in self.volumes.items():
            cmd += [bind, str(path), self.volume_paths[name]]
        for key, value in env.items():
            cmd += ["--setenv", key, value]
        cmd += [*_SEAL, "--chdir", SANDBOX_WORK_DIR, _python(), "-I", "-S", "-u", f"{SANDBOX_ROOT}/worker.py"]
        cmd += ["--workdir", SANDBOX_WORK_DIR, *limits]
        return cmd, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, None

    async def start(self) -> None:
        """Spawn the worker and define the host functions; a no-op when already running.

        Cancellation-safe: a start cancelled (or failed) anywhere, inside the spawn included, kills
        every process it made (by the sandbox's cgroup and its process tree) and removes the cgroup
        before it raises; the sandbox is then unusable (a new LocalSandbox starts afresh)."""
        async with self._start_lock:
            if self._closed:
                raise SandboxError(self._abandoned or "the sandbox was shut down; create a new LocalSandbox")
            if self._proc is not None:
                self._check()
                return
            try:
                await self._launch()
            except BaseException as exc:
                cancelled = isinstance(exc, asyncio.CancelledError)
                why = "its start was cancelled" if cancelled else f"it failed to start ({str(exc)[:300]})"
                # To its end even if cancelled again meanwhile: the processes die, the cgroup goes.
                reason = f"the sandbox is unusable: {why}; create a new LocalSandbox"
                await _outlasting_cancel(self._abandon(reason, asyncio.current_task()))
                raise

    async def _launch(self) -> None:
        # Host-created and never inside another sandbox's folders (the caller picks a fresh one).
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in self.volumes.values():  # host-owned volume folders (the engine creates them)
            path.mkdir(parents=True, exist_ok=True)
        self._work_checked = time.time()
        self._cgroup = SandboxCgroup.create(self.memory_mb, self.max_procs)  # None: host has no cgroups
        with _seccomp_fd(self.isolation == "bwrap") as filter_args:
            cmd, env, cwd = self._command(filter_args)
            # Shielded: a cancel landing inside create_subprocess_exec after the fork would lose the
            # process (asyncio then kills bwrap's own pid alone, and its inner processes may outlive it).
            # The spawn ends first and sets self._proc, so a cancel meanwhile kills what it made.
            await _outlasting_cancel(self._spawn_worker(cmd, env, cwd, filter_args))
        self._ready = asyncio.get_running_loop().create_future()
        self._spawn(self._read_stdout())
        self._spawn(self._read_stderr())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), STARTUP_TIMEOUT)
        except TimeoutError:
            await self._fail(f"the sandbox worker did not start within {STARTUP_TIMEOUT:g} s")
        self._check()
        if self._functions:
            await self._request({"op": "define_functions", "names": list(self._functions)})
        if self._output_fields is not None:
            await self._request({"op": "configure", "output_fields": self._output_fields})

    async def _spawn_worker(
        self, cmd: list[str], env: dict[str, str] | None, cwd: str | None, filter_args: list[str]
    ) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            # Longest accepted protocol line: a bound on what a hostile worker can make the host buffer.
            limit=MAX_MESSAGE_BYTES + 64 * 1024,
            pass_fds=[int(filter_args[1])] if filter_args else [],
            preexec_fn=self._cgroup.preexec() if self._cgroup else None,  # joins before exec
        )

    async def _abandon(self, reason: str, caller: asyncio.Task[Any] | None) -> None:
        """After a start that failed or was cancelled: kill every process it made, remove its cgroup."""
        self._closed = True
        self._abandoned = self._failure or reason
        self._failure = self._failure or reason
        self._kill()
        self._fail_pending(SandboxError(self._failure))
        if self._proc is not None:  # reaped by asyncio's watcher before its transport is closed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), KILL_GRACE)
        await self._end(caller)

    async def shutdown(self) -> None:
        """Stop the worker (graceful, then SIGKILL); safe to call repeatedly. Run to its end even
        when the caller is cancelled meanwhile (the cancel is raised afterwards)."""
        await _outlasting_cancel(self._shutdown(asyncio.current_task()))

    async def _shutdown(self, caller: asyncio.Task[Any] | None) -> None:
        self._closed = True
        proc = self._proc
        if proc is not None:
            if proc.returncode is None and self._failure is None:
                with contextlib.suppress(Exception):
                    await self._send({"op": "shutdown"})
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), KILL_GRACE)
            except TimeoutError:
                self._kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), KILL_GRACE)
        self._failure = self._failure or "the sandbox was shut down; create a new LocalSandbox"
        self._fail_pending(SandboxError(self._failure))
        await self._end(caller)

    async def _end(self, caller: asyncio.Task[Any] | None) -> None:
        """Stop the protocol tasks (not ``caller``, which may be one of them), kill and remove the cgroup
        with whatever is still in it, and close the process's transport."""
        spare = {caller, asyncio.current_task()}
        for task in list(self._tasks):
            if task not in spare:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t not in spare), return_exceptions=True)
        if self._cgroup is not None:  # kills whatever escaped the process group, then removes it
            await asyncio.to_thread(self._cgroup.destroy)
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            # asyncio's Process has no public close(); an unclosed transport warns (or errors, once
            # the loop is closed) when garbage-collected.
            transport.close()

    def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        # Listed first, while they are still below it: bubblewrap's inner processes start sessions of
        # their own, so its process group (start_new_session) does not reach them.
        below = _descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # first: once it is dead, Popen's kill would reap it behind asyncio's watcher
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _check(self) -> None:
        if self._failure is not None:
            raise SandboxError(self._failure)
        if self._proc is None:
            raise SandboxError("the sandbox is not started; call start() first")

    def _fail_pending(self, error: BaseException) -> None:
        for future in [self._inflight[2] if self._inflight else None, self._ready]:
            if future is not None and not future.done():
                future.set_exception(error)
                # The waiter may have given up already (its own timeout): don't log "never retrieved".
                future.add_done_callback(lambda f: f.exception())

    async def _fail(self, reason: str) -> None:
        """Mark the worker dead, kill it, fail every waiter and raise SandboxError(reason)."""
        if self._failure is None:
            self._failure = f"{reason}; the REPL state is lost; start a new session"
        self._kill()
        self._fail_pending(SandboxError(self._failure))
        raise SandboxError(self._failure)

    async def _exit_reason(self) -> str:
        proc = self._proc
        assert proc is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
        code = proc.returncode
        # bwrap reports a child's death by signal N as exit status 128+N.
        sig = -code if code is not None and code < 0 else None
        if self.isolation == "bwrap" and code is not None and code > 128:
            sig = code - 128
        if code is None:
            how = "closed its protocol pipe"
        elif sig is not None:
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            how = f"killed by signal {sig} ({name})"
            if sig == signal.SIGKILL and self._cgroup is not None and self._cgroup.oom_kills():
                how += f", out of memory (the sandbox's cap is {self.memory_mb} MB for all its processes)"
            elif sig == signal.SIGKILL:
                how += f", likely out of memory (cap {self.memory_mb} MB) or killed from outside"
        else:
            how = f"exit code {code}"
        tail = " | ".join(list(self._stderr_tail)[-3:])
        return f"the sandbox worker exited ({how})" + (f"; its last stderr: {tail[-400:]}" if tail else "")

    # ---- transport -------------------------------------------------------------------------------
    async def _send(self, message: dict[str, Any], blob: bytes | Path | None = None) -> None:
        """Write one message; a blob (bytes, or a host-owned file streamed in chunks) follows its line
        under the same lock, so no other message can interleave."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise SandboxError("the sandbox is not started; call start() first")
        size = 0 if blob is None else len(blob) if isinstance(blob, bytes) else blob.stat().st_size
        if blob is not None:
            message = {**message, "blob": size}
        data = json.dumps(message, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass") + b"\n"
        try:
            async with self._write_lock:
                proc.stdin.write(data)
                if isinstance(blob, bytes):
                    proc.stdin.write(blob)
                elif blob is not None:
                    await self._stream_file(proc.stdin, blob, size)
                await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            if self._failure is not None:
                raise SandboxError(self._failure) from exc
            await self._fail(await self._exit_reason())
        self.bytes_sent += len(data) + size

    @staticmethod
    async def _stream_file(writer: asyncio.StreamWriter, path: Path, size: int) -> None:
        # Exactly the announced size, even if the file changed since: the worker reads that many bytes.
        with path.open("rb") as fh:
            left = size
            while left:
                chunk = fh.read(min(BLOB_CHUNK, left)) or b"\0" * min(BLOB_CHUNK, left)
                writer.write(chunk)
                left -= len(chunk)
                await writer.drain()

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        stderr = self._proc.stderr
        while True:
            try:
                line = await stderr.readline()
            except ValueError:  # a line over the reader's limit: drop what is buffered and go on
                line = await stderr.read(64 * 1024) or b"\n"
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()[:2000]  # bounded: user code may spam stderr
            self._stderr_tail.append(text)
            logger.debug("sandbox worker: %s", text)

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        reason = None
        try:
            while line := await stdout.readline():
                self.bytes_received += len(line)
                message = await self._parse(line)
                self._dispatch(message, len(line))
                del line, message  # a refused call's 64 MB is not kept while the next line is awaited
        except ValueError as exc:  # StreamReader: a line over its limit
            reason = f"the sandbox worker sent a protocol message over the {MAX_MESSAGE_BYTES >> 20} MB limit ({exc})"
        except _ProtocolViolation as exc:
            reason = f"the sandbox broke the protocol ({exc}), so it was stopped"
        if self._failure is None and not self._closed:
            with contextlib.suppress(SandboxError):
                await self._fail(reason or await self._exit_reason())

    @staticmethod
    async def _parse(line: bytes) -> dict[str, Any]:
        try:
            # Big messages are decoded off the loop so other runs keep streaming.
            message = json.loads(line) if len(line) < 1 << 20 else await asyncio.to_thread(json.loads, line)
        except RecursionError:
            raise _ProtocolViolation("a message nested too deeply") from None
        except ValueError:
            raise _ProtocolViolation(f"not JSON: {line[:100]!r}") from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise _ProtocolViolation(f"not a message: {line[:100]!r}")
        if nesting_depth(message) > MAX_DEPTH:
            raise _ProtocolViolation(f"a message nested deeper than {MAX_DEPTH} levels")
        return message

    def _dispatch(self, message: dict[str, Any], size: int) -> None:
        """Accept a message (``size`` bytes on the wire) only where the request in flight allows it;
        anything else is forged."""
        op, msg_id = message["op"], message.get("id")
        current_op, reply = None, None  # set when the message answers the request in flight
        if self._inflight is not None and msg_id == self._inflight[0] and not self._inflight[2].done():
            _, current_op, reply = self._inflight
        if op == "ready":
            if self._ready is None or self._ready.done():
                raise _ProtocolViolation("a second 'ready'")
            self._ready.set_result(message)
        elif op == "output":
            data = message.get("data")
            if current_op != "execute" or not isinstance(data, str):
                raise _ProtocolViolation("output outside the running step")
            room = self.output_limit - self._streamed  # the worker caps it too; a forger might not
            if room > 0 and self._on_output is not None:
                self._streamed += min(room, len(data))
                try:
                    self._on_output(data[:room])
                except Exception:
                    logger.exception("on_output callback failed")
        elif op == "call":
            self._accept_call(message, size)
        elif op in ("done", "ok", "error"):
            if reply is None or (op == "done") != (current_op == "execute"):
                raise _ProtocolViolation(f"a {op!r} reply to no request in flight (id {msg_id!r})")
            reply.set_result(message)
        else:
            raise _ProtocolViolation(f"unknown message op {op[:40]!r}")

    def _accept_call(self, message: dict[str, Any], size: int) -> None:
        call_id, name = message.get("id"), message.get("name")
        args, kwargs = message.get("args", []), message.get("kwargs", {})
        if not (isinstance(call_id, int) and isinstance(name, str) and isinstance(args, list)):
            raise _ProtocolViolation("a malformed host call")
        if not isinstance(kwargs, dict) or call_id in self._calls:
            raise _ProtocolViolation(f"a malformed or repeated host call (id {call_id})")
        inflight = self._inflight
        if inflight is None or inflight[1] != "execute":
            error = f"{name}() can only be called while a step runs (not from a thread left running after it)"
        elif len(self._calls) >= MAX_HOST_CALLS:
            error = f"too many host calls at once (limit {MAX_HOST_CALLS}); use the *_batched functions"
        elif (refusal := self._host_bytes.take(size, name)) is not None:
            error = refusal
        else:
            self._calls.add(call_id)
            self._host_bytes.give_when_done(self._spawn(self._run_call(call_id, name, args, kwargs)), size)
            return
        self._spawn(self._send({"op": "result", "id": call_id, "ok": False, "error": f"RuntimeError: {error}"}))

    async def _request(
        self,
        message: dict[str, Any],
        *,
        limit: float | None = None,
        on_output: Callable[[str], None] | None = None,
        blob: bytes | Path | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its reply; at most one request is in flight.

        ``limit`` is the code's time limit, enforced by the worker; the host only steps in when the
        worker stays silent STUCK_GRACE seconds longer than that."""
        async with self._request_lock:
            self._check()
            req_id = next(self._ids)
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._inflight = (req_id, message["op"], future)
            self._on_output, self._streamed = on_output, 0
            deadline = None if limit is None else limit + STUCK_GRACE
            try:
                await self._send({**message, "id": req_id}, blob)
                try:
                    async with asyncio.timeout(deadline):  # one wake-up on the reply (wait_for takes three)
                        reply = await future
                except TimeoutError:
                    await self._fail(
                        f"the sandbox worker did not answer within {deadline:g} s although the code's time "
                        f"limit of {limit:g} s had passed (probably stuck in C code that ignores signals), "
                        "so it was killed"
                    )
                    raise  # unreachable: _fail raises
            finally:
                self._inflight, self._on_output = None, None
            if reply["op"] == "error":
                raise ValueError(f"sandbox rejected {message['op']}: {str(reply.get('error'))[:2000]}")
            return reply

    # ---- host calls from user code ---------------------------------------------------------------
    async def _run_call(self, call_id: int, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        try:
            reply = {"op": "result", "id": call_id, **await answer_host_call(self._functions, name, args, kwargs)}
        finally:
            self._calls.discard(call_id)
        with contextlib.suppress(SandboxError):
            await self._send(reply)

    # ---- public requests -------------------------------------------------------------------------
    async def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> ExecResult:
        """Run code in the persistent namespace. User errors come back in the result; SandboxError
        means the worker is gone."""
        await self.start()
        limit = timeout if timeout is not None else self.exec_timeout
        message = {"op": "execute", "code": code, "timeout": limit, "output_limit": self.output_limit}
        try:
            reply = await self._request(message, limit=limit, on_output=on_output)
        finally:  # also when the worker died mid-step: what it wrote stays capped
            over_quota = await self._enforce_work_quota()
        try:
            result = self._exec_result(reply)
        except _ProtocolViolation as exc:
            await self._fail(f"the sandbox broke the protocol ({exc}), so it was stopped")
            raise  # unreachable: _fail raises
        ooms = self._cgroup.oom_kills() if self._cgroup else 0  # one read a step, against the last count
        killed, self._oom_kills = ooms - self._oom_kills, ooms
        if killed > 0:  # a child died for memory; the step itself went on, so say it
            result.stdout += (
                f"\n[sandbox] the out-of-memory killer ended {killed} process(es) of this step: all processes "
                f"of the sandbox together are capped at {self.memory_mb} MB\n"
            )
        if over_quota:
            result.stdout += f"\n[sandbox] {over_quota}\n"
        return result

    async def _enforce_work_quota(self) -> str | None:
        """Trim what was written to the work folder since the last check back under its quota (any
        process of the sandbox may write between steps too); the message for the model, or None."""
        since, self._work_checked = self._work_checked, time.time()
        return await asyncio.to_thread(self._trim_work, since)

    def _trim_work(self, since: float) -> str | None:
        # The work folder's parents are host-only scratch folders no sandbox can write, so this path
        # cannot be swapped; below it everything is walked fd-relatively, links never followed.
        try:
            fd = os.open(self.work_dir, DIR_FLAGS)
        except OSError:
            return None  # never created, or removed already
        with closing_fd(fd):
            return trim(fd, f"the work folder {self.sandbox_work_dir}", scan(fd), self.work_quota, since)

    def _exec_result(self, reply: dict[str, Any]) -> ExecResult:
        return exec_result(reply, self.output_limit)

    async def configure_output_fields(self, fields: list[dict[str, Any]]) -> None:
        """Declare SUBMIT's fields ([{"name", "type"}...]); kept across restarts of the request."""
        self._output_fields = [dict(f) for f in fields]
        if self._proc is not None:
            await self._request({"op": "configure", "output_fields": self._output_fields})

    async def set_var(self, name: str, value: Any) -> None:
        """Bind a JSON value as a global; use put_text for big text."""
        await self.start()
        await self._request({"op": "set_var", "name": name, "value": value})

    async def put_text(self, name: str, data: str | Path) -> None:
        """Bind text as a global. A Path must be a host-owned file (never one the sandbox can write);
        it is streamed through the pipe, so nothing inside the sandbox's folders is read."""
        blob = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else Path(data)
        await self.start()
        await self._request({"op": "put_text", "name": name}, blob=blob)

    async def append_var(self, name: str, value: Any) -> None:
        """Append to a list global: one step's entry, not the whole list again."""
        await self.start()
        await self._request({"op": "append_var", "name": name, "value": value})

    async def put_file(self, path: str, data: Path) -> None:
        """Write a host-owned file into the work folder, through the pipe (the worker writes it)."""
        await self.start()
        await self._request({"op": "put_file", "path": input_file_path(path)}, blob=Path(data))

    async def register_functions(self, fns: dict[str, HostFunction]) -> None:
        """Add or replace host functions; defined in the namespace right away if the worker runs."""
        self._functions.update(fns)
        if self._proc is not None and fns:
            await self._request({"op": "define_functions", "names": list(fns)})


_ProtocolViolation = ProtocolViolation


def _local_sandbox(settings: Any, spec: SandboxSpec) -> LocalSandbox:
    return LocalSandbox(
        spec.work_dir,
        volumes=spec.volumes,
        isolation=settings.isolation,
        memory_mb=spec.memory_mb,
        max_procs=spec.max_procs,
        exec_timeout=spec.exec_timeout,
        output_limit=spec.output_limit,
        host_call_mb=spec.host_call_mb,
        host_call_total_mb=spec.host_call_total_mb,
        work_quota_mb=spec.work_quota_mb,
        work_max_files=spec.work_max_files,
        read_only_volumes=spec.read_only_volumes,
    )


def _local_check(settings: Any) -> None:
    """Refuse a run before it exists where its sandbox would refuse to start (root, no isolation)."""
    if settings.isolation == "auto" and hasattr(os, "geteuid") and os.geteuid() == 0:
        from fleet_rlm.config import ConfigError

        try:
            _refuse_root_unisolated(detect_isolation()[0])
        except SandboxError as exc:
            raise ConfigError(str(exc)) from None


def _local_doctor(settings: Any) -> dict[str, dict[str, Any]]:
    from fleet_rlm.sandbox.caps import caps_check

    level, detail = detect_isolation()
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if settings.isolation == "none":
        who = "as root" if root else "with your user's permissions"
        level, detail = "none", f"FLEET_ISOLATION=none: code runs unisolated, {who}"
    elif level != "bwrap" and root:
        detail = detail.partition(";")[0] + "; as root, runs are refused until it is or FLEET_ISOLATION=none is set"
    row: dict[str, Any] = {"ok": level == "bwrap", "isolation": level, "detail": detail}
    if level != "bwrap":
        row["fix"] = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) and use FLEET_ISOLATION=auto"
    return {"sandbox": row, "caps": caps_check(settings, level)}


register_backend(
    Backend(
        "local",
        _local_sandbox,
        _local_doctor,
        "a persistent Python worker on this machine (bubblewrap)",
        check=_local_check,
        warm_up=lambda _settings: detect_isolation(),  # two bwrap processes: waiting, not computing
    )
)
