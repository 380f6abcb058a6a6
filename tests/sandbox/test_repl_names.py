"""Guest code cannot break the REPL's own names: SUBMIT, the host functions, the builtins and what the
worker's protocol uses. Whatever one step rebinds or deletes, the next steps work (as dspy's
LocalInterpreter restores them), and a worker that can no longer answer says so at once."""

from __future__ import annotations

import concurrent.futures
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from dspy.primitives.code_interpreter import FinalOutput

from fleet_rlm.config import Settings
from fleet_rlm.sandbox import worker
from fleet_rlm.sandbox.base import Sandbox, SandboxError, SandboxSpec, create_sandbox
from fleet_rlm.sandbox.interpreter import SandboxInterpreter

from .conftest import MODES

STEP_LIMIT = 5.0  # short, so a hang would end (step limit + the host's grace) well inside BOUND
BOUND = 30.0  # generous: every test here takes well under a second when nothing hangs

POISONS = [
    "SUBMIT = None; llm_query = 'oops'",
    "del SUBMIT, llm_query",
    "import builtins; builtins.len = None",
    "__builtins__.len = None",
    "import builtins; del builtins.print",
    "import builtins; builtins.repr = None",
    "import builtins; builtins.isinstance = builtins.str = builtins.type = None",
    "import builtins; builtins.__import__ = None",
    "__builtins__ = None",
    "import json; json.dumps = json.loads = json.JSONEncoder = None",
    # The real builtins module, past the guest's own copy:
    "len.__self__.len = len.__self__.repr = len.__self__.isinstance = None",
    "import sys; del sys.modules['builtins'].print",
]

pytestmark = pytest.mark.anyio


async def echo(text: str) -> str:
    return f"echo:{text}"


async def assert_the_repl_works(box: Sandbox) -> None:
    """The steps every session needs: printed output, builtins, imports, a host call, SUBMIT."""
    printed = await box.execute("print('out', len('abc'), repr('x'), isinstance(1, int))")
    assert (printed.error, printed.stdout) == (None, "out 3 'x' True\n"), printed.error
    imported = await box.execute("import math\nmath.floor(2.5)")
    assert (imported.error, imported.value) == (None, "2"), imported.error
    called = await box.execute("llm_query('q')")
    assert (called.error, called.value) == (None, repr("echo:q")), called.error
    submitted = await box.execute("SUBMIT(42)")
    assert (submitted.error, submitted.final) == (None, {"answer": 42}), submitted.error


@pytest.mark.parametrize("isolation", MODES)
@pytest.mark.parametrize("poison", POISONS)
async def test_a_poisoning_step_does_not_break_the_next_steps(make_sandbox, isolation: str, poison: str) -> None:
    box = make_sandbox(isolation=isolation, exec_timeout=STEP_LIMIT, host_functions={"llm_query": echo})
    with anyio.fail_after(BOUND):
        await box.execute(poison)  # whatever it gives, it gives it at once
        await assert_the_repl_works(box)
        await box.execute(poison)  # and again, once the names were put back
        await assert_the_repl_works(box)


async def test_the_poisoning_step_itself_still_prints_calls_and_submits(make_sandbox) -> None:
    box = make_sandbox(exec_timeout=STEP_LIMIT, host_functions={"llm_query": echo})
    code = (
        "len.__self__.len = len.__self__.isinstance = None\n"  # the real module
        "import builtins, json\nbuiltins.len = builtins.repr = None\njson.dumps = None\n"  # and the guest's
        "print('still', llm_query('here'))\nSUBMIT(answer='done')"
    )
    with anyio.fail_after(BOUND):
        result = await box.execute(code)
    assert (result.error, result.stdout, result.final) == (None, "still echo:here\n", {"answer": "done"})


async def test_guest_builtins_are_its_own_and_additions_stay(make_sandbox) -> None:
    box = make_sandbox(exec_timeout=STEP_LIMIT)
    with anyio.fail_after(BOUND):
        setup = "import builtins\nbuiltins.helper = lambda: 'kept'\nmine = builtins is __builtins__"
        assert (await box.execute(setup + "\nmine")).value == "True"
        assert (await box.execute("helper()")).value == repr("kept")
        real = await box.execute("import sys\nsys.modules['builtins'] is __builtins__, hasattr(len.__self__, 'helper')")
        assert real.value == "(False, False)"


async def test_the_repls_names_cannot_be_set_as_variables(make_sandbox) -> None:
    box = make_sandbox(host_functions={"llm_query": echo})
    for name in ("SUBMIT", "llm_query", "__builtins__"):
        with pytest.raises(ValueError, match="REPL's own name"):
            await box.set_var(name, 1)
        with pytest.raises(ValueError, match="REPL's own name"):
            await box.put_text(name, "text")
    assert (await box.execute("SUBMIT(llm_query('x'))")).final == {"answer": "echo:x"}


