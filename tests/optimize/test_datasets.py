"""Datasets: JSONL import (checked line by line), a stored seeded split, export, rows from feedback."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from fleet_rlm.core.workspace import Workspace
from fleet_rlm.errors import Conflict, UserError
from fleet_rlm.optimize import datasets
from fleet_rlm.store import ProgramVersion, RunRecord, Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "fleet.db") as s:
        yield s


@pytest.fixture
def ws(store: Store) -> Workspace:
    return Workspace(store, volumes=lambda: pytest.fail("datasets never open the volumes"))


def _lines(*items: object) -> list[str]:
    return [json.dumps(i) for i in items]


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "line 1: not valid JSON"),
    ('["a"]', "line 1: expected a JSON object"),
    ('{"question": "", "answer": "x"}', "'question' must be a non-empty string"),
    ('{"question": "q"}', "'answer' \\(the expected answer\\) must be a non-empty string"),
    ('{"question": "q", "answer": "a", "context": 3}', "'context' must be a string"),
    ('{"question": "q", "answer": "a", "context_path": "missing.txt"}', "context_path '.*missing.txt' does not exist"),
    ('{"question": "q", "answer": "a", "extra": 1}', "unknown field"),
])  # fmt: skip
def test_bad_lines_are_refused_with_their_line(line: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=message):
        datasets.parse_jsonl([line], tmp_path)


def test_relative_paths_are_taken_from_the_file_and_numbers_become_text(tmp_path: Path) -> None:
    (tmp_path / "doc.txt").write_text("hello")
    lines = [*_lines({"question": "q", "answer": 42, "context_path": "doc.txt"}), "   "]  # blank lines are skipped
    rows = datasets.parse_jsonl(lines, tmp_path)
    assert rows[0]["answer"] == "42" and rows[0]["context_paths"] == [str(tmp_path / "doc.txt")]


def test_the_split_is_seeded_stored_and_survives_export_and_import(ws: Workspace) -> None:
    rows = datasets.parse_jsonl(_lines(*({"question": f"q{i}", "answer": f"a{i}", "context": f"c{i}"}
                                         for i in range(10))))  # fmt: skip
    assert datasets.split_rows(rows, 0.2, 7) == datasets.split_rows(rows, 0.2, 7)
    assert datasets.split_rows(rows, 0.2, 7) != datasets.split_rows(rows, 0.2, 8)

    async def go() -> None:
        made = await datasets.create(ws, "ten", rows, source="jsonl", holdout=0.3, seed=1)
        assert (made.train, made.holdout) == (7, 3) and [r.split for r in made.rows].count("holdout") == 3
        exported = list(datasets.export_lines(ws, "ten"))
        again = datasets.parse_jsonl(exported)
        copy = await datasets.create(ws, "copy", again, source="jsonl", holdout=0.5, seed=99)
        assert [r.split for r in copy.rows] == [r.split for r in made.rows]
        assert datasets.detail(ws, "copy") == copy
        assert [d.name for d in datasets.list_datasets(ws).datasets] == ["copy", "ten"]
        with pytest.raises(Conflict, match="a dataset named 'ten' exists already"):
            await datasets.create(ws, "ten", rows, source="jsonl")

    import asyncio

    asyncio.run(go())


@pytest.mark.parametrize("name", ["", "a b", "-x", "x" * 65, "../up"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(UserError, match="dataset name"):
        datasets.check_name(name)


def test_rows_from_feedback_keep_replayable_judged_runs(store: Store, ws: Workspace, tmp_path: Path) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("the text")

    def run(run_id: str, session: str | None = None, answered: bool = True, **request: object) -> None:
        request = {"context_paths": [str(doc)], "session_id": session, **request}
        store.runs.create(RunRecord(run_id, f"question {run_id}", session_id=session, status="succeeded",
                                    answer=f"answer {run_id}" if answered else None, request=request,
                                    created_at=float(run_id[1:])))  # fmt: skip

    run("r1", session="s")  # a session's first run: its REPL started fresh, as a replay's does
    run("r2")
    run("r3", context_text=["(12 chars)"])
    run("r4", session="s")  # builds on r1's REPL state
    run("r5")
    run("r6", answered=False)
    store.uploads.add_feedback("r1", True, None, "good")
    store.uploads.add_feedback("r2", False, "the right one", "missed it")
    store.uploads.add_feedback("r3", True, None, None)
    store.uploads.add_feedback("r4", True, None, None)
    store.uploads.add_feedback("r5", False, None, "wrong")
    store.uploads.add_feedback("r6", True, None, None)  # as stored before faces refused it
    rows, skipped = datasets.rows_from_feedback(ws)
    assert [(r["run_id"], r["answer"], r["verdict"]) for r in rows] == [
        ("r1", "answer r1", True), ("r2", "the right one", False)]  # fmt: skip
    assert rows[0]["context_paths"] == [str(doc)] and rows[0]["comment"] == "good"
    assert [s.split(":")[0] for s in skipped] == ["r3", "r4", "r5", "r6"]
    assert "pasted text" in skipped[0] and "run 2 of session s" in skipped[1]
    assert "without the right answer" in skipped[2] and "marked correct but gave no answer" in skipped[3]


def test_secrets_in_rows_and_versions_are_masked_in_the_store(store: Store, ws: Workspace) -> None:
    key = "sk-live-abcdefgh12345678"
    rows = [{"question": f"is {key} valid?", "context_text": f"key {key}", "context_paths": [], "answer": key}]

    import asyncio

    async def go() -> None:
        made = await datasets.create(ws, "keys", rows, source="jsonl")
        stored = store.optimize.dataset_rows(made.id)[0]
        assert key not in json.dumps(asdict(stored)) and "***" in stored.question
        demo = {"observation": f"context preview {key}", "reasoning": "r", "code": "SUBMIT(1)"}
        store.optimize.add_program_version(ProgramVersion(
            id="v1", base_id=None, optimization_id=None, dataset_id=made.id, optimizer="bootstrap", metric="exact",
            scores={}, state={"act": {"demos": [demo]}}, changes={}, created_at=0.0,
        ))  # fmt: skip
        version = store.optimize.get_program_version("v1")
        assert version is not None and key not in json.dumps(asdict(version))

    asyncio.run(go())
