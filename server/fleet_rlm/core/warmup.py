"""What a process can start before it imports the runtime: the sandbox backend's slow checks, run in
a thread while the main thread imports dspy (``core.engine``), so their waiting overlaps that import.

Only waiting overlaps (the GIL runs one thread's Python at a time), and two threads importing at once
can deadlock on the import locks: so this module and the backend are imported by the caller, before
the thread starts, and the thread imports nothing. No dspy here (docs/benchmarks.md, `cli` figure)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fleet_rlm.config import Settings
from fleet_rlm.sandbox.base import SandboxError, get_backend

log = logging.getLogger(__name__)


def start_warm_up(settings: Settings) -> threading.Thread | None:
    """Start the sandbox backend's warm-up in a daemon thread; None when it has none (or none is set)."""
    try:
        backend = get_backend(settings.sandbox)  # imports the backend's module here, in the caller's thread
    except SandboxError:  # the run refuses it, with the fix; nothing to warm up
        return None
    if backend.warm_up is None:
        return None
    thread = threading.Thread(target=_warm_up, args=(backend.warm_up, settings), name="fleet-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_up(warm_up: Callable[[Settings], None], settings: Settings) -> None:
    try:
        warm_up(settings)
    except Exception:  # best effort: the run does the same work again and reports what fails
        log.debug("sandbox warm-up failed", exc_info=True)
