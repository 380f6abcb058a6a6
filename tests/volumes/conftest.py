from pathlib import Path

import pytest

from fleet_rlm.volumes import LocalVolumes
from tests.sandbox.conftest import daytona_double  # noqa: F401  (the Daytona API double, for the contract suite)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def vols(tmp_path: Path) -> LocalVolumes:
    return LocalVolumes(tmp_path / "volumes")
