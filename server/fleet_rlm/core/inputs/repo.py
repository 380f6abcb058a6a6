"""Cloning a git repository under the fetch policy, for a run's context and for the agent's volumes.

The URL must be http(s) and its host public, checked like a web page (``fetch.check_url``), and git is
pinned to the address that was checked (``http.curloptResolve``), follows no redirects, speaks only
http(s), runs without the user's or the system's git config and hooks, never prompts, and checks out
links as plain files (``core.symlinks=false``). Submodules are not fetched. The clone is shallow where the
server allows it and is stopped once it grows past twice the size limit (the pack and the checkout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_rlm.core.inputs.fetch import FetchFailed, FetchRefused, check_url
from fleet_rlm.errors import Unavailable
from fleet_rlm.types import check_git_ref

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

CLONE_SECONDS = 300.0
GIT_MISSING = "git is not installed: install git to pull repositories in (`fleet-rlm doctor` checks it)"


def git_available() -> str | None:
    """The git executable, or None (``fleet-rlm doctor`` reports it)."""
    return shutil.which("git")


def tree_size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (links counted as themselves, never followed)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


async def _git(
    args: list[str], cwd: Path, env: dict[str, str], watch: Path, limit: int, limit_setting: str
) -> tuple[int, str]:
    """Run git; kill it if ``watch`` grows past ``limit`` bytes or it takes too long."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    output = asyncio.ensure_future(proc.communicate())
    elapsed = 0.0
    try:
        while True:  # checked once more after git exits: a fast clone can finish between two looks
            await asyncio.wait([output], timeout=0.2)
            elapsed += 0.2
            too_big = watch.exists() and await asyncio.to_thread(tree_size, watch) > limit
            if too_big:
                raise FetchRefused(f"the repository is larger than {limit // 2 // (1024 * 1024)} MB ({limit_setting})")
            if elapsed > CLONE_SECONDS:
                raise FetchFailed(f"the repository took longer than {CLONE_SECONDS:.0f} s to clone")
            if output.done():
                break
        _out, err = output.result()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(Exception):
            await output
    return proc.returncode or 0, err.decode(errors="replace")


async def clone(url: str, ref: str | None, settings: Settings, into: Path, *, max_mb: int, limit_setting: str) -> Path:
    """Clone ``url`` at ``ref`` (a branch or tag; None: the default branch) under ``into`` (an empty
    host-only folder); the work tree, ``into/repo``. Its ``.git`` stays: callers copy or stage the files."""
    git = git_available()
    if git is None:
        raise Unavailable(GIT_MISSING)
    if ref is not None:
        check_git_ref(ref)
    target = await check_url(url, settings)
    limit = max_mb * 1024 * 1024 * 2  # the pack and the checkout
    home = into / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_ALLOW_PROTOCOL": "http:https",
        "LC_ALL": "C",
    }
    literal = f"[{target.address}]" if ":" in target.address else target.address
    config = [
        "-c",
        f"http.curloptResolve={target.host}:{target.port}:{literal}",
        "-c",
        "http.followRedirects=false",
        "-c",
        "core.symlinks=false",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "submodule.recurse=false",
        "-c",
        "protocol.file.allow=never",
        "-c",
        "credential.helper=",
    ]
    work = into / "repo"
    branch = ["--branch", ref] if ref else []
    base = [git, *config, "clone", "--quiet", "--no-tags", "--single-branch", "--no-recurse-submodules", *branch]
    code, err = await _git([*base, "--depth", "1", "--", url, str(work)], into, env, work, limit, limit_setting)
    if code != 0 and "shallow" in err:  # a dumb-HTTP server cannot serve a shallow clone: the size watch still holds
        shutil.rmtree(work, ignore_errors=True)
        code, err = await _git([*base, "--", url, str(work)], into, env, work, limit, limit_setting)
    if code != 0:
        last = (err.strip().splitlines() or ["git failed"])[-1]
        raise FetchFailed(f"cloning {url} failed: {last.removeprefix('fatal: ')}")
    return work
