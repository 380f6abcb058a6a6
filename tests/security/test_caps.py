"""Whole-sandbox caps (memory, processes/threads, RAM-backed space) and hidden host paths.

Sandboxed code is hostile, so every cap is hit on purpose and checked on the HOST: the cgroup's own
counters, the processes and groups left behind. Where only the code's view can show a leak (host
paths), the sandbox writes what it can read into its work folder and the host searches that file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.sandbox.caps import SHM_BYTES, TMP_BYTES, WORKER_TASKS, SandboxCgroup, detect_cgroups
from fleet_rlm.sandbox.local import LocalSandbox, SandboxError, detect_isolation
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

CGROUPS = detect_cgroups()
needs_bwrap = pytest.mark.skipif(detect_isolation()[0] != "bwrap", reason=f"bwrap: {detect_isolation()[1]}")
needs_cgroups = pytest.mark.skipif(CGROUPS.version is None, reason=f"no cgroups here: {CGROUPS.why_not}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the root path (RLIMIT_NPROC ignored) needs root")
CHECKOUT = Path(__file__).resolve().parents[2]
MB = 1 << 20

# Three children of 150 MB each: every one is under the 256 MB per-process RLIMIT_AS, together over the cap.
HOGS = """
import subprocess, sys
code = "import sys; b = b'x' * (150 << 20); print('held', flush=True); sys.stdin.read()"
kids = [subprocess.Popen([sys.executable, "-I", "-S", "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True) for _ in range(3)]
held = [k.stdout.readline().strip() == "held" for k in kids]
for k in kids:
    k.stdin.close()
codes = [k.wait() for k in kids]
print("held", held, "exit codes", codes)
"""

BOMB = """
import os, threading
release = threading.Event()
threads, thread_error = [], None
try:
    for _ in range(1000):
        t = threading.Thread(target=release.wait)
        t.start()
        threads.append(t)
except RuntimeError as e:
    thread_error = str(e)
release.set()
for t in threads:
    t.join()
r, w = os.pipe()
kids, fork_error = [], None
try:
    for _ in range(1000):
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    fork_error = e.strerror
os.close(w)
for pid in kids:
    os.waitpid(pid, 0)
os.close(r)
(len(threads), thread_error, len(kids), fork_error)
"""

# Everything the code can read that might name a host folder, written to the work folder for the host.
SCAN = """
import os, sys, traceback
seen = [repr(dict(os.environ)), repr(sys.path), repr(sys.argv), os.getcwd(), sys.executable,
        repr(sorted(str(getattr(m, "__file__", "")) for m in list(sys.modules.values()))),
        "proc exists: %s" % os.path.exists("/proc")]
try:
    open("/no/such/file")
except OSError:
    seen.append(traceback.format_exc())
skip = {"/usr", os.path.realpath(sys.base_prefix), "/fleet/work"}
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    seen.append(top + ": " + repr(dirs + files))
    for name in dirs + files:
        path = os.path.join(top, name)
        if os.path.islink(path):
            seen.append(path + " -> " + os.readlink(path))
        elif os.path.isfile(path):
            try:
                with open(path, "rb") as fh:
                    seen.append(fh.read(1 << 20).decode("utf-8", "replace"))
            except OSError as e:
                seen.append(path + ": " + str(e))
open("scan.txt", "w").write("\\n".join(seen))
len(seen)
"""


def host_paths(home: Path) -> list[str]:
    """Host folders that must never be visible inside: FLEET_HOME, the checkout, the venv."""
    paths = {str(home), str(CHECKOUT), sys.prefix, os.path.realpath(sys.prefix)}
    return sorted(p for p in paths if p not in ("/", ""))


def gone(pid: int) -> bool:
    """No such process any more (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def own_groups() -> list[Path]:
    """Sandbox cgroups this test process created that still exist."""
    return [g for _, parent in CGROUPS.parents for g in parent.glob(f"sb-{os.getpid()}-*")]


@pytest.fixture
async def make_sandbox(tmp_path: Path) -> AsyncIterator[Callable[..., LocalSandbox]]:
    created: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        kwargs.setdefault("isolation", "bwrap")
        sandbox = LocalSandbox(tmp_path / "home" / "work" / f"sb{len(created)}", **kwargs)
        created.append(sandbox)
        return sandbox

    yield make
    for sandbox in created:
        await sandbox.shutdown()


@needs_bwrap
@needs_cgroups
async def test_memory_cap_holds_for_all_processes_together(make_sandbox):
    sb = make_sandbox(memory_mb=256)
    await sb.execute("kept = 'still here'")
    r = await sb.execute(HOGS)
    assert r.error is None, r.error
    assert "-9" in r.stdout  # the model reads which child the out-of-memory killer ended
    stats = sb._cgroup.stats()
    assert stats["memory_limit"] == 256 * MB
    assert stats["memory_peak"] <= 256 * MB  # 450 MB were asked for, the kernel held the line
    assert stats["oom_kills"] >= 1
    assert (await sb.execute("kept")).value == repr("still here")


@needs_bwrap
@needs_cgroups
async def test_worker_killed_by_the_memory_cap_says_so_and_a_new_sandbox_works(make_sandbox):
    sb = make_sandbox(memory_mb=128)
    # RAM-backed files count against the cap but not against the worker's RLIMIT_AS.
    fill = "open('/tmp/f', 'wb').write(b'x' * (60 << 20)); open('/dev/shm/f', 'wb').write(b'x' * (15 << 20))"
    with pytest.raises(SandboxError, match=r"out of memory \(the sandbox's cap is 128 MB"):
        # 75 MB of files + 60 MB here + the interpreter is over the cgroup's 128 MB, while this process's
        # own address space stays under its 128 MB RLIMIT_AS (so no MemoryError comes first).
        await sb.execute(fill + "\nbig = b'y' * (60 << 20)")
    assert sb._cgroup.stats()["oom_kills"] >= 1
    fresh = make_sandbox(memory_mb=128)
    assert (await fresh.execute("1 + 1")).value == "2"


@needs_root
@needs_bwrap
@needs_cgroups
async def test_thread_and_fork_bomb_are_capped_even_as_root(make_sandbox):
    assert os.geteuid() == 0  # the case RLIMIT_NPROC cannot cover
    sb = make_sandbox(max_procs=16)
    r = await sb.execute(BOMB)
    assert r.error is None, r.error
    threads, thread_error, kids, fork_error = eval(r.value)
    assert thread_error == "can't start new thread" and fork_error == "Resource temporarily unavailable"
    assert threads < 16 + WORKER_TASKS and kids < 16 + WORKER_TASKS
    stats = sb._cgroup.stats()
    assert stats["pids_max"] == 16 + WORKER_TASKS
    assert (stats["pids_peak"] or 0) <= stats["pids_max"] and stats["pids_limit_hits"] >= 2  # peak: kernel >= 6.1
    assert (await sb.execute("21 * 2")).value == "42"
    assert (await make_sandbox(max_procs=16).execute("1 + 1")).value == "2"


@needs_bwrap
async def test_ram_backed_space_is_read_only_or_capped(make_sandbox):
    sb = make_sandbox()
    await sb.execute(
        "def fill(path, mb):\n    done = 0\n    try:\n        with open(path, 'wb') as fh:\n"
        "            for _ in range(mb):\n                fh.write(b'x' * (1 << 20)); fh.flush(); done += 1\n"
        "    except OSError as e:\n        return done, str(e)\n    return done, None\n"
    )
    for path in ("/big", "/dev/big", "/fleet/big"):
        r = await sb.execute(f"fill({path!r}, 1)")
        assert r.value == repr((0, f"[Errno 30] Read-only file system: {path!r}")), r.value
    for path, cap in (("/tmp/big", TMP_BYTES), ("/dev/shm/big", SHM_BYTES)):
        r = await sb.execute(f"fill({path!r}, 200)")
        written, error = eval(r.value)
        assert error == "[Errno 28] No space left on device" and written <= cap // MB
    assert sb.alive and (await sb.execute("1 + 1")).value == "2"
    if sb._cgroup is not None:  # host view: the RAM used stayed near the two small caps
        assert sb._cgroup.stats()["memory_peak"] < TMP_BYTES + SHM_BYTES + 128 * MB


@needs_bwrap
async def test_no_host_path_is_visible_inside(make_sandbox, tmp_path: Path):
    sb = make_sandbox(env={"EXTRA": "given"})
    r = await sb.execute(SCAN)
    assert r.error is None, r.error
    error = (await sb.execute("open('/no/such/file')")).error  # error text the model would see
    seen = (sb.work_dir / "scan.txt").read_text() + error
    assert "proc exists: False" in seen and "def main(" in seen  # no /proc; the scan read worker.py
    leaked = [p for p in host_paths(tmp_path / "home") if p in seen]
    assert not leaked, f"host paths visible in the sandbox: {leaked}"


@pytest.mark.parametrize("mode", ["bwrap", "none"])
@needs_cgroups
async def test_shutdown_leaves_no_cgroup_and_no_process(make_sandbox, mode):
    if mode == "bwrap" and detect_isolation()[0] != "bwrap":
        pytest.skip(detect_isolation()[1])
    sb = make_sandbox(isolation=mode)
    # A daemon in its own session escapes the process-group kill; only the cgroup still holds it.
    code = (
        "import subprocess, sys\n"
        "d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        "d.pid"
    )
    assert (await sb.execute(code)).error is None
    pids, groups = sb._cgroup.pids(), list(sb._cgroup.groups.values())
    assert len(pids) >= 2 and all(g.is_dir() for g in groups)
    await sb.shutdown()
    with anyio.fail_after(5):  # a killed task leaves its cgroup before it has finished exiting
        while left := [p for p in pids if not gone(p)]:
            await anyio.sleep(0.05)
    assert not left
    assert not [g for g in groups if g.exists()]


@needs_cgroups
async def test_stale_empty_groups_of_dead_servers_are_removed(make_sandbox):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [parent / f"sb-{dead.pid}-0badc0de" for _, parent in CGROUPS.parents]
    for group in stale:
        group.mkdir(exist_ok=True)
    sb = make_sandbox(isolation="none")
    await sb.start()
    assert not [g for g in stale if g.exists()]


def _read_only_cgroups_script(body: str) -> list[str]:
    """A shell that re-mounts every cgroup file system read-only (in a private mount namespace),
    as on a host that offers no writable cgroups, then runs ``body``."""
    points = [
        line.split(" - ")[0].split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split(" - ")[1].split()[0] in ("cgroup", "cgroup2")
    ]
    remounts = "".join(f"mount -o bind,remount,ro {p} && " for p in points)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", remounts + body]


@pytest.mark.slow
@needs_root
@needs_cgroups
def test_doctor_strict_fails_when_caps_are_not_enforced_and_sandboxes_still_run(fleet_env: dict, tmp_path):
    fleet = str(Path(sys.executable).parent / "fleet-rlm")
    env = {**os.environ, **fleet_env}
    ok = subprocess.run([fleet, "doctor", "--offline", "--strict", "--json"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert all(row["enforced"] for row in json.loads(ok.stdout)["caps"]["caps"])

    cmd = _read_only_cgroups_script(f"exec {fleet} doctor --offline --strict")
    weak = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert weak.returncode == 2, weak.stdout + weak.stderr
    assert "NOT ENFORCED: memory cap" in weak.stdout and "NOT ENFORCED: processes cap" in weak.stdout
    assert "Read-only file system" in weak.stdout and "not enforced" in weak.stderr
    # Without cgroups the sandbox still runs, with only per-process rlimits.
    probe = (
        "import asyncio, pathlib; from fleet_rlm.sandbox.local import LocalSandbox\n"
        "async def main():\n"
        f"    sb = LocalSandbox(pathlib.Path({str(tmp_path / 'w')!r}))\n"
        "    print('cgroup', sb._cgroup, 'value', (await sb.execute('6 * 7')).value)\n"
        "    await sb.shutdown()\n"
        "asyncio.run(main())\n"
    )
    script = tmp_path / "probe.py"
    script.write_text(probe)
    run = subprocess.run(
        _read_only_cgroups_script(f"exec {sys.executable} {script}"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.stdout.strip() == "cgroup None value 42", run.stdout + run.stderr


@needs_bwrap
@needs_cgroups
async def test_engine_run_survives_hitting_the_caps_and_hides_host_paths(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_MEMORY_MB", "256")
    scan = (
        "import os, sys, traceback\n"
        "try:\n    open('/no/such/file')\nexcept OSError:\n    err = traceback.format_exc()\n"
        "SUBMIT(repr([dict(os.environ), os.getcwd(), sys.path, sys.argv, os.listdir('/'), "
        "os.path.exists('/proc'), err]))"
    )
    oracle.add(Scenario("hog memory", [HOGS, BOMB, scan]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("hog memory then look around", context_text=["x"]))
    assert result.status == "succeeded", result.error
    assert "False" in result.answer  # no /proc
    leaked = [p for p in host_paths(Path(fleet_env["FLEET_HOME"])) if p in result.answer]
    assert not leaked, f"host paths visible in the sandbox: {leaked}"
    second = json.dumps(oracle.requests("root")[1].messages[-1])
    assert "exit codes" in second and "-9" in second  # the model saw the out-of-memory kill
    assert own_groups() == []


def test_cgroup_v2_files_are_written_and_read_as_the_kernel_expects(tmp_path: Path):
    # This host has cgroup v1 controllers only, so v2's file protocol is checked on a plain folder.
    group = tmp_path / "sb"
    group.mkdir()
    files = {"cgroup.procs": "", "memory.max": "max", "memory.swap.max": "max", "pids.max": "max"}
    files |= {"memory.events": "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n", "memory.peak": str(200 * MB)}
    files |= {"pids.current": "7", "pids.peak": "24", "pids.events": "max 3\n"}
    for name, text in files.items():
        (group / name).write_text(text)
    cgroup = SandboxCgroup(2, {"memory": group, "pids": group}, 256, 24)
    cgroup._set_limits()
    assert (group / "memory.max").read_text() == str(256 * MB)
    assert (group / "memory.swap.max").read_text() == "0" and (group / "pids.max").read_text() == "24"
    cgroup.preexec()()  # what the forked child runs: one write joins both controllers under v2
    assert (group / "cgroup.procs").read_text() == str(os.getpid())
    assert cgroup.stats() == {
        "memory_limit": 256 * MB,
        "memory_peak": 200 * MB,
        "oom_kills": 2,
        "pids_max": 24,
        "pids_current": 7,
        "pids_peak": 24,
        "pids_limit_hits": 3,
    }
