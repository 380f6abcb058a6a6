"""The suite's deadlines stretch with the machine's measured load, within a cap."""

from __future__ import annotations

import pytest

from tests.support import patience


@pytest.mark.parametrize(("load", "cores", "factor"), [(0.3, 2, 1.0), (2.0, 2, 1.0), (8.0, 2, 4.0), (90.0, 2, 6.0)])
def test_a_deadline_stretches_with_the_run_queue_per_core(
    monkeypatch: pytest.MonkeyPatch, load: float, cores: int, factor: float
) -> None:
    monkeypatch.setattr(patience.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(patience.os, "cpu_count", lambda: cores)
    assert patience.slowdown() == factor
    assert patience.patience(20) == 20 * factor
