"""Time and memory limits, and a worker that dies: errors are reported, nothing hangs."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import anyio
import pytest

from fleet_rlm.sandbox.local import SandboxError

from .conftest import MODES

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", MODES)
async def test_timeout_interrupts_and_keeps_the_namespace(make_sandbox, mode):
    sb = make_sandbox(isolation=mode)
    await sb.execute("kept = 'still here'")
    with anyio.fail_after(30):
        r = await sb.execute("n = 0\nwhile True:\n    n += 1", timeout=1)
    assert r.error_kind == "timeout"
    assert "1 s limit" in r.error and "llm_query_batched" in r.error
    after = await sb.execute("kept, n > 0")
    assert after.error is None and after.value == "('still here', True)"


async def test_timeout_interrupts_a_wait_for_the_host(make_sandbox):
    async def forever() -> None:
        await asyncio.sleep(3600)

    sb = make_sandbox(host_functions={"forever": forever})
    with anyio.fail_after(30):
        r = await sb.execute("forever()", timeout=1)
    assert r.error_kind == "timeout"
    assert (await sb.execute("1 + 1")).value == "2"


async def test_swallowed_timeout_fires_again(make_sandbox):
    sb = make_sandbox()
    code = "import time\ntry:\n    time.sleep(30)\nexcept BaseException:\n    pass\nwhile True:\n    pass"
    with anyio.fail_after(30):
        r = await sb.execute(code, timeout=1)
    assert r.error_kind == "timeout"


@pytest.mark.parametrize("mode", MODES)
async def test_memory_cap_raises_memory_error_and_worker_survives(make_sandbox, mode):
    sb = make_sandbox(isolation=mode, memory_mb=256)
    await sb.execute("small = list(range(1000))")
    r = await sb.execute("huge = bytearray(1024 ** 3)")
    assert r.error_kind == "memory"
    assert "256 MB" in r.error
    assert sb.alive
    assert (await sb.execute("len(small)")).value == "1000"


async def test_the_worker_reserves_no_address_space_the_data_would_need(make_sandbox):
    # RLIMIT_AS counts reservations: a second glibc malloc arena reserves 64 MB, half of a 128 MB
    # cap, and whether user code met it depended on thread timing (a flake under load).
    sb = make_sandbox(isolation="none", memory_mb=128)
    r = await sb.execute("x = [bytes(4096) for _ in range(100)]")
    assert r.error is None, r.error
    status = Path(f"/proc/{sb.pid}/status").read_text().splitlines()
    peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmPeak"))
    assert peak_kb < 64 * 1024, f"the worker once reserved {peak_kb} kB of address space"


@pytest.mark.parametrize("mode", MODES)
async def test_killed_worker_raises_sandbox_error_promptly(make_sandbox, mode):
    sb = make_sandbox(isolation=mode)
    await sb.start()
    assert sb.pid is not None

    async def kill_soon() -> None:
        await asyncio.sleep(0.5)
        os.kill(sb.pid, signal.SIGKILL)

    killer = asyncio.create_task(kill_soon())
    with anyio.fail_after(30), pytest.raises(SandboxError) as info:
        await sb.execute("import time\ntime.sleep(120)")
    await killer
    message = str(info.value)
    assert "killed by signal 9" in message and "start a new session" in message
    assert not sb.alive
    with pytest.raises(SandboxError):
        await sb.execute("1")


@pytest.mark.parametrize("mode", MODES)
async def test_worker_killing_itself(make_sandbox, mode):
    sb = make_sandbox(isolation=mode)
    with anyio.fail_after(30), pytest.raises(SandboxError, match="killed by signal 9"):
        await sb.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")


async def test_worker_exiting_is_reported(make_sandbox):
    sb = make_sandbox()
    with anyio.fail_after(30), pytest.raises(SandboxError, match="exit code 3"):
        await sb.execute("import os\nos._exit(3)")


async def test_sys_exit_is_a_normal_error(make_sandbox):
    sb = make_sandbox()
    r = await sb.execute("import sys\nsys.exit(2)")
    assert r.error_kind == "exception" and "SystemExit" in r.error
    assert sb.alive


@pytest.mark.slow
async def test_worker_ignoring_the_alarm_is_killed(make_sandbox):
    sb = make_sandbox()
    # Asleep, not spinning: the host's kill is the same, and the suite's cores stay free for 11 s.
    code = "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)"
    with anyio.fail_after(40), pytest.raises(SandboxError, match="did not answer within 11 s"):
        await sb.execute(code, timeout=1)
    assert not sb.alive
