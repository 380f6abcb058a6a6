"""What fleet-rlm keeps on disk (questions, answers, traces, settings) is readable by its user only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

BIN = Path(sys.executable).parent


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common default umask (022), so files are group/world-readable unless made private."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("open_umask")
async def test_home_store_and_scratch_are_private_after_a_run(fleet_env: dict[str, str], oracle: OracleLM) -> None:
    oracle.add(Scenario("private", ["SUBMIT('ok')"]))
    home = Path(fleet_env["FLEET_HOME"])
    async with Engine() as engine:
        result = await engine.run(RunRequest("private", context_text=["x"]))
        assert result.answer == "ok"
        db_files = {p.name: mode(p) for p in home.iterdir() if p.name.startswith("fleet.db")}
    assert {"fleet.db", "fleet.db-wal", "fleet.db-shm"} <= set(db_files), db_files  # taken while open
    assert set(db_files.values()) == {0o600}, db_files
    assert mode(home) == 0o700 and mode(home / "work") == 0o700
    assert mode(home / "fleet.db") == 0o600


@pytest.mark.usefixtures("open_umask")
async def test_an_older_open_home_is_tightened(fleet_env: dict[str, str]) -> None:
    home = Path(fleet_env["FLEET_HOME"])
    home.mkdir(mode=0o755)
    (home / "fleet.db").touch(mode=0o644)
    async with Engine():
        pass
    assert mode(home) == 0o700 and mode(home / "fleet.db") == 0o600


@pytest.mark.slow
def test_settings_file_is_private(fleet_env: dict[str, str]) -> None:
    env = {**os.environ, **fleet_env}
    out = subprocess.run(
        [str(BIN / "fleet-rlm"), "config", "set", "max_iters", "7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        umask=0o022,
    )
    assert out.returncode == 0, out.stderr
    settings = Path(fleet_env["FLEET_HOME"]) / "settings.json"
    assert '"max_iters": "7"' in settings.read_text()
    assert mode(settings) == 0o600 and mode(settings.parent) == 0o700


@pytest.mark.slow
def test_settings_saved_at_once_by_many_writers_stay_whole(fleet_env: dict[str, str]) -> None:
    """Two saves at the same moment (`config set` and the web app, say) neither fail nor leave a
    torn or temporary file behind: the last one wins whole."""
    from concurrent.futures import ThreadPoolExecutor

    from fleet_rlm.config import read_user_settings, write_user_settings

    def save(n: int) -> None:
        write_user_settings({"max_iters": str(n), "filler": "x" * 4096})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(save, range(400)))  # raises here if any save failed
    saved = read_user_settings()
    assert saved["filler"] == "x" * 4096 and 0 <= int(saved["max_iters"]) < 400
    home = Path(fleet_env["FLEET_HOME"])
    assert [p.name for p in home.iterdir() if p.name.endswith(".tmp")] == []
    assert mode(home / "settings.json") == 0o600


def test_settings_updated_at_once_keep_every_change(fleet_env: dict[str, str]) -> None:
    """Saves of different keys at the same moment (`config set` in one terminal, `config unset` in
    another, the web app) read, change and write the file one at a time: none is lost."""
    from concurrent.futures import ThreadPoolExecutor

    from fleet_rlm.config import read_user_settings, update_user_settings

    def save(n: int) -> None:
        update_user_settings(lambda values: values.update({f"key{n}": n}))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(save, range(200)))
    assert read_user_settings() == {f"key{n}": n for n in range(200)}
    assert mode(Path(fleet_env["FLEET_HOME"]) / ".settings.lock") == 0o600
