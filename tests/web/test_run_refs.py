"""Web URLs take a run as the CLI does: `last`, `last~N`, or a unique start or end of its id."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.run_refs import MIDDLE, NEWEST, seed_runs
from tests.web.conftest import api_client

pytestmark = pytest.mark.anyio


@pytest.mark.slow
async def test_run_urls_take_last_and_a_suffix(fake_env: dict[str, str]) -> None:
    seed_runs(Path(fake_env["FLEET_HOME"]))
    async with api_client() as client:
        last = await client.get("/api/runs/last")
        assert last.status_code == 200 and last.json()["run_id"] == NEWEST
        assert (await client.get("/api/runs/last~1")).json()["run_id"] == MIDDLE
        export = await client.get(f"/api/runs/{MIDDLE[-6:]}/export")
        assert f'filename="{MIDDLE}.jsonl"' in export.headers["content-disposition"]
        ambiguous = await client.get("/api/runs/cafe")
        assert ambiguous.status_code == 400 and "matches more than one run" in ambiguous.text
        assert (await client.get("/api/runs/9999")).status_code == 404
