"""The Daytona backend's faults, lifecycle and host bridge, through the real SDK and the API double.

Every check looks at the double's own record (its request log, its sandboxes and their state) or
at the host, never only at what the sandbox says about itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from fleet_rlm.config import Settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.sandbox.base import SandboxSpec, create_sandbox
from fleet_rlm.sandbox.daytona import DaytonaSandbox
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio


def control(double: Any, method: str, path: str, **kwargs: Any) -> Any:
    response = httpx.request(method, f"http://127.0.0.1:{double.port}/_double/{path}", **kwargs)
    response.raise_for_status()
    return response.json()


def fault(double: Any, **spec: Any) -> None:
    control(double, "POST", "faults", json=spec)


def log_since(double: Any, mark: int) -> list[str]:
    return control(double, "GET", "state")["log"][mark:]


def sandbox_row(double: Any, sid: str) -> dict | None:
    return next((s for s in control(double, "GET", "state")["sandboxes"] if s["id"] == sid), None)


@pytest.fixture
def settings(daytona_double: Any, tmp_path: Path) -> Settings:
    return Settings(sandbox="daytona", home=tmp_path / "home", daytona_api_url=daytona_double.api_url,
                    daytona_api_key="test-key")  # fmt: skip


@pytest.fixture
async def make(settings: Settings, tmp_path: Path) -> AsyncIterator[Callable[..., DaytonaSandbox]]:
    made: list[Any] = []

    def build(**kwargs: Any) -> DaytonaSandbox:
        box = create_sandbox(settings, SandboxSpec(work_dir=tmp_path / f"box{len(made)}", **kwargs))
        made.append(box)
        return box  # type: ignore[return-value]

    yield build
    for box in made:
        await box.shutdown()


@pytest.fixture
def daytona_env(fleet_env: dict, daytona_double: Any, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The test settings with runs sandboxed on the Daytona double (for whole runs through the Engine)."""
    env = {**fleet_env, "FLEET_SANDBOX": "daytona", "DAYTONA_API_URL": daytona_double.api_url,
           "DAYTONA_API_KEY": "test-key"}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _sid(box: DaytonaSandbox) -> str:
    assert box._remote is not None
    return str(box._remote.sandbox.id)


@pytest.mark.slow
async def test_429_waits_for_retry_after(make, daytona_double: Any) -> None:
    mark = len(log_since(daytona_double, 0))
    fault(daytona_double, kind="http", match="^POST /api/sandbox$", status=429, retry_after=0.6)
    started = time.monotonic()
    box = make()
    await box.start()
    assert time.monotonic() - started >= 0.6  # the Retry-After was honoured, not a fixed short backoff
    assert log_since(daytona_double, mark).count("POST /api/sandbox") == 2
    assert (await box.execute("1 + 1")).data == 2


async def test_a_slow_create_is_waited_for(make, daytona_double: Any) -> None:
    fault(daytona_double, kind="slow_create", seconds=1.0)
    started = time.monotonic()
    box = make()
    assert (await box.execute("'up'")).data == "up"
    assert time.monotonic() - started >= 1.0  # the SDK polled until the sandbox was started
    assert sandbox_row(daytona_double, _sid(box))["state"] == "started"


async def test_502_before_the_code_was_sent_is_retried(make, daytona_double: Any) -> None:
    box = make()
    await box.execute("n = 0")
    mark = len(log_since(daytona_double, 0))
    fault(daytona_double, kind="http", match="process/interpreter/execute$", status=502, times=2)
    assert (await box.execute("n += 1\nn")).data == 1  # ran exactly once, after two refused upgrades
    assert sum(line.endswith("interpreter/execute") for line in log_since(daytona_double, mark)) == 3


async def test_a_dropped_connection_mid_step_is_unknown_and_never_replayed(make, daytona_double: Any) -> None:
    box = make()
    await box.execute("runs = 0")
    mark = len(log_since(daytona_double, 0))
    fault(daytona_double, kind="ws_drop", after=0.3)
    result = await box.execute("import time\ntime.sleep(1)\nruns += 1")
    assert result.error_kind == "unknown" and "NOT run again" in (result.error or "")
    assert sum(line.endswith("interpreter/execute") for line in log_since(daytona_double, mark)) == 1
    with anyio.fail_after(30):
        assert (await box.execute("runs")).data == 1  # the step finished in its context, once


async def test_timeout_close_4008_keeps_or_recreates_the_context(make, daytona_double: Any) -> None:
    box = make()
    await box.put_text("query", "still here")
    await box.execute("kept = 1")
    # Daytona's timeout interrupts code that lets itself be interrupted: the namespace survives.
    fault(daytona_double, kind="ws_timeout", after=0.5)
    result = await box.execute("import time\ntime.sleep(5)")
    assert result.error_kind == "timeout"
    assert (await box.execute("kept")).data == 1
    # Code that ignores the interrupt has its context killed: a new one, and the model is told.
    fault(daytona_double, kind="ws_timeout", after=0.5)
    result = await box.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)")
    assert "variables from earlier steps are gone" in result.stdout + (result.error or "")
    gone = await box.execute("kept")
    assert gone.error_kind == "exception" and "NameError" in (gone.error or "")
    assert (await box.execute("query")).data == "still here"  # inputs are bound again


