from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_rlm.store import Store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "state" / "fleet.db")
    yield s
    s.close()
