"""Daytona plumbing shared by the sandbox backend, the Daytona volumes and ``fleet-rlm daytona``.

- one ``AsyncDaytona`` per event loop (the SDK's objects are bound to the loop that made them),
  reference-counted and closed when its last user lets go;
- the retry policy: 429 waits for ``Retry-After`` (or its per-throttler variants); 502/503/504 and
  dropped connections are retried only where the call is safe to repeat;
- ownership labels on everything fleet-rlm creates, so ``fleet-rlm daytona gc`` can find orphans;
- the snapshot (named after the worker's version, so a new worker registers a new snapshot) and
  volumes (created on demand, waited on until ``ready``);
- ``explain``: an SDK error turned into one sentence saying what happened and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import socket
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from daytona import AsyncDaytona, Volume

    from fleet_rlm.config import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

HOME = "/home/daytona"
VOLUME_ROOT = f"{HOME}/volumes"  # each fleet volume NAME is mounted at VOLUME_ROOT/NAME
FLEET_DIR = f"{HOME}/.fleet"  # the uploaded worker and shim
PYTHON_VERSION = "3.11"
MANAGED = "fleet-rlm.managed"  # label keys; values are plain strings
OWNER = "fleet-rlm.owner"  # host:pid of the process that created it
KIND = "fleet-rlm.kind"  # repl | volumes
CREATE_TOKEN = "fleet-rlm.create"  # unique per create: finds a sandbox whose create answer was lost
MAX_ATTEMPTS = 6
MAX_WAIT = 30.0  # longest single wait, even when Retry-After asks for more
VOLUME_READY_TIMEOUT = 120.0

_SANDBOX_DIR = Path(__file__).parent


@functools.cache
def worker_sources() -> dict[str, bytes]:
    """The files uploaded into every sandbox, by their name there."""
    return {
        "fleet_worker.py": (_SANDBOX_DIR / "worker.py").read_bytes(),
        "fleet_shim.py": (_SANDBOX_DIR / "daytona_shim.py").read_bytes(),
    }


def image_spec() -> Any:
    """The declarative image of the snapshot: Python and the folders the REPL uses (stdlib only)."""
    from daytona import Image

    return Image.debian_slim(PYTHON_VERSION).run_commands(f"mkdir -p {VOLUME_ROOT} {FLEET_DIR}")  # type: ignore[arg-type]


@functools.cache
def worker_version() -> str:
    digest = hashlib.sha256(image_spec().dockerfile().encode())
    for name, data in sorted(worker_sources().items()):
        digest.update(name.encode() + b"\0" + data)
    return digest.hexdigest()[:12]


def snapshot_name(settings: Settings) -> str:
    return settings.daytona_snapshot or f"fleet-rlm-worker-{worker_version()}"


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def labels(kind: str, **extra: str) -> dict[str, str]:
    return {MANAGED: "true", OWNER: owner(), KIND: kind, **extra}


# -- clients, one per event loop ----------------------------------------------------------------

_clients: dict[asyncio.AbstractEventLoop, list[Any]] = {}  # loop -> [client, users]


def config(settings: Settings) -> Any:
    """The SDK's config from the settings; ConfigError (with the fix) when there is no key, said
    before the SDK is imported (about 3 CPU-seconds)."""
    key = settings.daytona_api_key.get_secret_value() if settings.daytona_api_key else None
    if not key:
        from fleet_rlm.config import ConfigError

        raise ConfigError(
            "the Daytona sandbox needs an API key: set DAYTONA_API_KEY (or `fleet-rlm config set daytona_api_key`);"
            " get one at https://app.daytona.io/dashboard/keys"
        )
    from daytona import DaytonaConfig

    return DaytonaConfig(
        api_key=key,
        api_url=settings.daytona_api_url or "https://app.daytona.io/api",
        target=settings.daytona_target,
        # State changes are polled: no credential-bearing Socket.IO connection opened in the background.
        use_deprecated_polling=True,
    )


async def acquire_client(settings: Settings) -> AsyncDaytona:
    """This loop's client (made on first use); pair every call with ``release_client``."""
    loop = asyncio.get_running_loop()
    slot = _clients.get(loop)
    if slot is None:
        sdk_config = config(settings)  # a missing key is refused before the SDK's import
        from daytona import AsyncDaytona

        with warnings.catch_warnings():  # the polling flag is announced as deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            slot = _clients[loop] = [AsyncDaytona(sdk_config), 0]
    slot[1] += 1
    return slot[0]


async def release_client() -> None:
    loop = asyncio.get_running_loop()
    slot = _clients.get(loop)
    if slot is None:
        return
    slot[1] -= 1
    if slot[1] <= 0:
        del _clients[loop]
        with contextlib.suppress(Exception):
            await slot[0].close()


@contextlib.asynccontextmanager
async def client(settings: Settings) -> Any:
    daytona = await acquire_client(settings)
    try:
        yield daytona
    finally:
        await release_client()


# -- errors and retries ---------------------------------------------------------------------------


def status_of(exc: BaseException) -> int | None:
    """The HTTP status behind an SDK error (also a refused WebSocket upgrade), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = getattr(current, "status_code", None) or getattr(current, "status", None)
        if isinstance(status, int):
            return status
        current = current.__cause__ or current.__context__
    return None


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After`` or ``Retry-After-<throttler>``)."""
    current: BaseException | None = exc
    while current is not None:
        headers = getattr(current, "headers", None) or {}
        waits = []
        for key, value in dict(headers).items():
            if str(key).lower().startswith("retry-after"):
                with contextlib.suppress(TypeError, ValueError):
                    waits.append(float(value))
        if waits:
            return max(waits)
        current = current.__cause__
    return None


