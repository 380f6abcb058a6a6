"""The JSON API of the optimization page, in process (the app's own Engine, the fast sandbox, the
scripted model): import, launch, follow the event stream, compare, promote (gate and override),
the next run uses the version, roll back. The page itself: tests/web/test_optimize_page.py."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.support.oracle_lm import OracleLM
from tests.web.conftest import api_client, parse_sse, wait_finished

pytestmark = pytest.mark.anyio


async def test_the_optimization_api(fake_env: dict, shout: OracleLM, shout_file: Path) -> None:
    async with api_client() as client:
        made = await client.post("/api/datasets", json={"name": "shout", "jsonl": shout_file.read_text()})
        assert made.status_code == 201, made.text
        assert (made.json()["train"], made.json()["holdout"]) == (8, 2)
        dup = await client.post("/api/datasets", json={"name": "shout", "jsonl": shout_file.read_text()})
        assert dup.status_code == 409 and "exists already" in dup.json()["message"]
        bad = await client.post("/api/datasets", json={"name": "x", "jsonl": "{nope"})
        assert bad.status_code == 400 and "line 1: not valid JSON" in bad.json()["message"]
        exported = (await client.get("/api/datasets/shout/export")).text.splitlines()
        assert len(exported) == 10 and json.loads(exported[0])["split"] in ("train", "holdout")

        started = await client.post("/api/optimizations", json={"dataset": "shout", "optimizer": "bootstrap",
                                                                "metric": "exact"})  # fmt: skip
        assert started.status_code == 202, started.text
        opt_id = started.json()["optimization_id"]
        assert started.json()["estimate"]["evaluations"] > 0
        with anyio.fail_after(120):
            while (state := (await client.get(f"/api/optimizations/{opt_id}")).json())["status"] == "running":
                await anyio.sleep(0.1)
        assert state["status"] == "succeeded" and state["scores"]["train_after"] == 1.0
        assert [t["trial"] for t in state["trials"]] == [1, 2] and state["gate"]["passed"] is True
        frames = parse_sse((await client.get(f"/api/optimizations/{opt_id}/events")).text)
        kinds = [f["event"] for f in frames if "event" in f]
        assert kinds[1] == "optimize.started" and kinds[-1] == "run.finished" and "optimize.eval" in kinds
        assert (await client.get("/api/optimizations/r-nope")).status_code == 404

        version = state["version_id"]
        cmp = (await client.get("/api/programs/compare", params={"a": "builtin", "b": version})).json()
        assert cmp["demos"]["act"]["only_b"] and cmp["scores"][version]["train_after"] == 1.0
        promoted = await client.post(f"/api/programs/{version}/promote", json={})
        assert promoted.status_code == 200 and promoted.json()["active"] == version
        again = await client.post(f"/api/programs/{version}/promote", json={})
        assert again.status_code == 409 and "already active" in again.json()["message"]

        run = await client.post("/api/runs", json={"question": "Shout the word in the context (plum)",
                                                   "context_text": ["Word: plum"]})  # fmt: skip
        finished = await wait_finished(client, run.json()["run_id"])
        assert finished["answer"] == "PLUM"
        back = await client.post("/api/programs/rollback")
        assert back.status_code == 200 and back.json()["active"] == "builtin"
        listed = (await client.get("/api/runs")).json()["runs"]
        assert [r["run_id"] for r in listed] == [run.json()["run_id"]], "replays stay out of the run list"
