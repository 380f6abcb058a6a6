"""Replay and fork through the JSON API (ASGI app, scripted model): start either, read a replay's
report and a fork's lineage on the run, in the list and in the trace; mistakes are 4xx."""

from __future__ import annotations

import httpx
import pytest

from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import wait_finished

pytestmark = pytest.mark.anyio

STEPS = ["x = 40\nprint(x)", "x += 2\nprint(x)", "SUBMIT(str(x))"]


async def _finished(client: httpx.AsyncClient, response: httpx.Response) -> dict:
    assert response.status_code == 202, response.text
    return await wait_finished(client, response.json()["run_id"])


@pytest.mark.slow
async def test_replay_and_fork_over_the_api(client: httpx.AsyncClient, scripted: OracleLM) -> None:
    scripted.add(Scenario("add up", STEPS))
    source = await _finished(client, await client.post("/api/runs", json={"question": "add up", "context_text": ["x"]}))
    assert source["answer"] == "42"
    asked = len(scripted.requests())

    replay = await _finished(client, await client.post(f"/api/runs/{source['run_id']}/replay"))
    assert (replay["kind"], replay["parent_run_id"], replay["answer"]) == ("replay", source["run_id"], "42")
    report = (await client.get(f"/api/runs/{replay['run_id']}/replay")).json()
    assert report["diverged"] is False and report["same_answer"] and len(report["steps"]) == 3

    body = {"at": "2", "code": "x = x * 2\nprint(x)"}
    fork = await _finished(client, await client.post(f"/api/runs/{source['run_id']}/fork", json=body))
    assert fork["answer"] == "80" and (fork["parent_run_id"], fork["fork_at"]) == (source["run_id"], "root:2")
    # Step 1 came from the record, step 2 was given: only step 3 asked the model.
    assert len(scripted.requests()) == asked + 1
    listed = {r["run_id"]: r for r in (await client.get("/api/runs")).json()["runs"]}
    assert listed[fork["run_id"]]["fork_at"] == "root:2" and replay["run_id"] not in listed  # replays: not listed
    trace = (await client.get(f"/api/runs/{fork['run_id']}/trace")).json()
    assert trace["lineage"] == {"kind": "fork", "source": source["run_id"], "at": "root:2"}


@pytest.mark.slow
async def test_replay_and_fork_mistakes(client: httpx.AsyncClient, scripted: OracleLM) -> None:
    scripted.add(Scenario("add up", STEPS))
    source = await _finished(client, await client.post("/api/runs", json={"question": "add up", "context_text": ["x"]}))
    rid = source["run_id"]
    assert (await client.post("/api/runs/r-nope/replay")).status_code == 404
    assert (await client.post("/api/runs/r-nope/fork", json={"at": "1"})).status_code == 404
    past = await client.post(f"/api/runs/{rid}/fork", json={"at": "9", "code": "print(1)"})
    assert past.status_code == 400 and "has steps 1..3" in past.json()["message"]
    both = await client.post(f"/api/runs/{rid}/fork", json={"at": "1", "code": "print(1)", "instruction": "x"})
    assert both.status_code == 400
    assert (await client.post(f"/api/runs/{rid}/fork", json={"at": "1", "extra": 1})).status_code == 400
    assert (await client.get(f"/api/runs/{rid}/replay")).status_code == 400  # not a replay
    slow = await client.post("/api/runs", json={"question": "slow question", "context_text": ["x"]})
    running = await client.post(f"/api/runs/{slow.json()['run_id']}/replay")
    assert running.status_code == 409 and "still" in running.json()["message"]
    await wait_finished(client, slow.json()["run_id"])
