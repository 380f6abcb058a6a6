"""What hostile sandbox traffic can cost the host: memory held for host calls, sub-call prompts sent
to the model, disk filled through the work folder.

The code forges raw ``call`` frames on the protocol pipe (bypassing the worker's own size checks), so
every bound is checked on the HOST: this process's peak resident memory, what the model server
received, what is on disk in the host folder behind ``/fleet/work``.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.sandbox.base import HostCallBudget
from fleet_rlm.sandbox.local import LocalSandbox, detect_isolation
from fleet_rlm.types import RunRequest
from tests.security.test_protocol import FORGE
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.patience import patience

pytestmark = pytest.mark.anyio

MB = 1 << 20
FRAME = 63 * MB  # one forged host call: just under the 64 MB a protocol message may have
FRAMES = 10  # 630 MB in all: a host that kept them would cross either bound below by 180 MB or more
# Reading one message costs a few transient copies of it (the pipe buffer, the line, its decoded
# text, the parsed value) on top of whatever the host keeps; the bound is checked with that margin.
READ_MARGIN = 5 * 64 * MB
needs_bwrap = pytest.mark.skipif(detect_isolation()[0] != "bwrap", reason=f"bwrap: {detect_isolation()[1]}")

# Forged host calls to ``name``, each with one argument of ``size`` bytes, waiting for each to leave
# the worker's queue so the sandbox itself never holds more than two of them.
FLOOD = (
    FORGE
    + """
import time
pad = b"x" * {size}
for i in range({count}):
    forge(b'{{"op": "call", "id": %d, "name": "{name}", "args": ["' % (10**6 + i) + pad + b'"]}}\\n')
    while not _w.outgoing.empty():
        time.sleep(0.01)
del pad
"""
)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(key)


class PeakMemory:
    """How far this process's resident memory rose above where it stood when measuring started."""

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
        except OSError as exc:
            pytest.skip(f"the peak resident size cannot be reset here: {exc}")
        self.base = _status("VmRSS")

    @property
    def growth(self) -> int:
        return _status("VmHWM") - self.base


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Callable[..., LocalSandbox]]:
    made: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        box = LocalSandbox(tmp_path / "home" / "work" / f"box{len(made)}", **kwargs)
        made.append(box)
        return box

    yield make
    for box in made:
        await box.shutdown()


# -- host calls: bytes held on the host ------------------------------------------------------------


@pytest.mark.slow
async def test_forged_host_calls_hold_no_more_host_memory_than_the_budget(sandbox) -> None:
    release = asyncio.Event()
    started: list[int] = []

    async def hold(text: str) -> str:
        started.append(len(text))
        await release.wait()  # every accepted call stays on the host until the step lets go
        return "held"

    async def settle() -> int:  # sent after the forged frames, so the host has read them all
        release.set()
        return len(started)

    box = sandbox(host_functions={"hold": hold, "settle": settle}, host_call_mb=64)
    await box.execute("1")
    peak = PeakMemory()
    result = await box.execute(FLOOD.format(size=FRAME, count=FRAMES, name="hold") + "settle()")
    growth = peak.growth
    assert growth < 64 * MB + READ_MARGIN, f"the host grew by {growth / MB:.0f} MB"
    assert result.error is None, result.error
    assert result.data == 1  # one 63 MB call fits in 64 MB: it ran; the other nine were refused
    assert (await box.execute("6 * 7")).data == 42  # the sandbox goes on


