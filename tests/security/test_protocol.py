"""Attacks on the sandbox protocol and on the host folders around a sandbox.

The model's code runs in the worker process, so it can reach the worker's own objects and write
anything to the protocol pipe. These tests do exactly that and then check the host: the sandbox is
stopped with a clear reason at once (never a hang), nothing outside was read, written or deleted,
and the next sandbox or run works.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError

from fleet_rlm.core.engine import Engine
from fleet_rlm.sandbox.base import SandboxError
from fleet_rlm.sandbox.interpreter import SandboxInterpreter
from fleet_rlm.sandbox.local import LocalSandbox
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

# Sandboxed code that finds the worker object and queues raw bytes on the protocol pipe.
FORGE = (
    "import gc\n"
    "_w = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')\n"
    "def forge(raw):\n"
    "    _w.outgoing.put(raw if isinstance(raw, bytes) else (raw + '\\n').encode())\n"
)


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Callable[..., LocalSandbox]]:
    made: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        box = LocalSandbox(tmp_path / f"work{len(made)}", **kwargs)
        made.append(box)
        return box

    yield make
    for box in made:
        await box.shutdown()


async def _forged_step_fails(box: LocalSandbox, code: str, reason: str) -> None:
    await box.execute(FORGE)
    with anyio.fail_after(20), pytest.raises(SandboxError, match=reason):
        await box.execute(code)
    assert not box.alive


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        # A second "done" for a request that already finished.
        ("forge(json.dumps({'op': 'done', 'id': 1, 'stdout': 'fake', 'duration': 0}))\nimport time\n"
         "time.sleep(1)", "broke the protocol.*no request in flight"),
        ("forge(json.dumps({'op': 'ready', 'pid': 1}))\nimport time\ntime.sleep(1)", "a second 'ready'"),
        ("forge('{not json')\nimport time\ntime.sleep(1)", "not JSON"),
        ("forge('[' * 200000 + ']' * 200000)\nimport time\ntime.sleep(1)", "nested too deeply|deeper than"),
        ("forge(json.dumps({'op': 'call', 'id': 'x', 'name': 1}))\nimport time\ntime.sleep(1)", "malformed"),
        ("forge(json.dumps({'op': 'sudo'}))\nimport time\ntime.sleep(1)", "unknown message op"),
        ("forge(b'\"' + b'x' * (66 * 1024 * 1024) + b'\"\\n')\nimport time\ntime.sleep(3)", "over the 64 MB limit"),
    ],
    ids=["second-done", "second-ready", "not-json", "deep-nesting", "bad-call", "unknown-op", "oversized"],
)
async def test_forged_messages_stop_the_sandbox_at_once(sandbox, code: str, reason: str) -> None:
    box = sandbox()
    await box.execute("import json")
    await _forged_step_fails(box, code, reason)
    fresh = sandbox()  # the next sandbox is unaffected
    assert (await fresh.execute("6 * 7")).data == 42


async def test_a_forged_done_for_the_running_step_with_bad_fields_is_refused(sandbox) -> None:
    box = sandbox()
    await box.execute(FORGE + "import json, time")
    # A reply to the very step in flight, but with a stdout that is not text.
    code = "forge(json.dumps({'op': 'done', 'id': _w.capture_id, 'stdout': {'x': 1}, 'duration': 0}))\ntime.sleep(2)"
    with anyio.fail_after(20), pytest.raises(SandboxError, match="not text"):
        await box.execute(code)


async def test_forged_output_floods_are_capped(sandbox) -> None:
    box = sandbox(output_limit=10_000)
    seen: list[str] = []
    await box.execute(FORGE + "import json")
    code = "for _ in range(200):\n    forge(json.dumps({'op': 'output', 'id': _w.capture_id, 'data': 'y' * 10000}))"
    result = await box.execute(code, on_output=seen.append)
    assert result.error is None
    assert sum(map(len, seen)) <= 10_000


async def test_a_spool_marker_is_just_data_to_the_host(sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    got: list[Any] = []

    async def take(value: Any) -> str:
        got.append(value)
        return "ok"

    box = sandbox(host_functions={"take": take})
    result = await box.execute(f"take({{'__file__': {str(secret)!r}}})")
    assert result.data == "ok"
    assert got == [{"__file__": str(secret)}]  # passed through as a dict: the host opened nothing
    assert secret.read_text() == "top secret"


async def test_host_calls_outside_a_step_are_refused_not_run(sandbox) -> None:
    calls: list[str] = []

    async def note(text: str) -> str:
        calls.append(text)
        return text

    box = sandbox(host_functions={"note": note})
    code = (
        "import threading, time\n_errors = []\n"
        "def later():\n    time.sleep(0.5)\n    try:\n        note('late')\n"
        "    except Exception as e:\n        _errors.append(str(e))\n"
        "threading.Thread(target=later).start()\nnote('now')"
    )
    assert (await box.execute(code)).data == "now"
    await anyio.sleep(1.5)
    assert calls == ["now"]
    assert "only be called while a step runs" in (await box.execute("_errors[0]")).data


def test_re_entrant_interpreter_use_fails_fast() -> None:
    interp = SandboxInterpreter()
    try:
        interp.tools["again"] = lambda: interp.execute("1")
        with pytest.raises(CodeExecutionError, match="re-entrant"):
            interp.execute("again()")
        assert interp.execute("2 + 2") == 4
    finally:
        interp.shutdown()


def test_re_entrant_use_from_another_thread_is_refused_too() -> None:
    interp = SandboxInterpreter()
    errors: list[str] = []
    try:
        interp.start()
        worker = threading.Thread(target=lambda: interp.execute("import time\ntime.sleep(2)"))
        worker.start()
        time.sleep(0.5)
        try:
            interp.execute("1")
        except CodeInterpreterError as exc:
            errors.append(str(exc))
        worker.join()
    finally:
        interp.shutdown()
    assert errors and "re-entrant" in errors[0]


# -- host folders: links planted where the host creates, reads or deletes ------------------------

PLANT = (
    "import os\n"
    "for name in ({names}):\n"
    "    try:\n        os.symlink({target!r}, name)\n    except FileExistsError:\n        pass\n"
    "print(sorted(os.listdir('.')))"
)
NAMES = "'root.1', 'node-root.1', '.inputs', '.xfer', 'context-root.1.txt', 'context.txt', 'query.txt', 'repl'"


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def outside(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A host folder the sandbox must never touch, and what it holds before the attack."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep.txt").write_text("host data")
    return folder, _snapshot(folder)


async def test_links_planted_in_a_work_folder_never_steer_a_child(
    fleet_env: dict, oracle: OracleLM, outside: tuple[Path, dict[str, str]]
) -> None:
    outside, before = outside
    oracle.add(Scenario("plant links", [
        PLANT.format(names=NAMES, target=str(outside)),
        "r = rlm_query('child question', 'child context with The secret code is C0DE')\nprint(r)",
        "SUBMIT(r)",
    ]))
    oracle.add(Scenario("child question", ["SUBMIT('child saw ' + context[-4:])"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("plant links", context_text=["x"]))
    assert result.status == "succeeded", result.error
    assert result.answer == "child saw C0DE"
    assert _snapshot(outside) == before  # nothing written, nothing deleted, nothing created
    assert outside.is_dir() and not (outside / "context.txt").exists()


async def test_links_planted_in_one_session_run_never_steer_the_next(
    fleet_env: dict, oracle: OracleLM, outside: tuple[Path, dict[str, str]]
) -> None:
    outside, before = outside
    oracle.add(Scenario("first run", [PLANT.format(names=NAMES, target=str(outside)) + "\nSUBMIT('planted')"]))
    oracle.add(Scenario("second run", ["SUBMIT(context[:8])"]))
    async with Engine() as engine:
        first = await engine.run(RunRequest("first run", context_text=["one"], session_id="s1"))
        second = await engine.run(RunRequest("second run", context_text=["new text"], session_id="s1"))
    assert (first.answer, second.answer) == ("planted", "new text")
    assert _snapshot(outside) == before


async def test_a_forged_reply_fails_the_run_with_a_reason_and_the_next_run_works(
    fleet_env: dict, oracle: OracleLM
) -> None:
    oracle.add(Scenario("forge a reply", [
        FORGE + "import json, time\nforge(json.dumps({'op': 'done', 'id': 999, 'duration': 0}))\ntime.sleep(2)",
    ]))
    oracle.add(Scenario("honest", ["SUBMIT(str(len(context)))"]))
    async with Engine() as engine:
        with anyio.fail_after(60):
            bad = await engine.run(RunRequest("forge a reply", context_text=["x"]))
        good = await engine.run(RunRequest("honest", context_text=["abc"]))
    assert bad.status == "failed" and "broke the protocol" in (bad.error or "")
    assert good.status == "succeeded" and good.answer == "3"
