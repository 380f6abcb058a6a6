"""Sandboxed code started by a root server keeps no power: no capability, an unprivileged uid, no
nested user namespace, and a seccomp filter that refuses the mount family on its own.

Each attack is what hostile code would try to reach the host from inside bubblewrap: remount a
read-only bind writable and write through it (the worker script lives in this checkout, the
interpreter's prefix and /usr are the host's), mount a big tmpfs, chroot, unmount, set the hostname,
make a user namespace to regain capabilities. The verdict is taken on the host: the files' bytes,
the folders' entries, the sandbox's mounts as the host's /proc shows them. CI runs as root.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.sandbox import local, seccomp
from fleet_rlm.sandbox.local import WORKER_SCRIPT, LocalSandbox, SandboxError, detect_isolation
from fleet_rlm.types import RunRequest
from tests.support import prereqs
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

PREFIX = os.path.realpath(sys.base_prefix)
CANARY = "fleet-root-canary"  # the name of every file an attack tries to create on the host
# Targets the code tries to remount writable, then write through.
TARGETS = ["/fleet/worker.py", "/usr", "/etc/ld.so.cache", PREFIX, "/", "/dev"]
WRITES = {
    "worker": "/fleet/worker.py",  # appended to: the checkout's file on the host
    "prefix": f"{PREFIX}/{CANARY}.py",
    "usr": f"/usr/lib/{CANARY}",
    "ld_cache": "/etc/ld.so.cache",
}

ATTACK = f"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
def said(result):
    return "allowed" if result == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
report = {{}}
head, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
libc.capget(head, data)
report["effective"] = data[0] | data[3] << 32
report["permitted"] = data[1] | data[4] << 32
report["uid"], report["gid"] = os.getuid(), os.getgid()
for target in {TARGETS!r} + EXTRA_TARGETS:
    report["remount " + target] = said(libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND, None))
    report["remount-plain " + target] = said(libc.mount(None, target.encode(), None, MS_REMOUNT, None))
report["tmpfs"] = said(libc.mount(b"big", b"/tmp", b"tmpfs", 0, b"size=10g"))
report["chroot"] = said(libc.chroot(b"/tmp"))
report["umount2"] = said(libc.umount2(b"/usr", 2))
report["sethostname"] = said(libc.sethostname(b"owned", 5))
report["unshare"] = said(libc.unshare(0x10000000 | 0x20000))  # CLONE_NEWUSER | CLONE_NEWNS
for name, path in {WRITES!r}.items() | EXTRA_WRITES.items():
    try:
        with open(path, "ab") as fh:
            fh.write(b"# {CANARY}\\n")
        report["write " + name] = "allowed"
    except OSError as exc:
        report["write " + name] = errno.errorcode.get(exc.errno, str(exc))
"""


def attack(extra_targets: list[str] | None = None, extra_writes: dict[str, str] | None = None) -> str:
    prelude = f"EXTRA_TARGETS = {extra_targets or []!r}\nEXTRA_WRITES = {extra_writes or {}!r}\n"
    return prelude + ATTACK + "print(repr(report))\n"


def digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextmanager
def host_unchanged(*extra: Path) -> Iterator[None]:
    """The host files the attacks aim at are byte for byte the same afterwards, and no canary exists."""
    files = [WORKER_SCRIPT, Path("/etc/ld.so.cache"), *extra]
    before = {str(p): digest(p) for p in files if p.is_file()}
    yield
    after = {str(p): digest(p) for p in files if p.is_file()}
    assert after == before, "a host file changed"
    planted = [p for p in (Path(PREFIX) / f"{CANARY}.py", Path("/usr/lib") / CANARY) if p.exists()]
    for path in planted:
        path.unlink()
    assert not planted, f"the sandbox created files on the host: {planted}"


