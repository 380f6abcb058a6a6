"""REPL semantics of the worker: persistence, output capture, errors, SUBMIT."""

from __future__ import annotations

import pytest

from fleet_rlm.sandbox.local import SandboxError

pytestmark = pytest.mark.anyio


async def test_namespace_persists_and_value_and_prints_are_both_kept(make_sandbox):
    sb = make_sandbox()
    first = await sb.execute("import math\nx = 20\ndef double(v):\n    return 2 * v\n")
    assert (first.error, first.value, first.stdout) == (None, None, "")
    second = await sb.execute("print('x is', x)\nprint(math.floor(2.5))\ndouble(x) + 2")
    assert second.error is None
    assert second.stdout == "x is 20\n2\n"
    assert second.value == "42"
    # None is not echoed, like a notebook
    assert (await sb.execute("None")).value is None
    assert (await sb.execute("'a' * 3")).value == "'aaa'"


async def test_stderr_is_captured_and_marked(make_sandbox):
    sb = make_sandbox()
    r = await sb.execute("import sys\nprint('out')\nprint('bad\\nworse', file=sys.stderr)")
    assert r.stdout == "out\n[stderr] bad\n[stderr] worse\n"


async def test_syntax_error_reports_line(make_sandbox):
    sb = make_sandbox()
    r = await sb.execute("a = 1\nb = = 2\n")
    assert r.error_kind == "syntax"
    assert "line 2" in r.error and "SyntaxError" in r.error


async def test_exception_reports_user_frames_only(make_sandbox):
    sb = make_sandbox()
    await sb.execute("def f(d):\n    return 1 / d\n")
    r = await sb.execute("print('before')\ny = 5\nf(0)")
    assert r.error_kind == "exception"
    assert r.stdout == "before\n"
    assert r.error.endswith("ZeroDivisionError: division by zero")
    assert 'File "<repl>", line 3, in <module>' in r.error
    assert 'File "<repl>", line 2, in f' in r.error and "return 1 / d" in r.error
    assert "worker.py" not in r.error
    # state assigned before the failure survives
    assert (await sb.execute("y")).value == "5"


async def test_submit_without_fields(make_sandbox):
    sb = make_sandbox()
    r = await sb.execute("print('working')\nSUBMIT({'k': [1, 2]})\nprint('not reached')")
    assert r.final == {"answer": {"k": [1, 2]}}
    assert r.error is None and r.stdout == "working\n"
    assert (await sb.execute("SUBMIT(answer='x')")).final == {"answer": "x"}
    # non-JSON values are converted with str
    assert (await sb.execute("SUBMIT(answer={1, 2} and object)")).final == {"answer": str(object)}


async def test_submit_with_configured_fields(make_sandbox):
    sb = make_sandbox()
    await sb.configure_output_fields([{"name": "answer", "type": "str"}, {"name": "score", "type": "int"}])
    assert (await sb.execute("SUBMIT('yes', 3)")).final == {"answer": "yes", "score": 3}
    assert (await sb.execute("SUBMIT(score=4, answer='no')")).final == {"answer": "no", "score": 4}
    bad = await sb.execute("SUBMIT('only one')")
    assert bad.final is None and bad.error_kind == "exception"
    assert "missing required field(s) 'score'" in bad.error
    # `except Exception` in user code does not swallow SUBMIT
    caught = await sb.execute("try:\n    SUBMIT(answer='a', score=1)\nexcept Exception:\n    pass\n")
    assert caught.final == {"answer": "a", "score": 1}


async def test_output_is_capped_keeping_head_and_tail(make_sandbox):
    sb = make_sandbox(output_limit=1000)
    r = await sb.execute("print('HEAD')\nfor i in range(5000):\n    print(i)\nprint('TAIL')")
    assert r.error is None
    assert r.stdout.startswith("HEAD\n0\n1\n")
    assert r.stdout.endswith("4999\nTAIL\n")
    full = "HEAD\n" + "".join(f"{i}\n" for i in range(5000)) + "TAIL\n"
    dropped = len(full) - 1000
    assert f"[{dropped} characters of output omitted]" in r.stdout
    assert len(r.stdout) < 1100


async def test_huge_trailing_value_and_error_are_capped(make_sandbox):
    sb = make_sandbox(output_limit=1000)
    await sb.execute("big = 'a' * 50_000_000 + 'END'")
    r = await sb.execute("big")
    assert r.value.startswith("'aaa") and r.value.endswith("aEND'")
    assert "characters omitted" in r.value and len(r.value) < 1100
    r = await sb.execute("raise ValueError(big)")
    assert r.error_kind == "exception" and r.error.endswith("aEND") and len(r.error) < 1100
    assert sb.bytes_received < 100_000


async def test_output_streams_while_code_runs(make_sandbox):
    sb = make_sandbox()
    chunks: list[str] = []
    code = "import time\nprint('first')\ntime.sleep(0.8)\nprint('second')"
    r = await sb.execute(code, on_output=chunks.append)
    assert r.stdout == "first\nsecond\n"
    # 'first' was streamed on its own, before 'second' was even printed
    assert chunks and chunks[0] == "first\n"
    assert "".join(chunks) in (r.stdout, "first\n")


async def test_set_var_and_restart_is_refused_after_shutdown(make_sandbox):
    sb = make_sandbox()
    await sb.set_var("data", {"a": [1, 2, 3]})
    assert (await sb.execute("sum(data['a'])")).value == "6"
    with pytest.raises(ValueError, match="invalid variable name"):
        await sb.set_var("not valid", 1)
    await sb.shutdown()
    await sb.shutdown()  # idempotent
    assert not sb.alive
    with pytest.raises(SandboxError, match="shut down"):
        await sb.execute("1")
