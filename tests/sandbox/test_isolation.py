"""What sandboxed code can and cannot reach, under bubblewrap and without it."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import pytest

from fleet_rlm.sandbox.local import detect_isolation

from .conftest import BWRAP_OK, BWRAP_WHY, MODES

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason=f"bwrap unusable: {BWRAP_WHY}")


def test_detect_isolation_explains_itself():
    mode, why = detect_isolation()
    assert mode in ("bwrap", "none")
    assert why and (mode == "bwrap" or "bubblewrap" in why)


@pytest.mark.parametrize("mode", MODES)
async def test_host_secrets_are_not_in_the_environment(make_sandbox, monkeypatch, mode):
    monkeypatch.setenv("FLEET_LM_API_KEY", "sk-secret-1234567890")
    sb = make_sandbox(isolation=mode, env={"EXTRA": "given"})
    r = await sb.execute("import os\ndict(os.environ)")
    assert r.error is None
    assert "sk-secret" not in r.value and "FLEET_LM_API_KEY" not in r.value
    env = eval(r.value)
    assert env["EXTRA"] == "given" and env["HOME"] == sb.sandbox_work_dir
    expected = {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "MALLOC_ARENA_MAX"}
    assert not set(env) - expected - {"EXTRA", "PWD"}


@pytest.mark.parametrize("mode", MODES)
async def test_work_dir_and_volume_are_writable_and_shared(make_sandbox, tmp_path: Path, mode):
    vol = tmp_path / "vol"
    sb = make_sandbox(isolation=mode, volumes={"out": vol})
    code = (
        f"open('note.txt', 'w').write('from work')\n"
        f"open({sb.volume_paths['out']!r} + '/result.txt', 'w').write('from volume')\n"
    )
    r = await sb.execute(code)
    assert r.error is None, r.error
    assert (tmp_path / "work" / "note.txt").read_text() == "from work"
    assert (vol / "result.txt").read_text() == "from volume"
    (vol / "from_host.txt").write_text("hello sandbox")
    seen = await sb.execute(f"open({sb.volume_paths['out']!r} + '/from_host.txt').read()")
    assert seen.value == repr("hello sandbox")


@needs_bwrap
async def test_bwrap_cannot_read_files_outside_its_folders(make_sandbox, tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the password")
    assert secret.read_text() == "the password"  # readable on the host ...
    sb = make_sandbox(isolation="bwrap")
    assert sb.isolation == "bwrap"
    probe = "def probe(p):\n    try:\n        return open(p).read()\n"
    probe += "    except OSError as e:\n        return type(e).__name__\n"
    await sb.execute(probe)
    r = await sb.execute(f"probe({str(secret)!r})")
    assert r.value == repr("FileNotFoundError")  # ... but does not exist in the sandbox
    # nor does the project (source, config, keys), even though the worker script comes from it
    project_file = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert project_file.exists()
    assert (await sb.execute(f"probe({str(project_file)!r})")).value == repr("FileNotFoundError")
    # system directories are read-only
    r = await sb.execute("open('/usr/fleet_probe', 'w')")
    assert r.error_kind == "exception" and "Read-only file system" in r.error


@needs_bwrap
async def test_bwrap_hides_the_host_home(make_sandbox):
    home = Path.home()
    visible_on_host = {p.name for p in home.iterdir()}
    sb = make_sandbox(isolation="bwrap")
    h = str(home)
    r = await sb.execute(f"import os\nsorted(os.listdir({h!r})) if os.path.isdir({h!r}) else []")
    assert r.error is None
    inside = set(eval(r.value))
    # at most the path down to the Python installation (e.g. ~/.pyenv) may exist, nothing else of ~
    allowed = set()
    base = Path(os.path.realpath(sys.base_prefix))
    if base.is_relative_to(home):
        allowed.add(base.relative_to(home).parts[0])
    assert inside <= allowed
    hidden = visible_on_host - allowed
    assert hidden, "test needs something in the host home to hide"
    assert not inside & hidden


@pytest.fixture
def tcp_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[object] = []

    def serve() -> None:
        try:
            conn, _ = server.accept()
            accepted.append(conn)
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.mark.parametrize("mode", MODES)
async def test_network(make_sandbox, tcp_server, mode):
    port, accepted = tcp_server
    sb = make_sandbox(isolation=mode)
    code = (
        "import socket\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
        "    outcome = 'connected'\n"
        "except OSError as e:\n    outcome = type(e).__name__\noutcome"
    )
    r = await sb.execute(code)
    assert r.error is None, r.error
    if mode == "bwrap":
        assert r.value != repr("connected") and accepted == []
    else:
        # without bubblewrap there is no network isolation: documents the difference honestly
        assert r.value == repr("connected")


@needs_bwrap
async def test_bwrap_tmp_is_small_so_ram_cannot_be_filled_through_it(make_sandbox):
    sb = make_sandbox(isolation="bwrap")
    code = (
        "chunk = b'x' * (1 << 20)\nwritten = 0\ntry:\n    with open('/tmp/fill', 'wb') as fh:\n"
        "        for _ in range(200):\n            fh.write(chunk); fh.flush(); written += 1\n"
        "except OSError as e:\n    print(type(e).__name__, e.errno)\nwritten"
    )
    r = await sb.execute(code)
    assert "OSError 28" in r.stdout  # ENOSPC
    assert int(r.value) < 100  # megabytes, far below the 200 attempted
