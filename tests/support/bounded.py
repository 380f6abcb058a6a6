"""Calls that must never block (on a named pipe, a socket...), run under a harness deadline.

The deadline only stops a hung test from hanging the suite; no test asserts how fast anything is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
DEADLINE = 60.0


def release_pipe(path: Path) -> None:
    """Open a named pipe's write end once, so a reader blocked on it wakes up."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def finishes(fn: Callable[[], T], *, pipes: tuple[Path, ...] = (), deadline: float = DEADLINE) -> T:
    """``fn()``'s result (or exception); fails the test if it is still blocked at the deadline."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        for pipe in pipes:  # let the stuck thread go before failing
            release_pipe(pipe)
        pytest.fail(f"the call blocked: still running after {deadline:.0f} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
