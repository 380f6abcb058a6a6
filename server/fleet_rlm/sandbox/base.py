"""The sandbox seam: what every code-execution backend implements, and the registry that picks one.

A backend runs one persistent Python REPL. Everything crosses the boundary as data (code,
variables, text, files, host-call arguments and replies), never as a host path the sandbox could
redirect, so a remote backend implements the same surface. Backends register themselves in
``BACKENDS`` exactly like a third-party one would (``register_backend``); ``settings.sandbox``
names the one to use.

Trust: everything a sandbox sends back is hostile input. Backends validate each message against
the request in flight and fail the sandbox (``SandboxError``) on anything else.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from fleet_rlm.errors import Unavailable
from fleet_rlm.redaction import redact_text

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

HostFunction = Callable[..., Awaitable[Any]]
# "unknown": the connection to a remote sandbox broke while the step ran; it was not run again.
ErrorKind = Literal["syntax", "exception", "timeout", "memory", "unknown"]
ERROR_KINDS: tuple[str, ...] = ("syntax", "exception", "timeout", "memory", "unknown")

# Largest single protocol message either side accepts (a SUBMIT payload, a batch of prompts).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Deepest nesting of lists/dicts accepted in a message (JSON recursion is a denial of service).
MAX_DEPTH = 64
# How bytes in a host call's arguments cross as JSON: {BYTES_TAG: "<base64>"} (worker.py writes it; the
# host function that takes bytes, llm_query's images, reads it back). Keep in step with worker.BYTES_TAG.
BYTES_TAG = "__fleet_bytes__"
MB = 1024 * 1024


@dataclass
class ExecResult:
    """What one ``execute`` produced. ``value`` is the trailing expression's repr (for display);
    ``data`` is the value itself when it is plain JSON data (str, numbers, lists, dicts)."""

    stdout: str
    value: str | None
    error: str | None
    error_kind: ErrorKind | None
    final: dict[str, Any] | None
    duration: float
    data: Any = None


async def answer_host_call(
    functions: dict[str, HostFunction], name: str, args: list[Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Run one host call the sandboxed code made: ``{"ok": True, "value": ...}``, or ``{"ok": False,
    "error": ...}`` with the error masked (a model error may quote the key) before it enters the
    sandbox. A value that cannot cross as JSON fails here, as the call's error."""
    try:
        fn = functions.get(name)
        if fn is None:
            raise LookupError(f"no host function named {name!r}")
        value = await fn(*args, **kwargs)
        json.dumps(value, default=str)
        return {"ok": True, "value": value}
    except Exception as exc:
        reply = {"ok": False, "error": redact_text(f"{type(exc).__name__}: {exc}")}
        if isinstance(exc, (PermissionError, TimeoutError)):  # the REPL raises these as themselves (worker.py)
            reply["error_type"] = "PermissionError" if isinstance(exc, PermissionError) else "TimeoutError"
        return reply


class HostCallBudget:
    """Bytes of host-call messages one sandbox has on the host: a call's arguments (prompts,
    contexts) stay in host memory until its reply is written back. Bounded per sandbox and, summed
    over every sandbox, per process. A call past either bound is refused at once, never queued:
    a reader waiting for room could deadlock a parent whose ``rlm_query`` waits on its child's calls."""

    _lock = threading.Lock()
    _process_held = 0  # every sandbox of this process together

    def __init__(self, sandbox_mb: int, process_mb: int) -> None:
        self.limit, self.process_limit = sandbox_mb * MB, process_mb * MB
        self.held = 0

    def take(self, size: int, name: str) -> str | None:
        """Hold ``size`` bytes for a call to ``name``; else the refusal the sandboxed code reads."""
        with self._lock:
            if self.held + size > self.limit:
                return (
                    f"{name}() refused: {size / MB:.1f} MB of arguments, with {self.held / MB:.1f} MB of this "
                    f"sandbox's calls still being answered, is over the {self.limit // MB} MB it may have waiting "
                    "on the host (FLEET_HOST_CALL_MB); wait for those calls, or split the prompt into smaller pieces"
                )
            if HostCallBudget._process_held + size > self.process_limit:
                return (
                    f"{name}() refused: the host holds {HostCallBudget._process_held / MB:.1f} MB of calls from "
                    f"all sandboxes and {size / MB:.1f} MB more is over its {self.process_limit // MB} MB limit "
                    "(FLEET_HOST_CALL_TOTAL_MB); try again shortly, or split the prompt into smaller pieces"
                )
            self.held += size
            HostCallBudget._process_held += size
        return None

    def give_when_done(self, task: asyncio.Future[Any], size: int) -> None:
        """Free ``size`` bytes once the task answering the call ends (its arguments die with it), however
        it ends: cancelled before it ever ran included."""
        task.add_done_callback(lambda _: self._give(size))

    def _give(self, size: int) -> None:
        with self._lock:
            self.held -= size
            HostCallBudget._process_held -= size


class SandboxError(Unavailable, RuntimeError):
    """Terminal failure: the worker died or broke the protocol; the REPL state is gone. The message
    says what happened and what to do, like every ``FleetError``."""