def sandbox_pids(top: int) -> list[int]:
    """The sandbox's processes: bwrap's descendants, as the host's /proc lists them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [top]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue += children.get(pid, [])
    return found


def mount_options(pid: int) -> dict[str, set[str]]:
    """Mount point -> its per-mount options, read from the host's /proc for the sandbox's process."""
    table: dict[str, set[str]] = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        table[fields[4]] = set(fields[5].split(","))
    return table


def report_of(stdout: str) -> dict[str, Any]:
    return ast.literal_eval(stdout.strip().splitlines()[-1])


def refused_everywhere(report: dict[str, Any]) -> list[str]:
    """The attacks that were not refused (an empty list is the pass)."""
    return [key for key, value in report.items() if value == "allowed"]


@pytest.fixture
def root_bwrap() -> None:
    if os.geteuid() != 0:
        pytest.skip("these attacks concern a server run as root (CI runs as root)")
    prereqs.require("bubblewrap", detect_isolation()[0] == "bwrap")


@pytest.fixture
async def make_sandbox(tmp_path: Path) -> AsyncIterator[Callable[..., LocalSandbox]]:
    created: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        kwargs.setdefault("exec_timeout", 60)
        sandbox = LocalSandbox(tmp_path / "work" / f"sb{len(created)}", isolation="bwrap", **kwargs)
        created.append(sandbox)
        return sandbox

    yield make
    for sandbox in created:
        await sandbox.shutdown()


async def test_as_root_the_code_holds_no_capability_and_every_bind_stays_read_only(
    root_bwrap: None, make_sandbox: Callable[..., LocalSandbox], tmp_path: Path
) -> None:
    volume = tmp_path / "replayed"
    volume.mkdir()
    (volume / "kept.md").write_text("recorded")
    sb = make_sandbox(volumes={"v": volume}, read_only_volumes=True)  # a replay's volume
    mounted = sb.volume_paths["v"]
    with host_unchanged(volume / "kept.md"):
        result = await sb.execute(attack([mounted], {"volume": f"{mounted}/kept.md", "new": f"{mounted}/new.md"}))
        assert result.error is None, result.error
        report = report_of(result.stdout)
        # What the host sees of the sandbox's mounts after the attack: still read-only.
        worker = max(sandbox_pids(sb.pid or 0))
        mounts = mount_options(worker)
    assert (report["effective"], report["permitted"]) == (0, 0)
    assert (report["uid"], report["gid"]) == (65534, 65534)
    assert refused_everywhere(report) == [], report
    for point in ["/fleet/worker.py", "/usr", "/etc/ld.so.cache", "/", "/dev", mounted, PREFIX]:
        assert "ro" in mounts[point], (point, mounts[point])
    assert sorted(p.name for p in volume.iterdir()) == ["kept.md"]
    # The code still does what code needs: threads (clone3 answers ENOSYS, libc falls back) and processes.
    work = await sb.execute(
        "import subprocess, threading\nt = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "subprocess.run(['/usr/bin/env', 'true'], check=True).returncode"
    )
    assert work.error is None and work.value == "0" and "thread" in work.stdout


@pytest.mark.parametrize("wall", ["seccomp", "privileges"])
async def test_each_wall_holds_alone(
    root_bwrap: None,
    make_sandbox: Callable[..., LocalSandbox],
    monkeypatch: pytest.MonkeyPatch,
    wall: str,
) -> None:
    """One missing flag is not the whole defence: with the capabilities kept (root in the sandbox's
    namespace), the seccomp filter alone refuses every remount; with no filter, the dropped
    capabilities alone do."""
    if wall == "seccomp":
        if not seccomp.supported():
            pytest.skip(f"no seccomp filter is written for this architecture ({os.uname().machine})")
        monkeypatch.setattr(local, "_PRIVILEGES", ["--unshare-user"])  # uid 0, every capability
    else:
        monkeypatch.setattr(local, "_seccomp_fd", lambda wanted=True: _no_filter())
    sb = make_sandbox()
    with host_unchanged():
        result = await sb.execute(attack())
        assert result.error is None, result.error
        report = report_of(result.stdout)
    if wall == "seccomp":
        assert report["effective"] != 0, "the test must run the code with its capabilities kept"
    assert refused_everywhere(report) == [], report


@contextmanager
def _no_filter() -> Iterator[list[str]]:
    yield []


async def test_a_child_rlm_runs_as_powerless_as_its_root(
    root_bwrap: None, fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "local")
    steps = [attack(), "kid = rlm_query('child attack: try it too', context='x')\nprint(kid)", "SUBMIT(kid)"]
    oracle.add(Scenario("root attack", steps))
    oracle.add(Scenario("child attack", [attack(), "SUBMIT(repr(report))"]))
    with host_unchanged():
        async with Engine() as engine:
            result = await engine.run(RunRequest("root attack: escape", context_text=["x"]))
            events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    root_report = report_of(next(e["data"]["output"] for e in events if e["kind"] == "code.executed"))
    child_report = ast.literal_eval(result.answer)
    for report in (root_report, child_report):
        assert report["effective"] == 0 and report["uid"] == 65534
        assert refused_everywhere(report) == [], report


def test_as_root_without_isolation_a_run_is_refused_unless_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(local.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local, "detect_isolation", lambda: ("none", "bubblewrap not found"))
    with pytest.raises(SandboxError) as refused:
        LocalSandbox(tmp_path / "w")
    assert "as root" in str(refused.value) and "apt-get install bubblewrap" in str(refused.value)
    assert "FLEET_ISOLATION=none" in str(refused.value)
    accepted = LocalSandbox(tmp_path / "w", isolation="none")  # the explicit setting accepts the risk
    assert accepted.isolation == "none"


def test_the_cli_refuses_a_root_run_without_bubblewrap_before_any_model_call(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the refusal concerns a server run as root (CI runs as root)")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **fleet_env, "PATH": str(bin_dir)}  # no /usr/bin: bubblewrap is not found
    env.pop("FLEET_SANDBOX", None)
    (tmp_path / "notes.txt").write_text("some notes")
    refused = subprocess.run(
        [str(bin_dir / "fleet-rlm"), "run", "what is in the notes?", "--context", str(tmp_path / "notes.txt")],
        capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "as root" in refused.stderr and "apt-get install bubblewrap" in refused.stderr
    assert "FLEET_ISOLATION=none" in refused.stderr
    assert oracle.requests() == []  # refused before the first model call
    doctor = subprocess.run(
        [str(bin_dir / "fleet-rlm"), "doctor"], capture_output=True, text=True, env=env, timeout=120
    )
    sandbox_line = next(line for line in doctor.stdout.splitlines() if " sandbox " in line)
    assert sandbox_line.startswith("!!") and "as root, runs are refused" in sandbox_line


def test_doctor_shows_the_privileges_the_code_holds(fleet_env: dict) -> None:
    prereqs.require("bubblewrap", detect_isolation()[0] == "bwrap")
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "fleet-rlm"), "doctor", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **fleet_env},
    )
    checks = json.loads(proc.stdout)
    assert "uid 65534 with no capabilities (measured inside)" in checks["sandbox"]["detail"]
    rows = {row["name"]: row for row in checks["caps"]["caps"]}
    assert rows["privileges"]["enforced"] and "--cap-drop ALL" in rows["privileges"]["how"]
    assert rows["syscalls"]["enforced"] == seccomp.supported()
