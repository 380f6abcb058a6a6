"""One-off helper processes under the sandbox's isolation: for host code that must run something on
untrusted bytes (a document parser), not for the model's code (that is ``LocalSandbox``).

The same bubblewrap flags as a sandbox (no network, read-only system, no capabilities, uid 65534,
the seccomp filter, no /proc), no work folder at all: the process gets its input through stdin and
answers through stdout. Where bubblewrap is unavailable it runs as ``python -I -S`` with a
scrubbed environment; as root that is refused unless FLEET_ISOLATION=none accepted it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleet_rlm.sandbox.local import (  # the sandbox's own flags, so the two cannot drift apart
    _SEAL,
    _bwrap,
    _python,
    _seccomp_fd,
    _system_binds,
    choose_isolation,
)

INSIDE = "/fleet"
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "1"}


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]
    isolated: bool


@contextlib.contextmanager
def python_command(script: Path, args: list[str], libs: list[Path], isolation: str = "auto") -> Iterator[Command]:
    """The command that runs ``script`` with ``args``; each folder of ``libs`` (a package) is bound
    read-only and importable. The last argument the script gets is the folder to put on sys.path.
    The fds in ``pass_fds`` are valid until the context exits (start the process inside it)."""
    if choose_isolation(isolation) == "none":
        lib_dir = str(libs[0].parent) if libs else ""
        yield Command([_python(), "-I", "-S", str(script), *args, lib_dir], dict(_ENV), (), False)
        return
    with _seccomp_fd() as filter_args:
        argv = [*_bwrap(filter_args), *_system_binds()]
        argv += ["--ro-bind", str(script), f"{INSIDE}/{script.name}"]
        for lib in libs:
            argv += ["--ro-bind", str(lib), f"{INSIDE}/lib/{lib.name}"]
        for key, value in _ENV.items():
            argv += ["--setenv", key, value]
        argv += [*_SEAL, "--chdir", "/", _python(), "-I", "-S", f"{INSIDE}/{script.name}", *args]
        argv.append(f"{INSIDE}/lib")
        fds = (int(filter_args[1]),) if filter_args else ()
        yield Command(argv, {"PATH": "/usr/bin:/bin"}, fds, True)
