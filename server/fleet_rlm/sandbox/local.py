"""Async host side of the local code sandbox: spawns ``worker.py`` (under bubblewrap when usable)
and speaks its newline-delimited JSON protocol (see the worker module docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

HostFunction = Callable[..., Awaitable[Any]]

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
SANDBOX_ROOT = "/fleet"
SANDBOX_WORK_DIR = "/fleet/work"
STARTUP_TIMEOUT = 30.0
KILL_GRACE = 2.0  # seconds a worker gets to exit after "shutdown" before SIGKILL
STUCK_GRACE = 10.0  # extra seconds past an execute timeout before the worker is presumed stuck


@dataclass
class ExecResult:
    stdout: str
    value: str | None
    error: str | None
    error_kind: str | None  # None | "syntax" | "exception" | "timeout" | "memory"
    final: dict[str, Any] | None
    duration: float


class SandboxError(RuntimeError):
    """Terminal failure: the worker died or the protocol broke; the REPL state is gone."""


def _python() -> str:
    # The real base interpreter: a venv's python is a symlink into the home, which the sandbox can't see.
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


TMP_BYTES = 64 * 1024 * 1024


def _system_binds() -> list[str]:
    """Read-only binds (or symlinks, on merged-/usr systems) of what the interpreter needs."""
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
    # /tmp lives in RAM, outside the memory cap: keep it small; the work folder is for real files.
    return [*args, "--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]


_BWRAP_BASE = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]


@functools.cache
def detect_isolation() -> tuple[str, str]:
    """Return ("bwrap", description) if bubblewrap really works here, else ("none", how to fix)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "none", (
            "bubblewrap not found: install the Debian package 'bubblewrap' (apt-get install bubblewrap) "
            "to isolate the sandbox; code now runs unisolated (scrubbed env and rlimits only)"
        )
    # bwrap can be installed yet unusable (no user namespaces, seccomp'd container): try it once.
    cmd = [bwrap, *_BWRAP_BASE, *_system_binds(), _python(), "-I", "-S", "-c", "pass"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        proc, version = None, str(exc)
    if proc is None or proc.returncode != 0:
        detail = version if proc is None else proc.stderr.strip()[:300]
        return "none", (
            f"bubblewrap is installed but cannot create a sandbox here ({detail}); enable unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run with isolation='none'"
        )
    return "bwrap", (
        f"{version.strip() or 'bubblewrap'}, no network, read-only system, "
        "only the work dir and volumes writable"
    )


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
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.volumes = {name: Path(p).resolve() for name, p in (volumes or {}).items()}
        for name in self.volumes:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"invalid volume name {name!r}")
        if isolation == "auto":
            isolation = detect_isolation()[0]  # type: ignore[assignment]
        elif isolation == "bwrap" and detect_isolation()[0] != "bwrap":
            raise SandboxError(detect_isolation()[1])
        elif isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'none', not {isolation!r}")
        self.isolation: str = isolation
        bwrap = isolation == "bwrap"
        self.sandbox_work_dir = SANDBOX_WORK_DIR if bwrap else str(self.work_dir)
        self.volume_paths = {
            name: f"{SANDBOX_ROOT}/volumes/{name}" if bwrap else str(path)
            for name, path in self.volumes.items()
        }
        if memory_mb < 64:  # the interpreter and its protocol threads need this much address space
            raise ValueError(f"memory_mb must be at least 64, not {memory_mb}")
        self.memory_mb = memory_mb
        self.max_procs = max_procs
        self.exec_timeout = exec_timeout
        self.output_limit = output_limit
        self.env = dict(env or {})
        self.bytes_sent = 0  # protocol traffic, for diagnostics (and to prove big data avoids the pipe)
        self.bytes_received = 0
        self._functions: dict[str, HostFunction] = dict(host_functions or {})
        self._output_fields: list[dict[str, Any]] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._on_output: dict[int, Callable[[str], None]] = {}
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._request_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._failure: str | None = None  # set once the worker is gone; every later call raises it
        self._closed = False

    # ---- paths -----------------------------------------------------------------------------------
    def sandbox_path(self, host_path: Path) -> str:
        """Map a host path under work_dir or a volume to the path code inside the sandbox sees."""
        path = Path(host_path).resolve()
        roots = [(self.work_dir, self.sandbox_work_dir)]
        roots += [(p, self.volume_paths[n]) for n, p in self.volumes.items()]
        for root, inside in roots:
            if path == root or path.is_relative_to(root):
                rel = path.relative_to(root).as_posix()
                return inside if rel == "." else f"{inside}/{rel}"
        raise ValueError(f"{host_path} is outside the work dir and volumes, so the sandbox cannot see it")

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._failure is None

    @property
    def pid(self) -> int | None:
        """Pid of the spawned process (bwrap itself under bwrap isolation)."""
        return self._proc.pid if self._proc is not None else None

    # ---- lifecycle -------------------------------------------------------------------------------
    def _command(self) -> tuple[list[str], dict[str, str] | None, str | None]:
        limits = ["--memory-mb", str(self.memory_mb), "--max-procs", str(self.max_procs)]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.sandbox_work_dir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            # RLIMIT_AS counts reserved address space; glibc's per-thread 64 MB malloc arenas would eat it.
            "MALLOC_ARENA_MAX": "2",
            **self.env,
        }
        if self.isolation == "none":
            cmd = [_python(), "-I", "-S", "-u", str(WORKER_SCRIPT), "--workdir", str(self.work_dir), *limits]
            return cmd, env, str(self.work_dir)
        cmd = [shutil.which("bwrap") or "bwrap", *_BWRAP_BASE, *_system_binds()]
        cmd += ["--ro-bind", str(WORKER_SCRIPT), f"{SANDBOX_ROOT}/worker.py"]
        cmd += ["--bind", str(self.work_dir), SANDBOX_WORK_DIR]
        for name, path in self.volumes.items():
            cmd += ["--bind", str(path), self.volume_paths[name]]
        for key, value in env.items():
            cmd += ["--setenv", key, value]
        cmd += ["--chdir", SANDBOX_WORK_DIR, _python(), "-I", "-S", "-u", f"{SANDBOX_ROOT}/worker.py"]
        cmd += ["--workdir", SANDBOX_WORK_DIR, *limits]
        return cmd, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, None

    async def start(self) -> None:
        """Spawn the worker and define the host functions; a no-op when already running."""
        async with self._start_lock:
            if self._closed:
                raise SandboxError("the sandbox was shut down; create a new LocalSandbox")
            if self._proc is not None:
                self._check()
                return
            self.work_dir.mkdir(parents=True, exist_ok=True)
            (self.work_dir / ".xfer").mkdir(exist_ok=True)
            for path in self.volumes.values():
                path.mkdir(parents=True, exist_ok=True)
            cmd, env, cwd = self._command()
            # Longest accepted protocol line (a bound, not an allocation): stdout and value are capped at
            # output_limit chars (<= 6 bytes each as JSON), but a SUBMIT payload is not capped.
            limit = max(256 * 1024 * 1024, self.output_limit * 16)
            self._proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
                limit=limit,
            )
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

    async def shutdown(self) -> None:
        """Stop the worker (graceful, then SIGKILL); safe to call repeatedly."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            if proc.returncode is None and self._failure is None:
                with contextlib.suppress(Exception):
                    await self._send({"op": "shutdown"})
            with contextlib.suppress(Exception):
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(proc.wait(), KILL_GRACE)
            except TimeoutError:
                self._kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), KILL_GRACE)
        self._failure = self._failure or "the sandbox was shut down; create a new LocalSandbox"
        self._fail_pending(SandboxError(self._failure))
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            # asyncio's Process has no public close(); an unclosed transport warns (or errors, once
            # the loop is closed) when garbage-collected.
            transport.close()

    def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        # Its own session/process group (start_new_session), so this reaches any children too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check(self) -> None:
        if self._failure is not None:
            raise SandboxError(self._failure)
        if self._proc is None:
            raise SandboxError("the sandbox is not started; call start() first")

    def _fail_pending(self, error: BaseException) -> None:
        for future in [*self._pending.values(), self._ready]:
            if future is not None and not future.done():
                future.set_exception(error)
                # The waiter may have given up already (its own timeout): don't log "never retrieved".
                future.add_done_callback(lambda f: f.exception())
        self._pending.clear()

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
            if sig == signal.SIGKILL:
                how += f", likely out of memory (cap {self.memory_mb} MB) or killed from outside"
        else:
            how = f"exit code {code}"
        tail = " | ".join(list(self._stderr_tail)[-3:])
        return f"the sandbox worker exited ({how})" + (f"; its last stderr: {tail[-400:]}" if tail else "")

    # ---- transport -------------------------------------------------------------------------------
    async def _send(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise SandboxError("the sandbox is not started; call start() first")
        data = json.dumps(message, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass") + b"\n"
        try:
            async with self._write_lock:
                proc.stdin.write(data)
                await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            if self._failure is not None:
                raise SandboxError(self._failure) from exc
            await self._fail(await self._exit_reason())
        self.bytes_sent += len(data)

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while line := await self._proc.stderr.readline():
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
                try:
                    message = json.loads(line)
                except ValueError:
                    reason = f"the sandbox worker broke the protocol (sent {line[:100]!r})"
                    break
                self._dispatch(message)
        except (ValueError, asyncio.LimitOverrunError):
            reason = "the sandbox worker sent a protocol message over the size limit"
        if self._failure is None and not self._closed:
            with contextlib.suppress(SandboxError):
                await self._fail(reason or await self._exit_reason())

    def _dispatch(self, message: dict[str, Any]) -> None:
        op, msg_id = message.get("op"), message.get("id")
        if op == "call":
            self._spawn(self._run_call(message))
        elif op == "output":
            callback = self._on_output.get(msg_id)  # type: ignore[arg-type]
            if callback is not None:
                try:
                    callback(message.get("data", ""))
                except Exception:
                    logger.exception("on_output callback failed")
        elif op == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        elif op in ("done", "ok", "error"):
            future = self._pending.pop(msg_id, None)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(message)
        else:
            logger.warning("sandbox worker sent an unknown message op=%r", op)

    async def _request(
        self,
        message: dict[str, Any],
        *,
        limit: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its reply; at most one request is in flight.

        ``limit`` is the code's time limit, enforced by the worker; the host only steps in when the
        worker stays silent STUCK_GRACE seconds longer than that."""
        async with self._request_lock:
            self._check()
            req_id = next(self._ids)
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._pending[req_id] = future
            if on_output is not None:
                self._on_output[req_id] = on_output
            deadline = None if limit is None else limit + STUCK_GRACE
            try:
                await self._send({**message, "id": req_id})
                try:
                    reply = await asyncio.wait_for(asyncio.shield(future), deadline)
                except TimeoutError:
                    await self._fail(
                        f"the sandbox worker did not answer within {deadline:g} s although the code's time "
                        f"limit of {limit:g} s had passed (probably stuck in C code that ignores signals), "
                        "so it was killed"
                    )
                    raise  # unreachable: _fail raises
            finally:
                self._pending.pop(req_id, None)
                self._on_output.pop(req_id, None)
            if reply.get("op") == "error":
                raise ValueError(f"sandbox rejected {message.get('op')}: {reply.get('error')}")
            return reply

    # ---- host calls from user code ---------------------------------------------------------------
    def _resolve(self, value: Any) -> Any:
        """Read a spooled big string ({"__file__": ".xfer/x.txt"}) and delete its file."""
        if isinstance(value, dict) and set(value) == {"__file__"} and isinstance(value["__file__"], str):
            xfer = (self.work_dir / ".xfer").resolve()
            path = (self.work_dir / value["__file__"]).resolve()
            if path.parent != xfer:  # never let sandbox code make the host read arbitrary files
                raise ValueError(f"spooled argument path {value['__file__']!r} is outside .xfer")
            text = path.read_text(encoding="utf-8", errors="surrogatepass")
            path.unlink()
            return text
        return value

    def _resolve_arg(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        if isinstance(value, dict) and set(value) != {"__file__"}:
            return {k: self._resolve(v) for k, v in value.items()}
        return self._resolve(value)

    @staticmethod
    def _has_spooled(values: list[Any]) -> bool:
        def marked(v: Any) -> bool:
            return isinstance(v, dict) and "__file__" in v

        for value in values:
            inner = (
                list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
            )
            if marked(value) or any(marked(v) for v in inner):
                return True
        return False

    async def _run_call(self, message: dict[str, Any]) -> None:
        name = message.get("name")
        try:
            fn = self._functions.get(name)  # type: ignore[arg-type]
            if fn is None:
                raise LookupError(f"no host function named {name!r}")
            args, kwargs = message.get("args", []), message.get("kwargs", {})
            if self._has_spooled([*args, *kwargs.values()]):  # big file reads stay off the event loop
                args = await asyncio.to_thread(lambda: [self._resolve_arg(a) for a in args])
                kwargs = await asyncio.to_thread(lambda: {k: self._resolve_arg(v) for k, v in kwargs.items()})
            value = await fn(*args, **kwargs)
            json.dumps(value, default=str)
            reply = {"op": "result", "id": message.get("id"), "ok": True, "value": value}
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            reply = {"op": "result", "id": message.get("id"), "ok": False, "error": error}
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
        reply = await self._request(message, limit=limit, on_output=on_output)
        return ExecResult(
            stdout=reply.get("stdout") or "",
            value=reply.get("value"),
            error=reply.get("error"),
            error_kind=reply.get("error_kind"),
            final=reply.get("final"),
            duration=float(reply.get("duration") or 0.0),
        )

    async def configure_output_fields(self, fields: list[dict[str, Any]]) -> None:
        """Declare SUBMIT's fields ([{"name", "type"}...]); kept across restarts of the request."""
        self._output_fields = [dict(f) for f in fields]
        if self._proc is not None:
            await self._request({"op": "configure", "output_fields": self._output_fields})

    async def set_var(self, name: str, value: Any) -> None:
        """Bind a JSON value as a global. It crosses the pipe: use load_text for big text."""
        await self.start()
        await self._request({"op": "set_var", "name": name, "value": value})

    async def load_text(self, name: str, host_path: Path) -> None:
        """Bind a UTF-8 file's text as a global; the worker reads the file, nothing crosses the pipe."""
        inside = self.sandbox_path(host_path)  # ValueError when the sandbox cannot see the file
        await self.start()
        await self._request({"op": "load_text", "name": name, "path": inside})

    async def register_functions(self, fns: dict[str, HostFunction]) -> None:
        """Add or replace host functions; defined in the namespace right away if the worker runs."""
        self._functions.update(fns)
        if self._proc is not None and fns:
            await self._request({"op": "define_functions", "names": list(fns)})
