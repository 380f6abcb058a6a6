"""Runs with ids chosen to test how a run is referred to (`last`, `last~N`, a unique start or end)."""

from __future__ import annotations

from pathlib import Path

from fleet_rlm.store import RunRecord, Store

OLDEST = "r19a00000001aacafe"
MIDDLE = "r19a00000002bbcafe"  # shares the end "cafe" with OLDEST: that end is ambiguous
NEWEST = "r19a00000003cc1234"
EVAL = "r19a00000004dd5678"  # newer still, but an optimization's replay: `last` skips it


def seed_runs(home: Path) -> None:
    """Four finished runs in ``home``'s store, each with a run.started event naming its id."""
    home.mkdir(parents=True, exist_ok=True)
    with Store(home / "fleet.db") as store:
        for n, run_id in enumerate((OLDEST, MIDDLE, NEWEST, EVAL), start=1):
            kind = "eval" if run_id == EVAL else "run"
            done = RunRecord(id=run_id, question=f"question {n}", status="succeeded", created_at=1.7e9 + n, kind=kind)
            store.runs.create(done)
            store.runs.append_event(run_id, "run.started", {"question": f"question {n}"})