async def test_a_worker_that_cannot_reply_is_reported_at_once(make_sandbox) -> None:
    # The guest reaches into the worker's own globals and breaks its encoder; with a step limit far
    # past BOUND, the host can only be this quick if the worker's exit tells it.
    box = make_sandbox(exec_timeout=120)
    with anyio.fail_after(BOUND), pytest.raises(SandboxError) as info:
        await box.execute("SUBMIT.__func__.__globals__['_encode'] = None")
    message = str(info.value)
    assert "exit code 70" in message, message
    assert "worker: sending the reply to 'execute' failed (TypeError" in message, message


def test_a_request_the_worker_cannot_read_ends_it_at_once_with_the_reason(tmp_path: Path) -> None:
    cmd = [sys.executable, "-I", "-S", "-u", worker.__file__, "--workdir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    assert b'"op": "ready"' in proc.stdout.readline()
    proc.stdin.write(b'{"op": "execute", "id": 1, "code": "1"\n')  # cut short: no reply can ever come
    proc.stdin.flush()
    try:
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        proc.kill()
    assert proc.returncode == 70
    assert b"worker: reading the request" in stderr and b"failed (JSONDecodeError" in stderr, stderr


# ---- the drop-in dspy interpreter, as dspy.RLM drives it -----------------------------------------
def bounded(body: Callable[[], None]) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(body).result(timeout=BOUND)


def test_the_interpreter_restores_submit_and_tools_each_step() -> None:
    # dspy's own LocalInterpreter test: tools and SUBMIT come back after the code rebinds them.
    interp = SandboxInterpreter(tools={"add": lambda a, b: a + b}, exec_timeout=STEP_LIMIT)

    def body() -> None:
        assert interp.execute("SUBMIT = None; add = None") is None
        assert interp.execute("add(2, 3)") == 5
        assert interp.execute("SUBMIT(42)") == FinalOutput({"output": 42})

    try:
        bounded(body)
    finally:
        interp.shutdown()


@pytest.mark.parametrize("poison", POISONS)
def test_the_interpreter_survives_poisoned_builtins(poison: str) -> None:
    interp = SandboxInterpreter(tools={"llm_query": lambda text: f"echo:{text}"}, exec_timeout=STEP_LIMIT)

    def body() -> None:
        with contextlib.suppress(Exception):  # a step may fail on its own poison; the next ones must not
            interp.execute(poison)
        assert interp.execute("print('out', len('abc'))") == "out 3\n"
        assert interp.execute("import math\nmath.floor(2.5)") == 2
        assert interp.execute("repr(llm_query('q'))") == repr("echo:q")
        assert interp.execute("SUBMIT(42)") == FinalOutput({"output": 42})

    try:
        bounded(body)
    finally:
        interp.shutdown()


# ---- Daytona runs the same worker behind its shim -------------------------------------------------
@pytest.fixture
async def daytona_box(daytona_double: Any, tmp_path: Path) -> AsyncIterator[Sandbox]:
    settings = Settings(sandbox="daytona", home=tmp_path / "home", daytona_api_url=daytona_double.api_url,
                        daytona_api_key="test-key")  # fmt: skip
    box = create_sandbox(settings, SandboxSpec(work_dir=tmp_path / "box", exec_timeout=STEP_LIMIT))
    try:
        yield box
    finally:
        await box.shutdown()


async def test_the_daytona_shim_survives_poisoning_too(daytona_box: Sandbox) -> None:
    await daytona_box.register_functions({"llm_query": echo})
    with anyio.fail_after(BOUND * 2):  # a remote sandbox (the double) starts slower
        for poison in POISONS:
            await daytona_box.execute(poison)
            await assert_the_repl_works(daytona_box)


async def refuse(path: str) -> str:
    raise PermissionError(f"may not wipe {path}")


@pytest.mark.parametrize(
    "poison",
    ["lab.shout = None; lab.wipe = 'oops'", "del lab", "lab = None", "import types; types.SimpleNamespace = None"],
)
async def test_a_tool_namespace_is_put_back_after_a_step_that_changed_it(make_sandbox, poison: str) -> None:
    # Host functions named "server.tool" (core/tools.py) are a namespace object per server.
    box = make_sandbox(exec_timeout=STEP_LIMIT, host_functions={"lab.shout": echo, "lab.wipe": refuse})
    with anyio.fail_after(BOUND):
        for _ in range(2):
            await box.execute(poison)
            called = await box.execute("lab.shout('q')")
            assert (called.error, called.value) == (None, repr("echo:q")), called.error
            refused = await box.execute(
                "try:\n    lab.wipe('/x')\nexcept PermissionError as e:\n    r = f'{type(e).__name__}: {e}'\nr"
            )
            assert (refused.error, refused.value) == (None, repr("PermissionError: may not wipe /x")), refused.error
    with pytest.raises(ValueError, match="REPL's own name"):
        await box.set_var("lab", 1)


@pytest.mark.parametrize("name", ["a.b.c", "1x.y", "SUBMIT.x", "x.", ".x"])
async def test_a_dotted_host_function_name_must_be_two_identifiers(make_sandbox, name: str) -> None:
    box = make_sandbox(exec_timeout=STEP_LIMIT)
    await box.start()
    with pytest.raises(Exception, match="invalid function name"):
        await box.register_functions({name: echo})
