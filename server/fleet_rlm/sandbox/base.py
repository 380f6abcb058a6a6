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

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

HostFunction = Callable[..., Awaitable[Any]]
ErrorKind = Literal["syntax", "exception", "timeout", "memory"]
ERROR_KINDS: tuple[str, ...] = ("syntax", "exception", "timeout", "memory")

# Largest single protocol message either side accepts (a SUBMIT payload, a batch of prompts).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Deepest nesting of lists/dicts accepted in a message (JSON recursion is a denial of service).
MAX_DEPTH = 64


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


class SandboxError(RuntimeError):
    """Terminal failure: the worker died or broke the protocol; the REPL state is gone."""


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

    async def register_functions(self, fns: dict[str, HostFunction]) -> None:
        """Define host functions the code can call (bridged back to the host)."""

    async def configure_output_fields(self, fields: list[dict[str, Any]]) -> None:
        """Declare SUBMIT's fields ([{"name", "type"}...])."""

    async def shutdown(self) -> None:
        """Stop the REPL and release everything; safe to call repeatedly."""


SandboxFactory = Callable[["Settings", SandboxSpec], Sandbox]
DoctorCheck = Callable[["Settings"], dict[str, Any]]


@dataclass
class Backend:
    """A registered backend: how to build a sandbox and how doctor checks it."""

    name: str
    factory: SandboxFactory
    doctor: DoctorCheck
    description: str = ""


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


def get_backend(name: str) -> Backend:
    """The backend called ``name``; built-ins are imported on first use (keeps imports cheap)."""
    if name not in BACKENDS and name == "local":
        import fleet_rlm.sandbox.local  # noqa: F401  (registers itself)
    if name not in BACKENDS:
        known = ", ".join(sorted({*BACKENDS, "local"}))
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
