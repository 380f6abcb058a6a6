"""A sandbox's start cancelled at any point leaves nothing behind on the host.

A run cancelled within milliseconds of its start (an MCP client's notifications/cancelled) cancels
LocalSandbox.start() wherever it is: creating the cgroup, inside asyncio.create_subprocess_exec after
the fork (the caller never sees the process it made), waiting for the worker's ``ready``, defining the
host functions. Judged by the host: no process naming the sandbox's folder (bubblewrap's command line
binds it; the worker is found below it), none re-parented to pid 1, and no cgroup of this process left.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.sandbox import local
from fleet_rlm.sandbox.caps import detect_cgroups
from fleet_rlm.sandbox.local import LocalSandbox, SandboxError
from tests.sandbox.conftest import MODES
from tests.support import procs

pytestmark = pytest.mark.anyio

CGROUPS = detect_cgroups()
# A sandbox starts in about 60-80 ms on a quiet machine: every phase of it, and past its end.
DELAYS_MS = [*range(0, 51, 2), *range(55, 151, 5)]
CLEAN_WITHIN = 20.0  # a bound against hangs: what start() left must be gone by then, never a timing


def own_groups() -> list[Path]:
    """Sandbox cgroups this test process created that still exist."""
    return [g for _, parent in CGROUPS.parents for g in parent.glob(f"sb-{os.getpid()}-*")]


@pytest.fixture
async def sandboxes(tmp_path: Path) -> AsyncIterator[Callable[..., LocalSandbox]]:
    """New sandboxes, each in its own folder (its marker on the host); all shut down afterwards."""
    made: list[LocalSandbox] = []

    async def ping() -> str:
        return "pong"

    def make(mode: str, **kwargs: Any) -> LocalSandbox:
        sandbox = LocalSandbox(tmp_path / f"sb{len(made)}", isolation=mode, host_functions={"ping": ping}, **kwargs)
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        await sandbox.shutdown()


async def cancel_start(sandbox: LocalSandbox, delay: float) -> bool:
    """Cancel ``sandbox.start()`` after ``delay`` seconds; True if the cancel landed (start had not finished)."""
    task = asyncio.create_task(sandbox.start())
    await asyncio.sleep(delay)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def assert_left_nothing(sandbox: LocalSandbox, where: str) -> None:
    marker = str(sandbox.work_dir)
    clean = await asyncio.to_thread(procs.wait_until, lambda: not procs.naming(marker), CLEAN_WITHIN)
    assert clean, f"{where}: sandbox processes survived a cancelled start: {sorted(procs.naming(marker))}"
    assert await asyncio.to_thread(procs.wait_until, lambda: not own_groups(), CLEAN_WITHIN), (
        f"{where}: cgroups left: {own_groups()}"
    )


async def assert_unusable(sandbox: LocalSandbox, where: str) -> None:
    """A start that was cancelled is not half a sandbox: every later use says so."""
    with pytest.raises(SandboxError):
        await sandbox.execute("1 + 1")
    assert not procs.naming(str(sandbox.work_dir)), where


@pytest.mark.parametrize("mode", MODES)
async def test_start_cancelled_at_any_delay_leaves_no_process_and_no_cgroup(
    sandboxes: Callable[..., LocalSandbox], mode: str
) -> None:
    landed = 0
    for ms in DELAYS_MS:
        sandbox = sandboxes(mode)
        if await cancel_start(sandbox, ms / 1000):
            landed += 1
            await assert_left_nothing(sandbox, f"cancelled after {ms} ms")
            await assert_unusable(sandbox, f"cancelled after {ms} ms")
        else:  # it started first: it works, and shutting it down leaves nothing either
            assert (await sandbox.execute("ping()")).value == repr("pong")
            await sandbox.shutdown()
            await assert_left_nothing(sandbox, f"started before the cancel at {ms} ms")
    assert landed, "no cancel landed inside start(): the sweep tested nothing"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("turns", [0, 1, 2, 4, 8])
async def test_start_cancelled_right_after_the_spawn_leaves_nothing(
    sandboxes: Callable[..., LocalSandbox], mode: str, turns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel lands inside asyncio.create_subprocess_exec once the process exists (turns=0: before it
    returns, so the caller never holds the process), or that many loop turns after it returned."""
    real = asyncio.create_subprocess_exec
    victim: list[asyncio.Task[Any]] = []
    spawned: list[int] = []

    async def spawn_then_cancelled(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        process = await real(*args, **kwargs)
        spawned.append(process.pid)

        async def cancel_later() -> None:
            for _ in range(turns):
                await asyncio.sleep(0)
            victim[0].cancel()

        if turns == 0:
            victim[0].cancel()
            await asyncio.sleep(0)  # the cancel lands here: after the fork, before the caller gets the process
        else:
            asyncio.get_running_loop().create_task(cancel_later())
        return process

    monkeypatch.setattr(local.asyncio, "create_subprocess_exec", spawn_then_cancelled)
    sandbox = sandboxes(mode)
    victim.append(asyncio.create_task(sandbox.start()))
    with pytest.raises(asyncio.CancelledError):
        await victim[0]
    assert spawned, "the spawn was never reached"
    monkeypatch.undo()
    await assert_left_nothing(sandbox, f"cancelled {turns} turns after the spawn")
    gone = await asyncio.to_thread(procs.wait_until, lambda: not procs.with_descendants(spawned), CLEAN_WITHIN)
    assert gone, f"the spawned process or its children live on: {procs.with_descendants(spawned)}"
    await assert_unusable(sandbox, f"cancelled {turns} turns after the spawn")


@pytest.mark.parametrize("mode", MODES)
async def test_start_cancelled_without_a_cgroup_leaves_no_process(
    sandboxes: Callable[..., LocalSandbox], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the host offers no cgroups (a user without delegation), the process tree is killed all the
    same: bubblewrap's inner processes start their own session, so its process group alone misses them."""
    monkeypatch.setattr(local.SandboxCgroup, "create", classmethod(lambda cls, memory_mb, max_procs: None))
    for ms in DELAYS_MS[::3]:
        sandbox = sandboxes(mode)
        if await cancel_start(sandbox, ms / 1000):
            await assert_left_nothing(sandbox, f"cancelled after {ms} ms, no cgroup")
        else:
            await sandbox.shutdown()
