"""What a run request must pass before a run exists: every mistake a user can fix in the request or
the settings, each one sentence with the fix. No dspy here: the CLI checks a request before it
imports the runtime, so a refused `fleet-rlm run` answers in a read command's time."""

from __future__ import annotations

import functools
import re
import stat
from collections.abc import Callable
from pathlib import Path

from fleet_rlm.config import ConfigError, Settings, role_model
from fleet_rlm.core.context import ContextError, check_host_paths
from fleet_rlm.core.inputs.fetch import FetchRefused, check_policy
from fleet_rlm.core.inputs.repo import GIT_MISSING, git_available
from fleet_rlm.core.tools import check_tools_request
from fleet_rlm.errors import FleetError, Unavailable, UserError
from fleet_rlm.sandbox.base import SandboxError, get_backend
from fleet_rlm.types import RunRequest
from fleet_rlm.volumes import Volumes, parse_volume_ref

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def admit(settings: Settings, req: RunRequest, volumes: Callable[[], Volumes]) -> None:
    """Refuse the request with the fix, or return. ``volumes`` is called only when the request names
    one: a Daytona-backed store is not worth opening otherwise. ``Engine.validate`` adds what needs
    its state (the models built, a closed session) or a walk of the context folders (``text_to_read``)."""
    volumes = functools.cache(volumes)  # one store for every volume the request names
    role_model(settings, "root")  # no model, or a name no provider serves
    role_model(settings, "sub")
    try:  # never run somewhere other than asked
        backend = get_backend(settings.sandbox)
    except SandboxError as exc:
        raise ConfigError(f"{exc}: set FLEET_SANDBOX=local") from None
    if backend.check is not None:  # e.g. Daytona without a key: refused before a run exists
        backend.check(settings)
    if req.volume is not None:
        volumes().check_name(req.volume)
    roots = settings.allowed_context_roots
    for spec in req.context_paths:
        ref = parse_volume_ref(spec)
        if ref is not None:
            volumes().stat(*ref)  # NotFound names the volume or file, with the fix
            continue
        path = Path(spec).expanduser()
        if _empty_folder(path, spec):
            raise ContextError(f"context folder '{spec}' is empty: give a folder with files in it")
        if roots is not None and not any(path.resolve().is_relative_to(root) for root in roots):
            raise ContextError(f"context path '{spec}' is outside FLEET_CONTEXT_ROOTS")
    if req.session_id and not SESSION_ID.fullmatch(req.session_id):
        raise UserError(f"session id '{req.session_id}': use 1-64 letters, digits, '_', '.' or '-'")
    # Pages and repositories: their form and a host that is an address, here; names are resolved when
    # the run fetches them (a failure there fails the run with the reason).
    for url in [*req.context_urls, *([req.repo_url] if req.repo_url else [])]:
        try:
            check_policy(url, settings)
        except FleetError as exc:
            raise FetchRefused(f"cannot fetch {url}: {exc.message}") from None
    if req.repo_url and git_available() is None:
        raise Unavailable(GIT_MISSING)
    check_tools_request(settings, req)  # unknown MCP servers, tools that do not import, stray allowances


def _empty_folder(path: Path, spec: str) -> bool:
    """Whether a host context path is an empty folder; ContextError when it is missing or the OS refuses it."""
    try:
        return stat.S_ISDIR(path.stat().st_mode) and next(path.iterdir(), None) is None
    except (FileNotFoundError, NotADirectoryError):
        raise ContextError(f"context path '{spec}' does not exist") from None
    except OSError as exc:  # permission denied, a name too long for the file system, a loop of links
        raise ContextError(f"context path '{spec}' cannot be used: {exc.strerror}") from None


def text_to_read(settings: Settings, req: RunRequest) -> None:
    """Refuse host paths that would stage no text at all (a folder of only binaries): a mistake, not a
    failed run. It lists the folders, so the engine checks it once, not each caller of ``admit``."""
    host_paths = [spec for spec in req.context_paths if parse_volume_ref(spec) is None]
    fetched = req.context_urls or req.repo_url  # may bring text: staging judges the whole
    if host_paths and len(host_paths) == len(req.context_paths) and not req.context_text and not fetched:
        check_host_paths(host_paths, settings.allowed_context_roots, req.include_hidden)
