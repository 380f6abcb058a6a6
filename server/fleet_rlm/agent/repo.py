"""Cloning a git repository into a volume's ``buffers/`` for the agent, within limits.

The URL must be http(s) and its host public, checked like a web page (``fetch.check_url``), and git is
pinned to the address that was checked (``http.curloptResolve``), follows no redirects, speaks only
http(s), runs without the user's or the system's git config and hooks, never prompts, and checks out
links as plain files (``core.symlinks=false``). Submodules are not fetched. The clone is shallow where the
server allows it and is stopped once it grows past twice the size limit. Only regular files are copied
into the volume (links and anything else are skipped, never followed), through the volume's safe write
path, up to ``agent_fetch_max_mb`` in total.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_rlm.agent.fetch import FetchRefused, check_url
from fleet_rlm.errors import Unavailable, UserError

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.core.volume_operations import VolumeOperations

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
CLONE_SECONDS = 300.0
MAX_FILES = 5000


@dataclass
class Copied:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


def git_available() -> str | None:
    """The git executable, or None (``fleet-rlm doctor`` reports it)."""
    return shutil.which("git")


def _size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


async def _git(args: list[str], cwd: Path, env: dict[str, str], watch: Path, limit: int) -> tuple[int, str]:
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
            too_big = watch.exists() and await asyncio.to_thread(_size, watch) > limit
            if too_big or elapsed > CLONE_SECONDS:
                why = f"is larger than {limit // 2 // (1024 * 1024)} MB" if too_big else "took too long to clone"
                raise FetchRefused(f"the repository {why} (agent_fetch_max_mb)")
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


async def clone(url: str, ref: str | None, settings: Settings, into: Path) -> Path:
    """Clone ``url`` at ``ref`` (a branch or tag; None: the default branch) under ``into``; the work tree."""
    git = git_available()
    if git is None:
        raise Unavailable("git is not installed: install git to pull repositories in (`fleet-rlm doctor` checks it)")
    if ref is not None and (not REF.fullmatch(ref) or ".." in ref):
        raise UserError(f"ref {ref!r} is not a branch or tag name")
    target = await check_url(url, settings)
    limit = settings.agent_fetch_max_mb * 1024 * 1024 * 2  # the pack and the checkout
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
    code, err = await _git([*base, "--depth", "1", "--", url, str(work)], into, env, work, limit)
    if code != 0 and "shallow" in err:  # a dumb-HTTP server cannot serve a shallow clone: the size watch still holds
        shutil.rmtree(work, ignore_errors=True)
        code, err = await _git([*base, "--", url, str(work)], into, env, work, limit)
    if code != 0:
        last = (err.strip().splitlines() or ["git failed"])[-1]
        raise UserError(f"cloning {url} failed: {last}")
    return work


def copy_tree(work: Path, volumes: VolumeOperations, volume: str, dest: str, max_bytes: int) -> Copied:
    """Copy the regular files of a work tree (not ``.git``) to ``dest`` in the volume, links never followed."""
    copied = Copied()
    for root, dirs, files in os.walk(work, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".git" and not os.path.islink(os.path.join(root, d)))
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, work).replace(os.sep, "/")
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link (O_NOFOLLOW refuses it) or gone
                copied.skipped.append(rel)
                continue
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    copied.skipped.append(rel)
                    continue
                data = f.read(max_bytes - copied.bytes + 1)
            if copied.bytes + len(data) > max_bytes or copied.files >= MAX_FILES:
                copied.skipped.append(rel)
                continue
            volumes.write_file(volume, f"{dest}/{rel}", data, roots=("buffers",))
            copied.files += 1
            copied.bytes += len(data)
    return copied


async def add_repo(
    url: str, ref: str | None, settings: Settings, volumes: VolumeOperations, volume: str, dest: str
) -> Copied:
    """Clone into a private scratch folder, copy into the volume, remove the scratch folder."""
    settings.make_home()
    scratch = Path(tempfile.mkdtemp(prefix="agent-clone-", dir=settings.work_root))
    try:
        work = await clone(url, ref, settings, scratch)
        max_bytes = settings.agent_fetch_max_mb * 1024 * 1024
        return await asyncio.to_thread(copy_tree, work, volumes, volume, dest, max_bytes)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