@pytest.mark.slow
async def test_the_process_budget_is_shared_by_every_sandbox_and_refusals_are_clear(sandbox) -> None:
    release = asyncio.Event()
    calls: list[int] = []

    async def hold(text: str) -> str:
        calls.append(len(text))
        await release.wait()
        return "held"

    async def take(text: str) -> str:
        calls.append(len(text))
        return "taken"

    async def ping() -> str:
        return "pong"

    limits = {"host_call_mb": 48, "host_call_total_mb": 64}
    first = sandbox(host_functions={"hold": hold, "ping": ping}, **limits)
    second = sandbox(host_functions={"take": take}, **limits)
    # 30 MB held by the first sandbox (a forged call that stays on the host after its step)...
    assert (await first.execute(FLOOD.format(size=30 * MB, count=1, name="hold") + "ping()")).data == "pong"
    assert calls == [30 * MB]
    # ...so 40 MB more from the second fits its own 48 MB but not the process's 64 MB.
    attempt = "try:\n    take('y' * ({mb} << 20))\nexcept RuntimeError as e:\n    print(e)"
    refused = await second.execute(attempt.format(mb=40))
    assert "FLEET_HOST_CALL_TOTAL_MB" in refused.stdout and "64 MB" in refused.stdout, refused.stdout
    over = await second.execute(attempt.format(mb=50))
    assert "FLEET_HOST_CALL_MB" in over.stdout and "48 MB" in over.stdout, over.stdout
    assert calls == [30 * MB]  # both refused on the host: the function never ran
    release.set()
    with anyio.fail_after(20):  # the first sandbox's call is answered, its bytes given back
        while (await second.execute("take('z' * (40 << 20))")).error is not None:
            await anyio.sleep(0.05)
    assert calls[-1] == 40 * MB


async def test_bytes_of_a_call_cancelled_before_it_ran_are_given_back() -> None:
    # A sandbox shut down right after accepting a call cancels its task before the task ever ran.
    budget = HostCallBudget(1, 1)
    assert budget.take(MB, "f") is None and budget.take(1, "f") is not None
    answering = asyncio.ensure_future(asyncio.sleep(60))
    budget.give_when_done(answering, MB)
    answering.cancel()
    await asyncio.gather(answering, return_exceptions=True)
    assert budget.take(MB, "f") is None  # the whole megabyte is free again, for this process too
    answered = asyncio.ensure_future(asyncio.sleep(0))
    budget.give_when_done(answered, MB)  # and given back, so later tests start from nothing
    await answered


@pytest.mark.slow
async def test_forged_sub_calls_in_a_run_never_reach_the_model_and_memory_stays_bounded(
    fleet_env: dict, oracle: OracleLM
) -> None:
    oracle.add(Scenario("warm up", ["SUBMIT(llm_query('The secret code is WARM'))"]))
    oracle.add(Scenario("flood the host", [
        FLOOD.format(size=FRAME, count=FRAMES, name="llm_query") + "print('flooded')",
        "SUBMIT('still running')",
    ]))  # fmt: skip
    async with Engine() as engine:
        assert (await engine.run(RunRequest("warm up", context_text=["x"]))).answer == "WARM"  # imports done
        peak = PeakMemory()
        with anyio.fail_after(patience(120)):
            result = await engine.run(RunRequest("flood the host", context_text=["x"]))
        growth = peak.growth
    assert result.status == "succeeded" and result.answer == "still running", result.error
    assert growth < 128 * MB + READ_MARGIN, f"the host grew by {growth / MB:.0f} MB"
    assert len(oracle.requests("sub")) == 1  # the warm-up's: no prompt of 63 MB reached the model