async def test_a_stopped_sandbox_is_started_not_recovered(make, daytona_double: Any) -> None:
    box = make()
    await box.execute("x = 5")
    sid = _sid(box)
    control(daytona_double, "POST", f"sandbox/{sid}/stop")  # what Daytona's auto-stop does
    assert sandbox_row(daytona_double, sid)["state"] == "stopped"
    mark = len(log_since(daytona_double, 0))
    result = await box.execute("print('after')")
    assert "after" in result.stdout and "variables from earlier steps are gone" in result.stdout
    assert sandbox_row(daytona_double, sid)["state"] == "started"
    log = log_since(daytona_double, mark)
    assert f"POST /api/sandbox/{sid}/start" in log and not any(line.endswith("/recover") for line in log)


async def test_children_share_the_parent_sandbox_or_get_their_own(settings: Settings, tmp_path: Path,
                                                                   daytona_double: Any) -> None:  # fmt: skip
    for mode, expect_shared in (("shared", True), ("own", False)):
        conf = settings.model_copy(update={"daytona_children": mode})
        parent = create_sandbox(conf, SandboxSpec(work_dir=tmp_path / "p"))
        await parent.start()
        child = create_sandbox(conf, SandboxSpec(work_dir=tmp_path / "c", near=parent))
        try:
            await child.execute("y = 1")
            assert (_sid(child) == _sid(parent)) is expect_shared  # type: ignore[arg-type]
            assert "y" not in ((await parent.execute("'y' in dir()")).value or "")
            assert (await parent.execute("'y' in dir()")).data is False  # separate namespaces either way
        finally:
            await child.shutdown()
            sid = _sid(parent)  # type: ignore[arg-type]
            assert sandbox_row(daytona_double, sid) is not None  # the child never deletes its parent's sandbox
            await parent.shutdown()
        assert sandbox_row(daytona_double, sid) is None


async def test_the_global_cap_holds(settings: Settings, tmp_path: Path) -> None:
    conf = settings.model_copy(update={"daytona_max_sandboxes": 1})
    first = create_sandbox(conf, SandboxSpec(work_dir=tmp_path / "a"))
    second = create_sandbox(conf, SandboxSpec(work_dir=tmp_path / "b"))
    await first.start()
    waiting = anyio.Event()

    async def start_second() -> None:
        await second.start()
        waiting.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(start_second)
        await anyio.sleep(0.5)
        assert not waiting.is_set()  # held back while the first holds the only slot
        await first.shutdown()
        with anyio.fail_after(30):
            await waiting.wait()
    await second.shutdown()


async def test_host_calls_past_the_byte_budget_are_refused_on_the_host(make) -> None:
    release = asyncio.Event()
    calls: list[int] = []

    async def hold(text: str) -> str:
        calls.append(len(text))
        await release.wait()  # an accepted call keeps its arguments on the host until the step lets go
        return "held"

    async def settle() -> int:
        release.set()
        return len(calls)

    box = make(host_call_mb=1)
    await box.register_functions({"hold": hold, "settle": settle})
    # Forged call frames straight on the cell's stdout (past the shim's own checks), then honest calls.
    code = (
        "import gc\nshim = next(o for o in gc.get_objects() if type(o).__name__ == 'Shim')\n"
        "for i in range(4):\n    shim.send({'op': 'call', 'id': 10**6 + i, 'name': 'hold', 'args': ['x' * 600_000]})\n"
        "held = settle()\ntry:\n    hold('y' * 2_000_000)\nexcept RuntimeError as e:\n    print(e)\nheld"
    )
    result = await box.execute(code)
    assert result.error is None, result.error
    assert calls == [600_000] and result.data == 1  # one fits in 1 MB; three forged and the 2 MB one refused
    assert "hold() refused" in result.stdout and "FLEET_HOST_CALL_MB" in result.stdout, result.stdout
    assert (await box.execute("6 * 7")).data == 42


async def test_llm_query_reaches_the_host_without_keys_or_network_in_the_sandbox(
    daytona_env: dict, oracle: OracleLM
) -> None:
    port = oracle.base_url.rsplit(":", 1)[1].split("/")[0]
    oracle.add(Scenario("bridge", [
        "import os, socket\nenv = dict(os.environ)\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    net = 'open'\n"
        "except OSError as e:\n    net = 'blocked'\n"
        "answer = llm_query('The secret code is K7Q')\nprint(answer, net)",
        "SUBMIT(answer + ' ' + net + ' ' + ' '.join(sorted(env)))",
    ]))  # fmt: skip
    async with Engine() as engine:
        result = await engine.run(RunRequest("bridge test", context_text=["x"]))
    assert result.status == "succeeded", result.error
    answer, net, *names = (result.answer or "").split()
    assert answer == "K7Q" and net == "blocked"
    assert not [n for n in names if "KEY" in n or n.startswith(("FLEET_", "DAYTONA_", "OPENAI"))]
    assert "sk-test-oracle-0000" not in (result.answer or "")
    subs = oracle.requests("sub")
    assert len(subs) == 1 and subs[0].auth == "Bearer sk-test-oracle-0000"  # from the host, with the host's key


async def test_a_session_keeps_its_warm_sandbox_across_runs(
    daytona_env: dict, oracle: OracleLM, daytona_double: Any
) -> None:
    oracle.add(Scenario("remember", ["memo = 'kept across runs'\nSUBMIT('ok')"]))
    oracle.add(Scenario("recall", ["SUBMIT(memo)"]))
    async with Engine() as engine:
        first = await engine.run(RunRequest("remember this", context_text=["x"], session_id="s1"))
        sandboxes = {s["id"] for s in control(daytona_double, "GET", "state")["sandboxes"]}
        second = await engine.run(RunRequest("recall it", session_id="s1"))
        assert {s["id"] for s in control(daytona_double, "GET", "state")["sandboxes"]} == sandboxes
    assert first.answer == "ok" and second.answer == "kept across runs"
