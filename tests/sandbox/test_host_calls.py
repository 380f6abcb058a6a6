"""Host functions called from sandboxed code: concurrency, errors, big arguments, big inputs."""

from __future__ import annotations

import asyncio
import os
import sys
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


async def test_big_string_argument_is_spooled_through_a_file(make_sandbox, tmp_path: Path):
    received: list[str] = []

    async def take(text: str, parts: list[str]) -> int:
        received.extend([text, *parts])
        return len(text)

    sb = make_sandbox(host_functions={"take": take})
    await sb.start()
    sent_before = sb.bytes_received
    code = "big = ''.join(chr(97 + i % 26) for i in range(3 * 1024 * 1024)) + 'é'\ntake(big, [big[:10], big])"
    r = await sb.execute(code)
    assert r.error is None, r.error
    expected = "".join(chr(97 + i % 26) for i in range(3 * 1024 * 1024)) + "é"
    assert r.value == str(len(expected))
    assert received == [expected, expected[:10], expected]
    # 6 MB of text arrived, yet only small messages crossed the pipe, and the spool files are gone
    assert sb.bytes_received - sent_before < 64 * 1024
    assert list((tmp_path / "work" / ".xfer").iterdir()) == []


async def test_spool_marker_cannot_read_host_files(make_sandbox, tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    got: list[object] = []

    async def take(x: object) -> str:
        got.append(x)
        return "ok"

    sb = make_sandbox(host_functions={"take": take})
    r = await sb.execute(f"take({{'__file__': '../{secret.name}'}})")
    assert r.error_kind == "exception" and "outside .xfer" in r.error
    assert got == [] and secret.exists()


async def test_load_text_of_100_mb_does_not_cross_the_pipe(make_sandbox, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    big = work / "input.txt"
    line = "0123456789abcdefghijklmnopqrstuvwxyz\u00e9\n"  # one non-ASCII char per line
    with big.open("w", encoding="utf-8") as fh:
        for _ in range(100 * 1024 * 1024 // len(line.encode()) + 1):
            fh.write(line)
    n_chars = len(big.read_text(encoding="utf-8"))
    sb = make_sandbox(output_limit=10_000)
    await sb.start()
    await sb.load_text("context", big)
    r = await sb.execute("len(context), context.count('\u00e9'), context[:10]")
    assert r.error is None, r.error
    assert r.value == repr((n_chars, n_chars // len(line), "0123456789"))
    # The whole conversation (both directions) stayed tiny compared to the 100 MB input.
    assert sb.bytes_sent + sb.bytes_received < 100_000
    with pytest.raises(ValueError, match="outside"):
        await sb.load_text("nope", Path(sys.prefix) / "pyvenv.cfg")


async def test_load_text_from_a_volume(make_sandbox, tmp_path: Path):
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "doc.txt").write_text("volume text", encoding="utf-8")
    sb = make_sandbox(volumes={"docs": vol})
    await sb.load_text("doc", vol / "doc.txt")
    assert (await sb.execute("doc")).value == repr("volume text")
    assert sb.sandbox_path(vol / "doc.txt") == os.path.join(sb.volume_paths["docs"], "doc.txt")