async def test_an_over_long_llm_query_prompt_fails_in_the_repl_and_never_reaches_the_model(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_SUBCALL_MAX_CHARS", "1000")
    oracle.add(Scenario("long prompt", [
        "try:\n    llm_query('The secret code is LONG ' + 'x' * 2000)\nexcept Exception as e:\n    print(repr(e))\n"
        "print(llm_query_batched(['The secret code is FITS', 'The secret code is BIG ' + 'y' * 2000]))",
        "SUBMIT('done')",
    ]))  # fmt: skip
    async with Engine() as engine:
        result = await engine.run(RunRequest("long prompt", context_text=["x"]))
    assert result.status == "succeeded", result.error
    seen = json.dumps(oracle.requests("root")[1].messages[-1])  # what the model read after the step
    assert "ValueError" in seen and "1,000" in seen and "FLEET_SUBCALL_MAX_CHARS" in seen and "split" in seen
    assert "'FITS'" in seen  # the prompt within the limit in the same batch was answered
    assert [r.prompt_chars < 1000 for r in oracle.requests("sub")] == [True]  # only that one was sent


# -- the work folder: disk ---------------------------------------------------------------------------

WRITE = """
def write(name, mb):
    done = 0
    with open(name, "wb") as fh:
        for _ in range(mb):
            fh.write(b"x" * (1 << 20))
            done += 1
    return done
"""


def _disk_use(folder: Path) -> int:
    """Bytes of the regular files below ``folder``, links not followed (what the host holds)."""
    sizes = (os.lstat(os.path.join(top, name)) for top, _, files in os.walk(folder) for name in files)
    return sum(st.st_size for st in sizes if stat.S_ISREG(st.st_mode))


@needs_bwrap
async def test_a_step_writing_past_the_work_quota_is_trimmed_on_the_host(sandbox) -> None:
    box = sandbox(isolation="bwrap", work_quota_mb=16)
    assert (await box.execute(WRITE + "write('kept.bin', 4)")).data == 4
    result = await box.execute("[write(f'big{i}.bin', 10) for i in range(3)]")
    assert "work folder" in result.stdout and "FLEET_WORK_QUOTA_MB" in result.stdout, result.stdout
    assert _disk_use(box.work_dir) <= 16 * MB
    assert (box.work_dir / "kept.bin").stat().st_size == 4 * MB  # written before: never removed
    assert (await box.execute("import os\nsorted(os.listdir('.'))")).error is None  # the sandbox goes on


@needs_bwrap
async def test_trimming_the_work_folder_never_follows_a_planted_link(sandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"h" * MB)
    box = sandbox(isolation="bwrap", work_quota_mb=4)
    code = WRITE + f"import os\nos.symlink({str(outside)!r}, 'link')\nos.mkdir('d')\nwrite('d/big.bin', 8)"
    result = await box.execute(code)
    assert "over quota" in result.stdout, result.stdout
    assert (outside / "data.bin").read_bytes() == b"h" * MB and sorted(os.listdir(outside)) == ["data.bin"]
    assert _disk_use(box.work_dir) <= 4 * MB


@needs_bwrap
async def test_a_session_work_folder_stays_within_its_quota_across_runs(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_WORK_QUOTA_MB", "8")
    oracle.add(Scenario("fill the disk", [WRITE + "print(write('/fleet/work/big.bin', 40))", "SUBMIT('ok')"]))
    async with Engine() as engine:
        session = await engine.open_session()
        result = await engine.run(RunRequest("fill the disk", context_text=["x"], session_id=session))
        assert result.status == "succeeded", result.error
        folder = Path(fleet_env["FLEET_HOME"]) / "work" / session / "repl"
        assert folder.is_dir() and _disk_use(folder) <= 8 * MB  # checked on the host, the REPL still open
    seen = json.dumps(oracle.requests("root")[1].messages[-1])
    assert "over quota" in seen and "FLEET_WORK_QUOTA_MB" in seen


@pytest.mark.slow
def test_doctor_reports_the_work_folder_and_host_call_caps(fleet_env: dict) -> None:
    fleet = str(Path(sys.executable).parent / "fleet-rlm")
    env = {**os.environ, **fleet_env, "FLEET_WORK_QUOTA_MB": "300", "FLEET_HOST_CALL_TOTAL_MB": "700"}
    done = subprocess.run([fleet, "doctor", "--offline", "--json"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["caps"]["caps"]}
    assert "300 MB" in rows["work_disk"]["limit"]
    assert "700 MB" in rows["host_calls"]["limit"] and rows["host_calls"]["enforced"]
