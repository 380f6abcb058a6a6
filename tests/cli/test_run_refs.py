"""Referring to a run on the command line: `last`, `last~N`, a unique start or end of its id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import cli
from tests.support.run_refs import MIDDLE, NEWEST, OLDEST, seed_runs


@pytest.fixture
def seeded(fleet_env: dict[str, str]) -> dict[str, str]:
    seed_runs(Path(fleet_env["FLEET_HOME"]))
    return fleet_env


def _traced_question(env: dict[str, str], ref: str) -> str:
    proc = cli("trace", ref, env=env)
    assert proc.returncode == 0, proc.stderr
    return next(line for line in proc.stdout.splitlines() if "question" in line)


def _exported_run_ids(env: dict[str, str], ref: str) -> set[str]:
    proc = cli("export", ref, env=env)
    assert proc.returncode == 0, proc.stderr
    return {json.loads(line)["run_id"] for line in proc.stdout.splitlines()}


@pytest.mark.slow
def test_trace_last_and_last_tilde_n(seeded: dict[str, str]) -> None:
    assert "question 3" in _traced_question(seeded, "last")  # the newest person's run, not the eval after it
    assert "question 3" in _traced_question(seeded, "last~0")
    assert "question 2" in _traced_question(seeded, "last~1")


@pytest.mark.slow
def test_export_by_unique_suffix_or_prefix(seeded: dict[str, str]) -> None:
    assert _exported_run_ids(seeded, "aacafe") == {OLDEST}
    assert _exported_run_ids(seeded, NEWEST[:13]) == {NEWEST}
    assert _exported_run_ids(seeded, "last~1") == {MIDDLE}


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("cafe", f"error: 'cafe' matches more than one run, e.g. {MIDDLE} and {OLDEST}: give more characters"),
        ("r19a0", "matches more than one run"),
        ("9999", "error: no run '9999' (`fleet-rlm runs` lists recent ones)"),
        ("last~7", "error: no run 'last~7': there are fewer than 8 runs"),
        ("abc", "give at least 4 characters"),
    ],
)
@pytest.mark.slow
def test_ambiguous_or_unknown_ref_exits_2_with_one_line(seeded: dict[str, str], ref: str, message: str) -> None:
    proc = cli("trace", ref, env=seeded)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "MCP" not in proc.stderr  # tool names of another face are noise here


def test_runs_listing_says_how_to_refer_to_a_run(seeded: dict[str, str]) -> None:
    proc = cli("runs", env=seeded)
    assert proc.returncode == 0, proc.stderr
    assert NEWEST in proc.stdout and OLDEST in proc.stdout
    assert proc.stderr.count("last / last~N") == 1


@pytest.mark.slow
def test_pin_keeps_a_run_from_retention_and_runs_shows_it(seeded: dict[str, str]) -> None:
    pinned = cli("pin", OLDEST[-5:], env=seeded)
    assert pinned.returncode == 0 and f"run {OLDEST} pinned" in pinned.stdout, pinned.stderr
    listing = cli("runs", env=seeded).stdout
    assert next(line for line in listing.splitlines() if line.startswith(OLDEST)).endswith("(pinned)")
    rows = {r["run_id"]: r["pinned"] for r in json.loads(cli("runs", "--json", env=seeded).stdout)}
    assert rows[OLDEST] is True and rows[NEWEST] is False
    assert "unpinned" in cli("pin", OLDEST, "--off", env=seeded).stdout
    assert json.loads(cli("runs", "--json", env=seeded).stdout)[-1]["pinned"] is False


def test_runs_json_is_the_run_summary_every_face_shows(seeded: dict[str, str]) -> None:
    from fleet_rlm.core.views import RunSummary
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.store import Store

    proc = cli("runs", "--json", env=seeded)
    assert proc.returncode == 0, proc.stderr
    listed = {r["run_id"]: r for r in json.loads(proc.stdout)}
    with Workspace(Store(Path(seeded["FLEET_HOME"]) / "fleet.db"), volumes=lambda: pytest.fail("no volumes")) as ws:
        shown = {r.run_id: r.model_dump(mode="json") for r in ws.list_runs().runs}  # what MCP and the web list
    assert listed == shown and set(listed) == {OLDEST, MIDDLE, NEWEST}
    earlier_keys = {"run_id", "status", "question", "created_at", "iterations", "llm_calls", "session_id",
                    "pinned", "kind", "parent_run_id", "fork_at"}  # fmt: skip  # what `runs --json` always gave
    assert earlier_keys <= set(RunSummary.model_fields) == set(listed[OLDEST])


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("last~99999999999999999999", "error: no run 'last~99999999999999999999': there are fewer than"),
        ("a" * 60_000, f"error: no run '{'a' * 80}…'"),
        ("b" * 30_000, f"error: no run '{'b' * 80}…'"),
    ],
)
@pytest.mark.slow
def test_a_huge_or_long_ref_is_no_run_quoting_only_its_head(seeded: dict[str, str], ref: str, message: str) -> None:
    # last~N past any count was an OverflowError, 60,000 characters sqlite's "LIKE pattern too complex":
    # both "internal error"; 30,000 characters were echoed whole.
    for command in (("trace", ref), ("export", ref), ("pin", ref)):
        proc = cli(*command, env=seeded)
        assert proc.returncode == 2, (command[0], proc.returncode, proc.stderr[:300])
        assert proc.stderr.startswith(message) and "internal error" not in proc.stderr, proc.stderr[:300]
        assert len(proc.stderr) < 400, len(proc.stderr)
