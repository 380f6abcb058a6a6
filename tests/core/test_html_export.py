"""The one-file HTML trace and the rlms trajectory, built from a run's events (no I/O)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from typing import Any

from fleet_rlm.core.export_rlms import rlms_rows
from fleet_rlm.core.html_export import BLOCK_CAP, run_html

HOSTILE = "</script><script>document.title='PWNED'</script><img src=x onerror=alert(1)><!--"
SECRET = "sk-live-export-3f9a8b7c6d5e"


def ev(seq: int, kind: str, node: str = "root", parent: str | None = None, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "ts": 1000.0 + seq, "kind": kind, "node": node, "parent": parent,
            "depth": 0 if node == "root" else 1, "run_id": "r-1", "data": data}  # fmt: skip


def hostile_run(long_output: str = "short") -> list[dict[str, Any]]:
    return [
        ev(1, "run.started", question=f"Q with {HOSTILE}", limits={"max_iters": 5, "max_depth": 2}),
        ev(
            2,
            "lm.call",
            step=1,
            model="openai/oracle",
            prompt_tokens=10,
            completion_tokens=4,
            latency=0.5,
            reasoning="look",
        ),
        ev(
            3,
            "subcall.finished",
            model="openai/oracle",
            prompt_preview="p",
            response_preview="r",
            latency=0.2,
            prompt_tokens=3,
            completion_tokens=1,
            cost=0.001,
        ),
        ev(4, "child.started", node="root.1", parent="root", query_preview="inner question"),
        ev(
            5,
            "lm.call",
            node="root.1",
            parent="root",
            step=1,
            model="openai/oracle",
            prompt_tokens=2,
            completion_tokens=1,
            latency=0.1,
        ),
        ev(
            6,
            "code.executed",
            node="root.1",
            parent="root",
            step=1,
            code="SUBMIT('kid')",
            output="",
            duration=0.1,
            submitted=True,
        ),
        ev(7, "child.finished", node="root.1", parent="root", status="succeeded", answer_preview="kid"),
        ev(8, "code.executed", step=1, code=f"print({SECRET!r})", output=HOSTILE + long_output, duration=0.3),
        ev(9, "lm.call", step=2, model="openai/oracle", prompt_tokens=12, completion_tokens=5, latency=0.4),
        ev(10, "code.executed", step=2, code="SUBMIT(x)", output="", duration=0.1, submitted=True),
        ev(
            11,
            "run.finished",
            status="partial",
            answer=f"A {HOSTILE}",
            stop_reason="budget: max_cost reached",
            usage={"total": {"calls": 3, "prompt_tokens": 27}, "by_model": {"openai/oracle": {"calls": 3}}},
            iterations=2,
            llm_calls=4,
            seconds=11.0,
        ),
    ]


class Tags(HTMLParser):
    """The elements of a page as the browser's tokenizer sees them, and each script's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._in_script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = None

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)


def parsed(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    tags.close()
    return tags


def test_hostile_output_stays_data_and_only_the_page_script_may_run() -> None:
    page = run_html("r-1", hostile_run())
    tags = parsed(page.html)
    assert [t for t, _ in tags.tags if t in {"script", "img"}] == ["script", "script"]  # no injected element
    (data_attrs, data_text), (code_attrs, code_text) = tags.scripts
    assert data_attrs == {"type": "application/json", "id": "run-data"} and code_attrs == {}
    payload = json.loads(data_text)  # the run's text comes back exactly, as data
    assert payload["run"]["question"] == f"Q with {HOSTILE}" and payload["run"]["answer"] == f"A {HOSTILE}"
    assert payload["nodes"]["root"]["steps"][0]["output"].startswith(HOSTILE)
    assert "innerHTML" not in code_text and "insertAdjacentHTML" not in code_text
    csp = next(a["content"] for t, a in tags.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    digest = base64.b64encode(hashlib.sha256((code_text or "").encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in (csp or "") and "default-src 'none'" in (csp or "")


def test_secrets_are_masked_again_and_long_blocks_are_cut_with_a_note() -> None:
    long_output = "x" * (3 * BLOCK_CAP) + "THE-END"
    page = run_html("r-1", hostile_run(long_output))
    assert SECRET not in page.html
    payload = json.loads(parsed(page.html).scripts[0][1])
    output = payload["nodes"]["root"]["steps"][0]["output"]
    assert output.endswith("THE-END") and len(output) < BLOCK_CAP + 200
    assert payload["cut"] == [{"label": "root step 1 output", "chars": len(HOSTILE + long_output), "kept": BLOCK_CAP}]
    assert page.size < 2 * BLOCK_CAP + 30_000


def test_timeline_rows_cover_steps_children_and_subcalls() -> None:
    payload = json.loads(parsed(run_html("r-1", hostile_run()).html).scripts[0][1])
    labels = [row["label"] for row in payload["timeline"]]
    assert labels == ["run", "step 1", "", "root.1", "root.1 step 1", "step 2"]
    assert payload["timeline"][0]["bars"] == [{"start": 0.0, "end": 10.0, "kind": "run", "title": "run partial"}]


def test_rlms_rows_have_the_reference_loggers_fields() -> None:
    metadata, *iterations = list(rlms_rows(hostile_run()))
    assert metadata["type"] == "metadata" and metadata["root_model"] == "openai/oracle"
    assert {"root_model", "max_depth", "max_iterations", "backend", "backend_kwargs", "environment_type",
            "environment_kwargs", "other_backends", "timestamp"} <= set(metadata)  # fmt: skip
    assert (metadata["max_iterations"], metadata["max_depth"]) == (5, 2)
    assert metadata["fleet_rlm"]["status"] == "partial"
    assert [r["iteration"] for r in iterations] == [1, 2]
    first, last = iterations
    assert set(first) == {"type", "iteration", "timestamp", "prompt", "response", "code_blocks", "final_answer",
                          "iteration_time"}  # fmt: skip
    [block] = first["code_blocks"]
    assert set(block["result"]) == {"stdout", "stderr", "locals", "execution_time", "rlm_calls", "final_answer"}
    sub, child = block["result"]["rlm_calls"]
    assert sub["usage_summary"]["model_usage_summaries"]["openai/oracle"]["total_cost"] == 0.001
    assert child["response"] == "kid" and child["metadata"]["iterations"][0]["final_answer"] == "kid"
    assert SECRET not in json.dumps(iterations) and "```repl\nSUBMIT(x)\n```" in last["response"]
    assert last["final_answer"] == f"A {HOSTILE}" and first["final_answer"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+", first["timestamp"])
