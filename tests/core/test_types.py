"""The shared vocabulary: request checks, and event payloads that match their published types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from fleet_rlm.core.engine import Engine
from fleet_rlm.core.schema import event_schema
from fleet_rlm.errors import UserError
from fleet_rlm.types import EVENT_KINDS, PAYLOADS, Event, RunRequest
from tests.support.oracle_lm import OracleLM, Scenario

SCHEMA_FILE = Path(__file__).parents[2] / "docs" / "events.schema.json"


def test_an_empty_question_is_refused() -> None:
    with pytest.raises(UserError, match="question is empty"):
        RunRequest("   ")


def test_the_published_schema_matches_the_types() -> None:
    published = json.loads(SCHEMA_FILE.read_text())
    assert published == json.loads(json.dumps(event_schema())), "run: python -m fleet_rlm.core.schema"
    assert set(PAYLOADS) == EVENT_KINDS


@pytest.mark.anyio
async def test_every_event_of_a_real_run_matches_its_payload_type(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("all kinds", [
        "print(len(context))",
        "parts = llm_query_batched(['The secret code is A1', 'nothing'])\nprint(parts)",
        "r = rlm_query('child task', 'child text')\nprint(r)",
        "1/0",
        "SUBMIT(parts[0])",
    ]))
    oracle.add(Scenario("child task", ["SUBMIT(context)"]))
    async with Engine() as engine:
        result = await engine.run(RunRequest("all kinds", context_text=["hello"], max_depth=1))
        events = engine.events(result.run_id)
    assert result.answer == "A1"
    seen = set()
    for event in events:
        for typed, value in ((Event, event), (PAYLOADS[event["kind"]], event["data"])):
            TypeAdapter(typed).validate_python(value)  # field types
            documented = typed.__required_keys__ | typed.__optional_keys__
            assert typed.__required_keys__ <= set(value) <= documented, (event["kind"], set(value) - documented)
        seen.add(event["kind"])
    run_kinds = {k for k in EVENT_KINDS if not k.startswith("optimize.")}  # optimizations: tests/optimize
    # A replay's: tests/core/test_replay.py; a fetch's (pages, repositories): tests/core/test_fetch.py; a
    # compaction's: tests/core/test_compaction.py; a tool call's: tests/core/test_tools.py.
    assert seen >= run_kinds - {"warning", "replay.diverged", "context.fetched", "history.compacted", "tool.called"}


@pytest.mark.slow
def test_the_public_api_loads_lazily_and_faces_types_stay_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, fleet_rlm\n"
        "fleet_rlm.RunRequest, fleet_rlm.Workspace, fleet_rlm.UserError\n"
        "import fleet_rlm.core.views, fleet_rlm.types, fleet_rlm.sandbox.base\n"
        "assert 'dspy' not in sys.modules and 'litellm' not in sys.modules, 'a light import loaded dspy'\n"
        "assert fleet_rlm.Engine.__name__ == 'Engine' and 'dspy' in sys.modules\n"
        "assert set(fleet_rlm.__all__) - {'__version__'} == set(fleet_rlm._EXPORTS)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
