"""The JSON API of the optimization page, in process (the app's own Engine, the fast sandbox, the
scripted model): import, launch, follow the event stream, compare, promote (gate and override),
the next run uses the version, roll back. The page itself: tests/web/test_optimize_page.py."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from fleet_rlm.web.app import create_app
from tests.support.oracle_lm import OracleLM
from tests.web.conftest import AUTH, TOKEN, api_client, parse_sse, serving, wait_finished

pytestmark = pytest.mark.anyio


@pytest.mark.slow
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


async def _workbench_run(client: httpx.AsyncClient, question: str, session: str | None, uploads: list[str]) -> dict:
    """A run as the Workbench starts it (its session, its uploaded files), once it has finished."""
    started = await client.post("/api/runs", json={"question": question, "session_id": session,
                                                   "upload_ids": uploads})  # fmt: skip
    assert started.status_code == 202, started.text
    return await wait_finished(client, started.json()["run_id"])


async def test_workbench_runs_judged_in_the_browser_become_a_dataset(fake_env: dict, shout: OracleLM) -> None:
    """The documented loop over real HTTP, with runs as the Workbench makes them (every one in a
    session): a session's first run becomes a row; its follow-up is skipped with the real reason; a
    failed run without an answer cannot be marked correct."""
    with serving(create_app(token=TOKEN)) as base:
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as client:
            upload = await client.post("/api/uploads", files={"file": ("word.txt", b"Word: plum")})
            assert upload.status_code == 201, upload.text
            session = (await client.post("/api/sessions", json={"name": "shout"})).json()["id"]
            first = await _workbench_run(client, "Shout the word in the context (plum)", session,
                                         [upload.json()["uploads"][0]["upload_id"]])  # fmt: skip
            follow_up = await _workbench_run(client, "Shout the word in the context (again)", session, [])
            assert first["answer"] == follow_up["answer"] == "plum"
            shout.state.fail_next.append(500)
            other = (await client.post("/api/sessions", json={"name": "fails"})).json()["id"]
            failed = await _workbench_run(client, "Shout the word in the context (fig)", other, [])
            assert failed["status"] == "failed" and not failed["answer"]

            for run in (first, follow_up):
                judged = await client.post(f"/api/runs/{run['run_id']}/feedback", json={"correct": True})
                assert judged.status_code == 201, judged.text
            refused = await client.post(f"/api/runs/{failed['run_id']}/feedback", json={"correct": True})
            assert refused.status_code == 409 and "gave no answer" in refused.json()["message"], refused.text
            assert (await client.get(f"/api/runs/{failed['run_id']}/feedback")).json()["feedback"] == []
            wrong = await client.post(f"/api/runs/{failed['run_id']}/feedback", json={"correct": False,
                                                                                 "expected": "FIG"})  # fmt: skip
            assert wrong.status_code == 201, wrong.text

            made = await client.post("/api/datasets", json={"name": "judged", "feedback": True, "holdout": 0})
            assert made.status_code == 201, made.text
            rows = {r["run_id"]: r for r in made.json()["rows"]}
            assert set(rows) == {first["run_id"], failed["run_id"]}
            assert rows[first["run_id"]]["answer"] == "plum" and len(rows[first["run_id"]]["context_paths"]) == 1
            assert rows[failed["run_id"]]["answer"] == "FIG"
            (skipped,) = made.json()["skipped"]
            assert skipped.startswith(follow_up["run_id"]) and f"run 2 of session {session}" in skipped, skipped
