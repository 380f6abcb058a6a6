"""The HTTP API says what went into a run: documents and images uploaded with POST /api/uploads (any
file type: staging decides what it reads) come back counted in GET /api/runs/ID's ``inputs``, the core
view the run page draws. The app in process, the scripted model, the real isolated document parser."""

from __future__ import annotations

import httpx
import pytest

from tests.support import documents as make
from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import wait_finished

pytestmark = pytest.mark.anyio


async def test_uploaded_documents_and_images_are_counted_in_the_run(
    client: httpx.AsyncClient, oracle: OracleLM
) -> None:
    oracle.add(Scenario("uploaded inputs", ["SUBMIT(str(len(sources)))"]))
    files = [
        ("file", ("slides.pptx", make.pptx([["Plan"], ["Dates"]]), "application/octet-stream")),
        ("file", ("scan.png", make.png(), "image/png")),
        ("file", ("blank.pdf", make.pdf(["", ""], scanned=True), "application/pdf")),
    ]
    uploaded = await client.post("/api/uploads", files=files)
    assert uploaded.status_code == 201, uploaded.text
    ids = [u["upload_id"] for u in uploaded.json()["uploads"]]
    started = await client.post("/api/runs", json={"question": "uploaded inputs: how many?", "upload_ids": ids})
    assert started.status_code == 202, started.text
    state = await wait_finished(client, started.json()["run_id"])
    assert state["status"] == "succeeded", state
    assert state["answer"] == "2"  # the deck and the image; the scan has no text layer
    inputs = state["inputs"]
    assert (inputs["documents"], inputs["pages"], inputs["images"], inputs["skipped_count"]) == (1, 0, 1, 1)
    assert inputs["summary"].startswith("1 document · 1 image · ")
    [line] = inputs["skipped"]
    assert line.endswith("/blank.pdf: no text layer, 2 pages; OCR is not built in"), line
