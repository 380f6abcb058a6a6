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


@pytest.mark.slow
async def test_a_huge_or_long_run_reference_is_a_404_quoting_only_its_head(fake_env: dict[str, str]) -> None:
    # last~N past any count of runs was an OverflowError; 60,000 characters were sqlite's "LIKE pattern too
    # complex": both a 500 "internal error". 30,000 characters came back whole in the 404.
    seed_runs(Path(fake_env["FLEET_HOME"]))
    async with api_client() as client:
        for ref in ("last~99999999999999999999", "a" * 60_000, "b" * 30_000, "last~" + "9" * 70):
            for url in (f"/api/runs/{ref}", f"/api/runs/{ref}/trace", f"/api/runs/{ref}/export"):
                answer = await client.get(url)
                assert answer.status_code == 404, (url[:60], answer.status_code, answer.text[:300])
                message = answer.json()["message"]
                assert message.startswith(f"no run '{ref[:80]}"), message[:300]
                assert len(message) < 300, len(message)
        long = (await client.get(f"/api/runs/{'b' * 30_000}")).json()["message"]
        assert f"'{'b' * 80}…'" in long
        huge = (await client.get("/api/runs/last~99999999999999999999")).json()["message"]
        assert huge.startswith("no run 'last~99999999999999999999': there are fewer than"), huge
