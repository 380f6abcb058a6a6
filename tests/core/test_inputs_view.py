"""What went into a run, as every face shows it: one core view (``views.InputsSummary``) built from the
run's stored ``context.loaded`` event, carried by the run's state and its result.

The run goes through the engine, the real local sandbox, the real isolated document parser and the
scripted model; the files are real PDF and PNG bytes (tests/support/documents.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.core import views
from fleet_rlm.core.engine import Engine
from fleet_rlm.types import Event, RunRequest
from tests.support import documents as make
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio


def _loaded(data: dict[str, Any], seq: int = 2) -> Event:
    return {"v": 1, "run_id": "r1", "seq": seq, "ts": 1.0, "kind": "context.loaded", "node": "root",
            "parent": None, "depth": 0, "data": data}  # fmt: skip


def test_no_context_loaded_is_no_summary() -> None:
    started: Event = {"v": 1, "run_id": "r1", "seq": 1, "ts": 1.0, "kind": "run.started", "node": "root",
                      "parent": None, "depth": 0, "data": {"question": "q"}}  # fmt: skip
    assert views.inputs_of([started]) is None  # a session's follow-up loads nothing new


def test_the_summary_counts_in_words() -> None:
    one = views.inputs_of([_loaded({"chars": 12345, "sources": 3, "skipped": ["a.pdf: encrypted (password-protected)"],
                                    "report": "3 source(s)", "documents": 1, "pages": 3, "images": 1, "cached": 0,
                                    "skipped_count": 1})])  # fmt: skip
    assert one is not None
    assert one.summary == "1 document (3 pages) · 1 image · 12,345 characters from 3 sources · 1 file skipped"
    assert one.skipped == ["a.pdf: encrypted (password-protected)"] and one.skipped_count == 1
    many = views.inputs_of([_loaded({"chars": 1, "sources": 1, "skipped": [], "report": "", "documents": 2,
                                     "pages": 0, "images": 2, "cached": 2, "skipped_count": 0})])  # fmt: skip
    assert many is not None
    assert many.summary == "2 documents (2 from the cache) · 2 images · 1 character from 1 source"


def test_an_event_from_before_the_counts_still_reads() -> None:
    old = views.inputs_of([_loaded({"chars": 40, "sources": 1, "skipped": ["x.bin: binary"], "report": "1 source(s)"})])
    assert old is not None
    assert (old.documents, old.pages, old.images, old.cached, old.skipped_count) == (0, 0, 0, 0, 1)
    assert old.summary == "40 characters from 1 source · 1 file skipped"


async def test_run_state_and_result_say_what_went_in(
    fleet_env: dict[str, str], oracle: OracleLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "local")
    folder = make.write(
        tmp_path / "in",
        {
            "report.pdf": make.pdf(["Page one.", "Page two.", "Page three: the total is 9."]),
            "chart.png": make.png(),
            "locked.pdf": make.pdf(["secret"], encrypted=True),
            "notes.txt": "plain notes",
        },
    )
    oracle.add(Scenario("what went in", ["SUBMIT('ok')"]))
    async with Engine() as engine:
        first = await engine.run(RunRequest("what went in?", context_paths=[str(folder)]))
        state = engine.workspace.run_state(first.run_id)
        result_inputs = engine.workspace.inputs(first.run_id)
        second = await engine.run(RunRequest("what went in, again?", context_paths=[str(folder)]))
        again = engine.workspace.run_state(second.run_id).inputs
    assert first.status == "succeeded", first.error
    inputs = state.inputs
    assert inputs is not None and result_inputs == inputs
    assert (inputs.documents, inputs.pages, inputs.images, inputs.cached, inputs.skipped_count) == (1, 3, 1, 0, 1)
    assert inputs.sources == 3  # the PDF, the image, the text file
    assert inputs.skipped == [f"{folder / 'locked.pdf'}: encrypted (password-protected)"]
    assert inputs.summary.startswith("1 document (3 pages) · 1 image · ")
    assert inputs.summary.endswith(" characters from 3 sources · 1 file skipped")
    assert "report.pdf" in inputs.report and "(PDF, 3 pages)" in inputs.report
    # The second run read the PDF's text from the conversion cache, and says so.
    assert again is not None and again.cached == 1
    assert again.summary.startswith("1 document (3 pages, 1 from the cache) · 1 image")