def not_sent(exc: BaseException) -> bool:
    """True when the request never reached the sandbox (refused connection or WebSocket upgrade)."""
    import aiohttp

    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, (aiohttp.WSServerHandshakeError, aiohttp.ClientConnectorError)):
            return True
        current = current.__cause__ or current.__context__
    return False


def transient(exc: BaseException) -> bool:
    """Worth another try if the call may be repeated: 502/503/504 or a dropped connection."""
    from daytona import DaytonaConnectionError

    return status_of(exc) in (502, 503, 504) or isinstance(exc, DaytonaConnectionError)


def backoff(attempt: int, exc: BaseException) -> float:
    asked = retry_after(exc)
    if asked is not None:
        return min(max(asked, 0.05), MAX_WAIT)
    return min(0.25 * 2**attempt, MAX_WAIT)


async def retrying(call: Callable[[], Awaitable[T]], *, safe: bool) -> T:
    """``call()``, again after a 429 (always: the request was refused, not run), and after a
    502/503/504 or a dropped connection only when ``safe`` (repeating it does no harm)."""
    from daytona import DaytonaError

    for attempt in range(MAX_ATTEMPTS):
        try:
            return await call()
        except DaytonaError as exc:
            limited = status_of(exc) == 429
            if attempt == MAX_ATTEMPTS - 1 or not (limited or (safe and transient(exc))):
                raise
            wait = backoff(attempt, exc)
            log.info("Daytona answered %s; retrying in %.2f s", status_of(exc) or type(exc).__name__, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")


def explain(exc: BaseException, doing: str) -> str:
    """What happened while ``doing``, and what to do about it, in one sentence."""
    from fleet_rlm.redaction import redact_text

    status = status_of(exc)
    detail = redact_text(str(exc))[:400]
    if status == 401:
        fix = "check DAYTONA_API_KEY (a key from https://app.daytona.io/dashboard/keys) and DAYTONA_API_URL"
    elif status == 403:
        fix = "the key lacks a permission: create one with sandbox, snapshot and volume access"
    elif status == 429:
        fix = "Daytona's rate limit held after several waits: run fewer sandboxes at once (FLEET_DAYTONA_MAX_SANDBOXES)"
    elif status in (502, 503, 504):
        fix = "Daytona or the sandbox is unavailable right now: try again; `fleet-rlm daytona smoke` checks each part"
    elif status == 404 and "napshot" in detail:
        fix = "register the snapshot with `fleet-rlm daytona setup`"
    else:
        fix = "`fleet-rlm daytona smoke` checks credentials, snapshot, volumes and execution one by one"
    return f"Daytona failed to {doing} ({detail}); {fix}"


# -- snapshot and volumes -------------------------------------------------------------------------


async def ensure_snapshot(
    daytona: AsyncDaytona, settings: Settings, on_logs: Callable[[str], None] | None = None
) -> str:
    """The snapshot's name, after registering it if this worker version has none yet."""
    from daytona import CreateSnapshotParams, DaytonaConflictError, DaytonaNotFoundError

    name = snapshot_name(settings)
    try:
        snap = await retrying(lambda: daytona.snapshot.get(name), safe=True)
    except DaytonaNotFoundError:
        if settings.daytona_snapshot:  # a snapshot the user named is theirs to provide
            raise
        log.warning("registering Daytona snapshot %s (the first time takes a few minutes)", name)
        try:
            snap = await daytona.snapshot.create(CreateSnapshotParams(name=name, image=image_spec()), on_logs=on_logs)
        except DaytonaConflictError:  # another process registered it meanwhile
            snap = await daytona.snapshot.get(name)
    state = str(getattr(snap.state, "value", snap.state))
    deadline = time.monotonic() + 900
    while state not in ("active", "error", "build_failed") and time.monotonic() < deadline:
        await asyncio.sleep(2)
        snap = await retrying(lambda: daytona.snapshot.get(name), safe=True)
        state = str(getattr(snap.state, "value", snap.state))
    if state != "active":
        raise RuntimeError(f"snapshot {name} is {state}: {getattr(snap, 'error_reason', '')}")
    return name


def volume_name(settings: Settings, name: str) -> str:
    """The Daytona volume behind fleet volume ``name`` (one each)."""
    return f"{settings.daytona_volume_prefix}{name}"


async def ensure_volume(daytona: AsyncDaytona, settings: Settings, name: str, *, create: bool = True) -> Volume:
    """Fleet volume ``name``'s Daytona volume, created if asked, once it is ``ready`` (a sandbox
    create refuses a volume that is still being made)."""
    from daytona import DaytonaConflictError

    full = volume_name(settings, name)
    try:
        vol = await retrying(lambda: daytona.volume.get(full, create=create), safe=True)
    except DaytonaConflictError:  # created by someone else between our get and create
        vol = await retrying(lambda: daytona.volume.get(full), safe=True)
    deadline = time.monotonic() + VOLUME_READY_TIMEOUT
    delay = 0.05
    while str(getattr(vol.state, "value", vol.state)) != "ready":
        state = str(getattr(vol.state, "value", vol.state))
        if state == "error" or time.monotonic() > deadline:
            raise RuntimeError(f"Daytona volume {full} is {state}: {vol.error_reason or 'not ready in time'}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
        vol = await retrying(lambda: daytona.volume.get(full), safe=True)
    return vol
