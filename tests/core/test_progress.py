"""Progress lines folded from events: per-batch sub-query counts, steps, children."""

from __future__ import annotations

from typing import Any

from fleet_rlm.core.progress import ProgressTracker


def ev(kind: str, node: str = "root", **data: Any) -> dict[str, Any]:
    return {"kind": kind, "node": node, "data": data, "run_id": "r1"}


def test_batches_count_separately_and_reset_per_step() -> None:
    t = ProgressTracker()
    t.feed(ev("lm.call", step=1, prompt_tokens=10, completion_tokens=5))
    lines = [t.feed(ev("subcall.finished", batch={"id": 1, "index": i, "size": 3})) for i in range(3)]
    assert lines == ["step 1 · 1/3 sub-queries", "step 1 · 2/3 sub-queries", "step 1 · 3/3 sub-queries"]
    t.feed(ev("lm.call", step=2))
    assert (t.state.subqueries_done, t.state.subqueries_total) == (0, 0)
    assert t.feed(ev("subcall.finished", batch={"id": 2, "index": 0, "size": 64})) == "step 2 · 1/64 sub-queries"
    assert t.feed(ev("subcall.finished")) == "step 2 · 1/1 sub-queries"  # a lone llm_query
    assert t.state.llm_calls == 2 + 5 and t.state.tokens == 15


def test_children_and_outcomes() -> None:
    t = ProgressTracker()
    assert t.feed(ev("child.started", node="root.1", query_preview="look at part 2")) == \
        "child root.1 started: look at part 2"
    assert t.feed(ev("lm.call", node="root.1", step=1)) == "root.1 step 1 · running code"
    assert t.feed(ev("code.executed", node="root.1", step=1, error="Traceback\nZeroDivisionError: x")) == \
        "root.1 step 1 · error: ZeroDivisionError: x"
    assert t.feed(ev("run.finished", status="failed", error="no answer")) == "run failed: no answer"
    assert t.state.children == 1 and t.state.errors == 1 and t.state.root_steps == 0
