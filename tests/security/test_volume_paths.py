"""Volumes are written by hostile sandbox code: links, pipes and races must never reach the host.

Every attack is judged on the HOST afterwards: the file outside keeps its content, no marker
appears outside, the secret is nowhere in the store's events or the model's prompts.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import os
import sys
import threading
from pathlib import Path

import httpx
import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from fleet_rlm.volumes import LocalVolumes, VolumeError
from tests.cli.test_cli import cli
from tests.support.bounded import finishes
from tests.support.oracle_lm import OracleLM, Scenario

SECRET = "HOST-SECRET-7f3a9"
RUN_DEADLINE = 120  # harness deadline for a whole run; no test asserts a duration


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host folder outside every volume, holding a secret file."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET)
    return folder


def outside_state(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def plant(vol: Path, outside: Path) -> None:
    """What a sandbox can leave behind: links out of the volume and a named pipe."""
    (vol / "memory" / "leak.txt").symlink_to(outside / "secret.txt")
    (vol / "memory" / "leakdir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(vol / "memory" / "pipe")


# -- through the API --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["memory/leak.txt", "memory/leakdir/secret.txt", "memory/leakdir/new.txt"])
def test_planted_links_are_refused_by_every_operation(tmp_path: Path, outside: Path, path: str) -> None:
    vols = LocalVolumes(tmp_path / "volumes")
    vol = vols.ensure("notes")
    plant(vol, outside)
    before = outside_state(outside)
    for op in (
        lambda: vols.read("notes", path),
        lambda: vols.open_file("notes", path),
        lambda: vols.write("notes", path, "pwned"),
        lambda: vols.list_files("notes", path),
    ):
        with pytest.raises(VolumeError, match=r"symbolic link.*never followed"):
            op()
    if "leakdir/" in path:  # deleting the link itself is allowed; deleting through it is not
        with pytest.raises(VolumeError, match="symbolic link"):
            vols.delete("notes", path)
    listing = vols.list_files("notes", recursive=True)
    assert not any(e["path"].startswith("memory/leakdir/") for e in listing)  # never entered
    assert outside_state(outside) == before


def test_pipes_in_a_volume_never_block(tmp_path: Path) -> None:
    vols = LocalVolumes(tmp_path / "volumes")
    pipe = vols.ensure("notes") / "memory" / "pipe"
    os.mkfifo(pipe)
    for op in (lambda: vols.read("notes", "memory/pipe"), lambda: vols.read_text("notes", "memory/pipe", 0, 10)):
        with pytest.raises(VolumeError, match="named pipe"):
            finishes(op, pipes=(pipe,))


# -- through the CLI, as a real subprocess ---------------------------------------------------------


@pytest.mark.slow
def test_cli_refuses_planted_links_and_pipes(fleet_env: dict, outside: Path, tmp_path: Path) -> None:
    vol = LocalVolumes(Path(fleet_env["FLEET_HOME"]) / "volumes").ensure("notes")
    plant(vol, outside)
    before = outside_state(outside)
    payload = tmp_path / "payload.txt"
    payload.write_text("pwned")
    for args in (
        ("cat", "notes/memory/leak.txt"),
        ("cat", "notes/memory/leakdir/secret.txt"),
        ("put", str(payload), "notes/memory/leakdir/secret.txt"),
        ("put", str(payload), "notes/memory/leakdir/marker.txt"),
        ("put", str(payload), "notes/memory/leak.txt"),
        ("rm", "notes/memory/leakdir/secret.txt"),
        ("ls", "notes/memory/leakdir"),
    ):
        proc = cli("volumes", *args, env=fleet_env, timeout=RUN_DEADLINE)
        assert proc.returncode != 0, args
        assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert SECRET not in proc.stdout + proc.stderr
    pipe = cli("volumes", "cat", "notes/memory/pipe", env=fleet_env, timeout=RUN_DEADLINE)
    assert pipe.returncode != 0 and "named pipe" in pipe.stderr
    listing = cli("volumes", "ls", "notes", env=fleet_env).stdout
    assert "link" in listing and "secret.txt" not in listing
    assert cli("volumes", "rm", "notes/memory/leak.txt", env=fleet_env).returncode == 0  # removes the link only
    assert outside_state(outside) == before


# -- over-long names and paths: refused with the limits, never a 500 or a traceback ---------------------

LONG_NAME = "é" * 128  # 128 characters but 256 bytes: one byte past the 255 a file system allows per name
LONG_PATH = "memory/" + "/".join(["d" * 200] * 16)  # every name fits; the whole path (3,222 bytes) does not
OVER_LONG = [f"memory/{LONG_NAME}", f"memory/{LONG_NAME}/x.txt", LONG_PATH]
LIMITS = ("255 bytes per name", "3,072 bytes per path")
ENDPOINTS = [("GET", "files"), ("GET", "text"), ("GET", "raw"), ("PUT", "raw"), ("DELETE", "raw")]


def says_the_limits(message: str) -> bool:
    return all(limit in message for limit in LIMITS)


@pytest.mark.parametrize("path", OVER_LONG)
def test_over_long_paths_are_refused_naming_the_limits(tmp_path: Path, path: str) -> None:
    vols = LocalVolumes(tmp_path / "volumes")
    vols.ensure("notes")
    for op in (
        lambda: vols.read("notes", path),
        lambda: vols.open_file("notes", path),
        lambda: vols.write("notes", path, "x"),
        lambda: vols.list_files("notes", path),
        lambda: vols.stat("notes", path),
        lambda: vols.delete("notes", path),
    ):
        with pytest.raises(VolumeError) as refused:
            op()
        assert says_the_limits(refused.value.message) and len(refused.value.message) < 300
    assert vols.list_files("notes", "memory") == []  # nothing was written


def test_web_answers_400_naming_the_limits_over_http(fleet_env: dict[str, str]) -> None:
    from fleet_rlm.web.app import create_app
    from tests.web.conftest import AUTH, TOKEN, serving

    with serving(create_app(token=TOKEN)) as base, httpx.Client(base_url=base, headers=AUTH, timeout=60) as http:
        assert http.post("/api/volumes", json={"name": "notes"}).status_code == 201
        for path in OVER_LONG:
            for method, endpoint in ENDPOINTS:
                reply = http.request(method, f"/api/volumes/notes/{endpoint}", params={"path": path}, content=b"x")
                assert reply.status_code == 400, (method, endpoint, reply.status_code, reply.text[:200])
                assert says_the_limits(reply.json()["message"]), reply.text
    assert not any((Path(fleet_env["FLEET_HOME"]) / "volumes" / "notes" / "memory").iterdir())


@pytest.mark.slow
def test_cli_names_the_limits_and_host_paths_fail_cleanly(fleet_env: dict[str, str], tmp_path: Path) -> None:
    LocalVolumes(Path(fleet_env["FLEET_HOME"]) / "volumes").ensure("notes")
    payload = tmp_path / "payload.txt"
    payload.write_text("x")
    for path in OVER_LONG:
        for args in (("cat", f"notes/{path}"), ("put", str(payload), f"notes/{path}"), ("ls", f"notes/{path}")):
            proc = cli("volumes", *args, env=fleet_env, timeout=RUN_DEADLINE)
            assert proc.returncode == 2 and says_the_limits(proc.stderr), (args[0], proc.stderr[:300])
    # Host paths the OS refuses as too long: a user error (exit 2) saying so, not an internal error.
    too_long_here = str(tmp_path / ("h" * 300))
    for args in (
        ("volumes", "put", too_long_here, "notes/memory/x.txt"),
        ("run", "a question", "--context", too_long_here),
        ("run", "a question", "--context", f"vol:notes/{LONG_PATH}"),
    ):
        proc = cli(*args, env=fleet_env, timeout=RUN_DEADLINE)
        assert proc.returncode == 2, (args, proc.stderr[:300])
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
        assert "too long" in proc.stderr.lower(), proc.stderr[:300]


# -- races -----------------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): one of them is always present."""
    if _libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@pytest.fixture