@dataclass
class SandboxSpec:
    """What a backend needs to create one sandbox. ``work_dir`` is a host folder created for this
    sandbox alone (backends that run elsewhere may ignore it); ``volumes`` maps a volume name to
    its host folder."""

    work_dir: Path
    volumes: dict[str, Path] = field(default_factory=dict)
    memory_mb: int = 2048
    max_procs: int = 64
    exec_timeout: float | None = 300.0
    output_limit: int = 1_000_000
    host_call_mb: int = 128  # host-call bytes this sandbox may have on the host at once
    host_call_total_mb: int = 512  # ... and every sandbox of this process together
    work_quota_mb: int = 1024  # disk use of ``work_dir`` (backends that use it)
    work_max_files: int = 100_000
    near: Any = None  # the parent node's sandbox: a backend may place this one beside it (same machine)
    # A replay's: its code reads the volumes as they are, and what it writes there fails instead of
    # happening twice (docs/replay.md). Backends that cannot say so leave ``volumes_read_only`` unset.
    read_only_volumes: bool = False


@runtime_checkable
class Sandbox(Protocol):
    """One persistent REPL. Every method may raise ``SandboxError`` once the REPL is gone."""

    isolation: str  # how it is isolated, e.g. "bwrap", "none", "daytona"
    volume_paths: dict[str, str]  # volume name -> path as the code inside sees it

    @property
    def warnings(self) -> list[str]:
        """What a user must know about this sandbox once started (weaker isolation, caps not held)."""

    @property
    def alive(self) -> bool: ...

    async def start(self) -> None:
        """Start the REPL (a no-op when running); raises SandboxError if it cannot."""

    async def execute(
        self, code: str, *, timeout: float | None = None, on_output: Callable[[str], None] | None = None
    ) -> ExecResult:
        """Run code in the persistent namespace; user errors come back in the result."""

    async def set_var(self, name: str, value: Any) -> None:
        """Bind a small JSON value as a global."""

    async def put_text(self, name: str, data: str | Path) -> None:
        """Bind text as a global; a Path is a host-owned file the backend streams in."""

    async def append_var(self, name: str, value: Any) -> None:
        """Append a small JSON value to the list bound to ``name`` (ValueError if it is not a list)."""

    async def put_file(self, path: str, data: Path) -> None:
        """Write a host-owned file into the work folder at ``path`` (relative), for the code to open."""

    async def register_functions(self, fns: dict[str, HostFunction]) -> None:
        """Define host functions the code can call (bridged back to the host)."""

    async def configure_output_fields(self, fields: list[dict[str, Any]]) -> None:
        """Declare SUBMIT's fields ([{"name", "type"}...])."""

    async def shutdown(self) -> None:
        """Stop the REPL and release everything; safe to call repeatedly."""


SandboxFactory = Callable[["Settings", SandboxSpec], Sandbox]
DoctorCheck = Callable[["Settings"], dict[str, Any]]


def input_file_path(path: str) -> str:
    """``path`` if it is a plain relative path inside the work folder (``put_file``), else ValueError."""
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"an input file's path must be relative, inside the work folder: not {str(path)[:80]!r}")
    return path


@dataclass
class Backend:
    """A registered backend: how to build a sandbox and how doctor checks it."""

    name: str
    factory: SandboxFactory
    doctor: DoctorCheck
    description: str = ""
    check: Callable[[Settings], None] | None = None  # raises ConfigError (with the fix) if unusable as set
    # Slow checks whose result the process keeps (probing the OS): run in a thread while the runtime imports.
    warm_up: Callable[[Settings], None] | None = None


BACKENDS: dict[str, Backend] = {}
BUILT_IN = ("local", "daytona")  # modules of this package, imported on first use


def register_backend(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


def get_backend(name: str) -> Backend:
    """The backend called ``name``; built-ins are imported on first use (keeps imports cheap)."""
    if name not in BACKENDS and name in BUILT_IN:
        importlib.import_module(f"fleet_rlm.sandbox.{name}")  # registers itself
    if name not in BACKENDS:
        known = ", ".join(sorted({*BACKENDS, *BUILT_IN}))
        raise SandboxError(f"no sandbox backend named {name!r} in this version (known: {known})")
    return BACKENDS[name]


def create_sandbox(settings: Settings, spec: SandboxSpec) -> Sandbox:
    """A new sandbox of the kind ``settings.sandbox`` names."""
    return get_backend(settings.sandbox).factory(settings, spec)


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Depth of nested lists/dicts, iteratively (never recursion on hostile data); stops past limit."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


class ProtocolViolation(Exception):
    """The sandbox sent something its protocol does not allow at this point."""


def cap_middle(text: str, limit: int) -> str:
    """Keep head and tail of long output, saying how much was left out (used for what the model sees)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    dropped = len(text) - 2 * half
    return f"{text[:half]}\n... [{dropped:,} characters omitted] ...\n{text[-half:]}"


def exec_result(reply: dict[str, Any], output_limit: int) -> ExecResult:
    """Check a worker's ``done`` reply field by field (hostile code's process wrote it)."""

    def text(key: str) -> str | None:
        value = reply.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ProtocolViolation(f"'done' field {key!r} is not text")
        return cap_middle(value, output_limit + 1024)  # a backstop: the worker caps (plus its marker)

    kind, final, duration = reply.get("error_kind"), reply.get("final"), reply.get("duration")
    if kind is not None and kind not in ERROR_KINDS:
        raise ProtocolViolation(f"unknown error kind {str(kind)[:40]!r}")
    if final is not None and not isinstance(final, dict):
        raise ProtocolViolation("'done' field 'final' is not an object")
    if not isinstance(duration, (int, float)) or isinstance(duration, bool):
        raise ProtocolViolation("'done' field 'duration' is not a number")
    return ExecResult(
        stdout=text("stdout") or "",
        value=text("value"),
        error=text("error"),
        error_kind=kind,
        final=final,
        duration=float(duration),
        data=reply.get("data"),
    )
