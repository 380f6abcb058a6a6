from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.sandbox.local import LocalSandbox, detect_isolation

BWRAP_OK, BWRAP_WHY = detect_isolation()[0] == "bwrap", detect_isolation()[1]

# Every isolation mode this machine can run; bwrap is skipped (with the reason) only when unusable.
MODES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not BWRAP_OK, reason=f"bwrap unusable: {BWRAP_WHY}")),
    "none",
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def make_sandbox(tmp_path: Path) -> AsyncIterator[Callable[..., LocalSandbox]]:
    """Factory for started-on-demand sandboxes in tmp_path/work, all shut down after the test."""
    created: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        kwargs.setdefault("isolation", "none")
        sandbox = LocalSandbox(kwargs.pop("work_dir", tmp_path / "work"), **kwargs)
        created.append(sandbox)
        return sandbox

    yield make
    for sandbox in created:
        await sandbox.shutdown()


@pytest.fixture(scope="session")
def daytona_double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The Daytona API double (tests/support/daytona_api.py) on its own loop, for the whole session."""
    from tests.support.daytona_api import DoubleThread

    if not BWRAP_OK:
        pytest.skip(f"the Daytona double needs bubblewrap, unusable here: {BWRAP_WHY}")
    with DoubleThread(tmp_path_factory.mktemp("daytona")) as double:
        yield double
