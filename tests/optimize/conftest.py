"""A task the built-in program gets partly wrong, and an oracle that answers it right only when the
prompt shows it how: so an optimized program's gain is real and visible in what it sends.

"Shout the word": the answer is the context's last word in capitals. Asked plainly, the scripted
model submits the word as written, which is right only for the three "Exemplar" rows (already in
capitals). It submits capitals when its prompt holds a demo of an Exemplar row (what
BootstrapFewShot adds) or the instruction "Answer in capital letters." (what the scripted
reflection and proposal models propose to GEPA and MIPROv2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario

INSTRUCTION = "Answer in capital letters."
PLAIN = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape"]
EXEMPLARS = ["kiwi", "lime", "mango"]


def shout_scenario() -> Scenario:
    capitals = ["SUBMIT(context.split()[-1].upper())"]
    return Scenario("Shout the word", ["SUBMIT(context.split()[-1])"],
                    when={"Exemplar": capitals, INSTRUCTION: capitals})  # fmt: skip


def shout_rows() -> list[dict[str, str]]:
    rows = [{"question": f"Shout the word in the context ({w})", "context": f"Word: {w}", "answer": w.upper()}
            for w in PLAIN]  # fmt: skip
    rows += [{"question": f"Shout the word in the context ({w})", "context": f"Exemplar: {w.upper()}",
              "answer": w.upper()} for w in EXEMPLARS]  # fmt: skip
    return rows


def teach(oracle: OracleLM) -> OracleLM:
    oracle.add(shout_scenario())
    oracle.state.field_replies.update({"new_instruction": INSTRUCTION, "proposed_instruction": INSTRUCTION})
    return oracle


@pytest.fixture
def shout(oracle: OracleLM) -> OracleLM:
    return teach(oracle)


@pytest.fixture
def shout_file(tmp_path: Path) -> Path:
    path = tmp_path / "shout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in shout_rows()))
    return path


@pytest.fixture
def fake_env(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The in-process fast sandbox: these tests are about optimization, not isolation."""
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    yield {**fleet_env, "FLEET_SANDBOX": "fake"}