def fast_switching() -> object:
    """Switch threads often, so the swapper interleaves with every host system call."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.slow
def test_swapping_folders_and_links_never_reaches_outside(
    tmp_path: Path, outside: Path, fast_switching: object
) -> None:
    vols = LocalVolumes(tmp_path / "volumes")
    mem = vols.ensure("v") / "memory"
    (mem / "d").mkdir()
    (mem / "d" / "f").write_text("inside")
    (mem / "d_alt").symlink_to(outside, target_is_directory=True)  # swapped with the real folder d
    (mem / "g").write_text("inside-g")
    (mem / "g_alt").symlink_to(outside / "secret.txt")  # swapped with the real file g
    (outside / "victim").write_text("keep")
    before = outside_state(outside)
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        while not stop.is_set():
            exchange(mem / "d", mem / "d_alt")
            exchange(mem / "g", mem / "g_alt")
            swaps += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        for _ in range(2500):
            for op in (
                lambda: vols.read("v", "memory/d/f"),
                lambda: vols.read("v", "memory/g"),
                lambda: vols.write("v", "memory/d/marker", b"m"),
                lambda: vols.write("v", "memory/d/secret.txt", b"overwritten"),
                lambda: vols.delete("v", "memory/d/victim"),
                lambda: vols.list_files("v", "memory/d"),
            ):
                try:
                    result = op()
                except VolumeError:
                    outcomes["refused"] += 1
                    continue
                outcomes["ok"] += 1
                assert result is None or SECRET.encode() not in json.dumps(result, default=repr).encode()
                if isinstance(result, bytes):
                    assert result in (b"inside", b"inside-g")
                if isinstance(result, list):  # a listing of the real folder, never of the outside one
                    assert "memory/d/victim" not in {e["path"] for e in result}
    finally:
        stop.set()
        thread.join()
    assert swaps > 100 and outcomes["ok"] > 0 and outcomes["refused"] > 0  # the race really ran both ways
    assert outside_state(outside) == before
    assert not (outside / "marker").exists()


# -- through the engine: a sandbox plants, a later run reads -------------------------------------


PLANT = (
    "import os, pathlib\n"
    "m = pathlib.Path(volumes['notes']) / 'memory'\n"
    "(m / 'note.md').write_text('legit note')\n"
    "os.symlink({secret!r}, str(m / 'leak.txt'))\n"
    "os.symlink({folder!r}, str(m / 'leakdir'))\n"
    "os.mkfifo(str(m / 'pipe'))\n"
    "print(sorted(p.name for p in m.iterdir()))"
)


@pytest.mark.anyio
async def test_links_planted_by_a_run_do_not_leak_into_the_next(
    fleet_env: dict, oracle: OracleLM, outside: Path
) -> None:
    oracle.add(Scenario("plant links", [
        PLANT.format(secret=str(outside / "secret.txt"), folder=str(outside)), "SUBMIT('planted')",
    ]))  # fmt: skip
    oracle.add(Scenario("read my notes", ["SUBMIT(context)"]))
    before = outside_state(outside)
    async with Engine() as engine:
        first = await asyncio.wait_for(engine.run(RunRequest("plant links", volume="notes")), RUN_DEADLINE)
        assert first.answer == "planted", first.error
        vol = engine.volumes.path("notes") / "memory"
        assert (vol / "leak.txt").is_symlink() and (vol / "pipe").is_fifo()  # the attack is in place
        second = await asyncio.wait_for(
            engine.run(RunRequest("read my notes", context_paths=["vol:notes/memory"])), RUN_DEADLINE
        )
        # Through a planted link: refused before a run exists, with the reason.
        with pytest.raises(VolumeError, match="symbolic link"):
            await engine.start_run(RunRequest("read my notes", context_paths=["vol:notes/memory/leakdir/secret.txt"]))
        assert len(engine.list_runs()) == 2
        events = [e for r in (first, second) for e in engine.events(r.run_id)]
    assert second.status == "succeeded" and second.answer == "legit note"
    loaded = next(e for e in events if e["run_id"] == second.run_id and e["kind"] == "context.loaded")
    assert {s.split(":", 2)[1] for s in loaded["data"]["skipped"]} == {
        "notes/memory/leak.txt", "notes/memory/leakdir", "notes/memory/pipe"
    }  # fmt: skip
    assert SECRET not in json.dumps(events)
    assert all(SECRET not in json.dumps(r.messages) for r in oracle.requests())
    assert outside_state(outside) == before


@pytest.mark.anyio
async def test_a_step_past_the_quota_is_trimmed_and_the_run_goes_on(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_VOLUME_QUOTA_MB", "1")
    v = "import pathlib\nv = pathlib.Path(volumes['notes'])\n"
    oracle.add(Scenario("fill the volume", [
        v + "(v / 'memory' / 'keep.txt').write_text('keep me')\nprint('kept')",
        v + "(v / 'artifacts' / 'big.bin').write_bytes(b'x' * 3_000_000)\nprint('wrote big')",
        v + "print('big there:', (v / 'artifacts' / 'big.bin').exists(), (v / 'memory' / 'keep.txt').read_text())",
        "SUBMIT('done')",
    ]))  # fmt: skip
    oracle.add(Scenario("after the quota", [v + "(v / 'memory' / 'next.txt').write_text('fine')\nSUBMIT('next ok')"]))
    async with Engine() as engine:
        result = await asyncio.wait_for(engine.run(RunRequest("fill the volume", volume="notes")), RUN_DEADLINE)
        warnings = [e["data"]["message"] for e in engine.events(result.run_id) if e["kind"] == "warning"]
        following = await asyncio.wait_for(engine.run(RunRequest("after the quota", volume="notes")), RUN_DEADLINE)
        usage = engine.volumes.usage("notes")
        vol = engine.volumes.path("notes")
    assert result.status == "succeeded" and result.answer == "done"
    after_big = json.dumps(oracle.requests("root")[2].messages[-1])  # what the model saw after step 2
    assert "wrote big" in after_big and "volume notes is over quota" in after_big
    assert "artifacts/big.bin" in after_big and "FLEET_VOLUME_QUOTA_MB" in after_big
    assert "big there: False keep me" in json.dumps(oracle.requests("root")[3].messages[-1])
    assert any("over quota" in w for w in warnings)
    assert not (vol / "artifacts" / "big.bin").exists() and (vol / "memory" / "keep.txt").read_text() == "keep me"
    assert following.answer == "next ok" and (vol / "memory" / "next.txt").read_text() == "fine"
    assert usage.bytes <= 1024 * 1024
