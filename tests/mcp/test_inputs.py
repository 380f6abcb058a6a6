"""What went in, as an MCP client sees it: the ``run`` result and ``get_run`` carry the inputs summary
(counts, the skipped files with their reasons), the same core view the web's run page shows.

A real MCP client (both protocol eras) over a fresh server, the scripted model, real PDF and PNG files
converted by the real isolated parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcp import Client
from tests.support import documents as make
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio


async def test_run_and_get_run_say_what_went_in(client: Client, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.add(Scenario("what went in", ["SUBMIT('seen')"]))
    folder = make.write(
        tmp_path / "in",
        {
            "report.pdf": make.pdf(["One.", "Two.", "Three.", "Four."]),
            "photo.png": make.png(),
            "locked.pdf": make.pdf(["secret"], encrypted=True),
        },
    )
    result = await client.call_tool("run", {"question": "what went in?", "context_paths": [str(folder)]})
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["status"] == "succeeded"
    inputs = out["inputs"]
    assert (inputs["documents"], inputs["pages"], inputs["images"], inputs["skipped_count"]) == (1, 4, 1, 1)
    assert inputs["skipped"] == [f"{folder / 'locked.pdf'}: encrypted (password-protected)"]
    assert inputs["summary"].startswith("1 document (4 pages) · 1 image · ")
    assert inputs["summary"].endswith(" from 2 sources · 1 file skipped")
    assert "(PDF, 4 pages)" in inputs["report"]
    # A client that reads only the text content gets the same.
    assert json.loads(result.content[0].text)["inputs"] == inputs  # type: ignore[union-attr]

    state = await client.call_tool("get_run", {"run_id": out["run_id"]})
    assert not state.is_error, state.content
    assert state.structured_content is not None and state.structured_content["inputs"] == inputs


async def test_a_run_without_files_reports_its_text(client: Client, oracle: OracleLM) -> None:
    oracle.add(Scenario("pasted only", ["SUBMIT('ok')"]))
    result = await client.call_tool("run", {"question": "pasted only?", "context_text": "twelve chars"})
    assert not result.is_error, result.content
    inputs = result.structured_content["inputs"]  # type: ignore[index]
    assert inputs["summary"] == "12 characters from 1 source"
    assert (inputs["documents"], inputs["images"], inputs["skipped"]) == (0, 0, [])
