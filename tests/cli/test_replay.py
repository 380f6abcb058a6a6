"""``fleet-rlm replay`` and ``fork`` as real subprocesses, against the scripted model server: a run replays
with the server stopped (exit 0), a fork asks no model before its step and shows its lineage in
``runs`` and ``trace``, a changed input makes ``replay`` exit 1 naming the first diverging step, and
``replay --all --since`` sums up many runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli import cli
from tests.support.oracle_lm import OracleLM, Scenario, oracle_env

STEPS = [
    "print(context)",
    "answers = llm_query_batched(['The secret code is A1', 'The secret code is B2'])\nprint(answers)",
    "SUBMIT(' '.join(answers) + ' from ' + context.strip())",
]


def _run(env: dict, context: Path) -> str:
    proc = cli("run", "find the codes", "--context", str(context), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["answer"] == "A1 B2 from alpha"
    return str(result["run_id"])


@pytest.mark.slow
def test_a_run_replays_with_the_model_server_stopped(
    fleet_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = tmp_path / "context.txt"
    context.write_text("alpha\n")
    with OracleLM(Scenario("find the codes", STEPS)) as oracle:
        env = fleet_env | {"FLEET_LM_API_BASE": oracle.base_url}
        source = _run(env, context)
    proc = cli("replay", source, "--json", env=env)  # nothing listens at the model's address now
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["source_run_id"] == source and report["diverged"] is False and report["same_answer"]
    assert [(s["node"], s["step"]) for s in report["steps"]] == [("root", 1), ("root", 2), ("root", 3)]
    text = cli("replay", source, env=env)
    assert text.returncode == 0 and "nothing diverged" in text.stdout and "root step 2: code ok" in text.stdout

    # A planted change: the context file the run read is different now.
    context.write_text("beta\n")
    changed = cli("replay", source, env=env)
    assert changed.returncode == 1, changed.stderr
    assert "first divergence: the inputs: the context differs" in changed.stdout
    assert "answer: recorded 'A1 B2 from alpha', now 'A1 B2 from beta'" in changed.stdout


@pytest.mark.slow
def test_a_fork_asks_no_model_before_its_step_and_shows_its_lineage(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path
) -> None:
    oracle.add(Scenario("find the codes", STEPS))
    context = tmp_path / "context.txt"
    context.write_text("alpha\n")
    source = _run(fleet_env, context)
    asked = len(oracle.requests())
    code = tmp_path / "step3.py"
    code.write_text("SUBMIT('forked: ' + answers[1])\n")
    proc = cli("fork", source, "--at", "3", "--code", str(code), "--json", env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    fork = json.loads(proc.stdout)
    assert fork["answer"] == "forked: B2" and (fork["parent_run_id"], fork["fork_at"]) == (source, "root:3")
    assert len(oracle.requests()) == asked  # steps 1-2 from the record, step 3 given: the server saw nothing

    runs = cli("runs", env=fleet_env).stdout
    assert f"(forked from {source} at step 3)" in runs
    listed = {r["run_id"]: r for r in json.loads(cli("runs", "--json", env=fleet_env).stdout)}
    assert (listed[fork["run_id"]]["parent_run_id"], listed[fork["run_id"]]["fork_at"]) == (source, "root:3")
    trace = cli("trace", fork["run_id"], env=fleet_env).stdout
    assert f"lineage forked from {source} at step 3" in trace and "answered from the record" in trace

    live = cli("fork", source, "--at", "2", "--instruction", "be quick", env=fleet_env)
    assert live.returncode == 0, live.stderr
    assert "A1 B2 from alpha" in live.stdout and "Instruction for step 2: be quick" in json.dumps(
        oracle.requests()[-1].messages
    )


@pytest.mark.slow
def test_replay_all_since_sums_up_and_fails_on_a_divergence(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.add(Scenario("find the codes", STEPS))
    steady, moving = tmp_path / "steady.txt", tmp_path / "moving.txt"
    steady.write_text("alpha\n")
    moving.write_text("alpha\n")
    first, second = _run(fleet_env, steady), _run(fleet_env, moving)
    moving.write_text("gamma\n")
    proc = cli("replay", "--all", "--since", "2000-01-01", env=fleet_env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith(f"{first} -> ") and line.endswith("same") for line in lines)
    assert any(line.startswith(f"{second} -> ") and "diverged at the inputs" in line for line in lines)
    assert "2 replayed, 1 diverged, 0 skipped" in proc.stderr
    later = cli("replay", "--all", "--since", "2999-01-01", "--json", env=fleet_env)
    assert later.returncode == 0 and json.loads(later.stdout) == {"replays": [], "skipped": []}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One recorded run in a FLEET_HOME that the refusals share: each must leave it the only run."""
    root = tmp_path_factory.mktemp("refusals")
    context, code = root / "context.txt", root / "code.py"
    context.write_text("alpha\n")
    code.write_text("print(1)\n")
    with OracleLM(Scenario("find the codes", STEPS)) as oracle:
        env = oracle_env(root, oracle.base_url)
        yield {"env": env, "run": _run(env, context), "code": str(code), "missing": str(root / "nope.py")}


@pytest.mark.parametrize(
    "argv",
    [
        ["replay"],
        ["replay", "--since", "2024-01-01"],
        ["replay", "--all", "--since", "last tuesday"],
        ["replay", "r-no-such-run"],
        ["fork", "r-no-such-run", "--at", "1"],
        ["fork", "{run}", "--at", "0"],
        ["fork", "{run}", "--at", "9", "--code", "{code}"],
        ["fork", "{run}", "--at", "1", "--code", "{missing}"],
        ["fork", "{run}"],
    ],
)
@pytest.mark.slow
def test_bad_requests_are_refused_before_a_run(argv: list[str], recorded: dict) -> None:
    env = recorded["env"]
    proc = cli(*[a.format(**recorded) for a in argv], env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr
    assert [r["run_id"] for r in json.loads(cli("runs", "--json", env=env).stdout)] == [recorded["run"]]
