"""Faults under load: a wave of 100 runs at once through the real `fleet web` process and the
real local sandbox, during which one run's sandbox worker is killed with SIGKILL mid-step, the
model refuses 60 requests in a row (429, then 500), and one run writes past its volume's quota.
Each fault is set off by a count, never a clock, so a busy machine meets the same faults. The
affected runs end with the reason in their record, every other run finishes with its answer,
nothing is lost (each run's stored events run from seq 1 to run.finished), no request gets a 5xx
and no sandbox process is left. Outcomes only: no time is asserted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from bench.runtimes import MODEL
from bench.simlm import SimLM

from bench import load, web
from bench import workloads as wl
from fleet_rlm.sandbox.local import detect_isolation

pytestmark = pytest.mark.slow
RUNS = 100
# What the model's refusal reads like in a run's error or a sub-query's slot (retries are off).
MODEL_REFUSED = re.compile(r"rate limiting requests|InternalServerError|\b500\b|server_error|injected failure")


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> tuple[load.FaultWave, dict[str, dict[str, Any]], Path]:
    if detect_isolation()[0] != "bwrap":
        pytest.skip("the fault wave kills a worker under bubblewrap, unusable here")
    home = tmp_path_factory.mktemp("faults") / "home"
    with SimLM() as sim:
        env = {**web.web_env(home, sim.base_url, MODEL), "FLEET_VOLUME_QUOTA_MB": str(load.QUOTA_MB)}
        outcome = load.fault_wave(sim, env, RUNS)
    return outcome, load.stored_runs(home / "fleet.db"), home


def _errors(run: dict[str, Any]) -> list[str]:
    """The model errors a run's sub-queries met, from its stored events."""
    return [data["error"] for _, kind, data in run["events"] if kind == "subcall.finished" and data.get("error")]


def test_every_run_is_stored_whole_and_no_request_failed(faults: tuple[load.FaultWave, dict, Path]) -> None:
    outcome, stored, _ = faults
    assert outcome.wave.failures == []  # no 5xx, no refused or dropped request
    assert len(outcome.wave.runs) == RUNS and all(r.complete for r in outcome.wave.runs)
    assert len(stored) == RUNS
    for run_id, run in stored.items():
        seqs, kinds = [e[0] for e in run["events"]], [e[1] for e in run["events"]]
        assert seqs == list(range(1, len(seqs) + 1)), run_id
        assert kinds[0] == "run.started" and kinds[-1] == "run.finished", (run_id, kinds)
        assert run["events"][-1][2]["status"] == run["status"] != "running", run_id
    assert outcome.left == 0  # no sandbox process outlives its run


def test_the_killed_worker_fails_only_its_run_with_the_reason(faults: tuple[load.FaultWave, dict, Path]) -> None:
    outcome, stored, _ = faults
    assert outcome.killed_pid is not None
    victim = stored[outcome.victim]
    assert victim["status"] == "failed"
    assert "sandbox worker exited (killed by signal 9 (SIGKILL)" in victim["error"], victim["error"]


def test_the_model_outage_fails_only_the_calls_it_met(faults: tuple[load.FaultWave, dict, Path]) -> None:
    outcome, stored, _ = faults
    expected = wl.load().expected
    hit = 0
    for run_id, run in stored.items():
        if run_id in (outcome.victim, outcome.writer):
            continue
        errors = _errors(run)
        if run["status"] == "failed":  # a root call met the outage: the run's error says so
            assert MODEL_REFUSED.search(run["error"] or ""), run["error"]
        elif errors:  # sub-queries met it: each slot holds the reason, the answer counts the rest
            assert all(MODEL_REFUSED.search(e) for e in errors), errors
            assert run["status"] == "succeeded" and run["answer"] == str(int(expected) - len(errors)), run
        else:  # untouched runs finish with their answer
            assert (run["status"], run["answer"]) == ("succeeded", expected), (run_id, run)
            continue
        hit += 1
    assert 0 < hit < RUNS - 2, "the outage must hit some runs, not all"


def test_a_write_past_the_quota_is_trimmed_and_told(faults: tuple[load.FaultWave, dict, Path]) -> None:
    # The writer is the only run that mounts its volume (the load runs name their own): a run that
    # names none mounts every volume and may trim, and be told of, another's overshoot
    # (docs/benchmarks.md, the fault wave's known issue).
    outcome, stored, home = faults
    writer = stored[outcome.writer]
    assert (writer["status"], writer["answer"]) == ("succeeded", "trimmed")
    warnings = [d["message"] for _, kind, d in writer["events"] if kind == "warning"]
    assert any("over quota" in w and "FLEET_VOLUME_QUOTA_MB" in w for w in warnings), warnings
    on_disk = sum(f.stat().st_size for f in (home / "volumes" / "fill").rglob("*") if f.is_file())
    assert on_disk <= load.QUOTA_MB * 1024 * 1024
