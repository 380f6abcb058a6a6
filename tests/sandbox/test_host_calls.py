"""Host functions called from sandboxed code: concurrency, errors, big arguments, big inputs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio


async def test_many_concurrent_host_calls_from_user_threads(make_sandbox):
    active = 0
    peak = 0

    async def slow_echo(i: int) -> int:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.2)
        active -= 1
        return i * 10

    sb = make_sandbox(host_functions={"slow_echo": slow_echo})
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(16) as pool:\n"
        "    results = list(pool.map(slow_echo, range(16)))\n"
        "results"
    )
    r = await sb.execute(code)
    assert r.error is None, r.error
    assert r.value == repr([i * 10 for i in range(16)])
    assert peak >= 8


async def test_host_errors_become_runtime_errors(make_sandbox):
    async def fails(x: int) -> int:
        raise KeyError(f"no such thing {x}")

    sb = make_sandbox(host_functions={"fails": fails})
    code = "try:\n    fails(7)\nexcept RuntimeError as e:\n    msg = str(e)\nmsg"
    r = await sb.execute(code)
    assert r.error is None
    assert r.value == repr("KeyError: 'no such thing 7'")
    uncaught = await sb.execute("fails(1)")
    assert uncaught.error_kind == "exception" and "RuntimeError: KeyError" in uncaught.error


async def test_register_functions_after_start(make_sandbox):
    sb = make_sandbox()
    await sb.start()

    async def add(a: int, b: int = 0) -> int:
        return a + b

    await sb.register_functions({"add": add})
    assert (await sb.execute("add(2, b=3)")).value == "5"


@pytest.mark.slow
async def test_big_string_argument_travels_through_the_pipe(make_sandbox, tmp_path: Path):
    received: list[str] = []

    async def take(text: str, parts: list[str]) -> int:
        received.extend([text, *parts])
        return len(text)

    sb = make_sandbox(host_functions={"take": take})
    code = "big = ''.join(chr(97 + i % 26) for i in range(3 * 1024 * 1024)) + 'é'\ntake(big, [big[:10], big])"
    r = await sb.execute(code)
    assert r.error is None, r.error
    expected = "".join(chr(97 + i % 26) for i in range(3 * 1024 * 1024)) + "é"
    assert r.value == str(len(expected))
    assert received == [expected, expected[:10], expected]
    # As data, never as a file the host would have to open inside the sandbox's folder.
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []


@pytest.mark.slow
async def test_an_argument_over_the_message_limit_is_a_readable_error(make_sandbox):
    called: list[int] = []

    async def take(text: str) -> int:
        called.append(len(text))
        return 0

    sb = make_sandbox(host_functions={"take": take})
    r = await sb.execute("take('x' * (65 * 1024 * 1024))")
    assert r.error_kind == "exception" and "over the 64 MB limit" in r.error
    assert called == []
    assert (await sb.execute("1 + 1")).value == "2"  # the REPL goes on


@pytest.mark.slow
async def test_put_text_of_100_mb_from_a_host_file(make_sandbox, tmp_path: Path):
    big = tmp_path / "input.txt"  # host-owned: outside anything the sandbox sees
    line = "0123456789abcdefghijklmnopqrstuvwxyz\u00e9\n"  # one non-ASCII char per line
    with big.open("w", encoding="utf-8") as fh:
        for _ in range(100 * 1024 * 1024 // len(line.encode()) + 1):
            fh.write(line)
    n_chars = len(big.read_text(encoding="utf-8"))
    sb = make_sandbox(output_limit=10_000)
    await sb.put_text("context", big)
    r = await sb.execute("len(context), context.count('\u00e9'), context[:10]")
    assert r.error is None, r.error
    assert r.value == repr((n_chars, n_chars // len(line), "0123456789"))
    assert r.data == [n_chars, n_chars // len(line), "0123456789"]
    # Sent once, raw: the pipe carried the file's bytes and little more.
    assert big.stat().st_size <= sb.bytes_sent < big.stat().st_size + 100_000


async def test_put_text_of_a_string(make_sandbox):
    sb = make_sandbox()
    await sb.put_text("doc", "volume text \u00e9\n" * 3)
    assert (await sb.execute("doc")).data == "volume text \u00e9\n" * 3
