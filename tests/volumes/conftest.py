from pathlib import Path

import pytest

from fleet_rlm.volumes import LocalVolumes


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def vols(tmp_path: Path) -> LocalVolumes:
    return LocalVolumes(tmp_path / "volumes")
