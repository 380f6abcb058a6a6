"""The volumes seam: ``volumes_for`` picks the store ``settings.sandbox`` names from the registry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_rlm.config import ConfigError, Settings
from fleet_rlm.core.workspace import Workspace
from fleet_rlm.volumes import LocalVolumes, Volumes, register_volumes, volumes_for
from fleet_rlm.volumes import base as volumes_base


def test_each_built_in_sandbox_gets_volumes(tmp_path: Path) -> None:
    local = volumes_for(Settings(sandbox="local", home=tmp_path))
    daytona = volumes_for(
        Settings(sandbox="daytona", home=tmp_path, daytona_api_url="http://127.0.0.1:9", daytona_api_key="k")
    )
    assert isinstance(local, LocalVolumes) and local.root == tmp_path / "volumes"
    assert type(daytona).__name__ == "DaytonaVolumes"
    assert isinstance(local, Volumes) and isinstance(daytona, Volumes)


def test_an_unknown_sandbox_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "cloud")
    with pytest.raises(ConfigError) as caught:
        volumes_for(Settings(home=tmp_path))
    message = str(caught.value)  # the known names: the built-ins, and any a test in this process registered
    assert message.startswith("no volumes for sandbox 'cloud' in this version (known: daytona, ")
    assert "local" in message and message.endswith("): set FLEET_SANDBOX=local (or unset it)")


def test_reading_runs_needs_no_volumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sandbox setting no store serves fails what needs volumes (here, listing them), never by
    # swapping in other volumes, and leaves reading runs working (so the setting can be fixed).
    monkeypatch.setenv("FLEET_SANDBOX", "cloud")
    with Workspace.open(Settings(home=tmp_path)) as ws:
        assert ws.list_runs().runs == []
        with pytest.raises(ConfigError, match="no volumes for sandbox 'cloud'"):
            ws.volume_list()


def test_a_registered_store_is_used_for_its_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volumes_base, "REGISTRY", dict(volumes_base.REGISTRY))  # this test's registration only
    elsewhere = LocalVolumes(tmp_path / "elsewhere")
    register_volumes("elsewhere", lambda settings: elsewhere)
    assert volumes_for(Settings(sandbox="elsewhere", home=tmp_path)) is elsewhere


def test_importing_volumes_and_using_local_ones_leaves_the_daytona_sdk_out(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fleet_rlm.config import Settings\n"
        "from fleet_rlm.volumes import volumes_for\n"
        f"volumes_for(Settings(sandbox='local', home={str(tmp_path)!r})).ensure('notes')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'daytona' or m == 'fleet_rlm.volumes.daytona'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "volumes" / "notes" / "memory").is_dir()
