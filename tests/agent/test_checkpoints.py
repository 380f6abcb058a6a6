"""A paused turn's checkpoint is data: a row planted in the database (by anything that can write the
file) cannot make the server run code when the turn resumes. Judged on the host: the folder the
planted pickle would create is absent, and the approved write never happened."""

from __future__ import annotations

import base64
import json
import pickle
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agent_framework import FileCheckpointStorage
from agent_framework._workflows._checkpoint_encoding import encode_checkpoint_value

from fleet_rlm.agent import AgentHost
from fleet_rlm.agent.checkpoints import StoreCheckpointStorage
from fleet_rlm.core.engine import Engine
from fleet_rlm.store.agent import workflow_name
from tests.agent.conftest import memory_file

pytestmark = pytest.mark.anyio


class Gadget:
    """Pickles as a call the framework's restricted unpickler allows: a framework class's constructor,
    here one that creates a folder on the host."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return FileCheckpointStorage, (str(self.marker),)


def pickled(gadget: Gadget) -> dict[str, str]:
    """The framework's envelope for a pickled value, as its encoder writes it."""
    payload = base64.b64encode(pickle.dumps(gadget)).decode()
    return {"__pickled__": payload, "__type__": "agent_framework._workflows._checkpoint:FileCheckpointStorage"}


def plant(home: str, turn_id: str, data: dict[str, Any]) -> None:
    """Overwrite the turn's checkpoints in the database file, as another local program could."""
    with sqlite3.connect(Path(home) / "fleet.db", timeout=30) as db:
        db.execute(
            "UPDATE agent_checkpoints SET data_json = ? WHERE workflow_name = ?",
            (json.dumps(data), workflow_name(turn_id)),
        )


async def framework_encoded(engine: Engine, turn_id: str, gadget: Gadget) -> dict[str, Any]:
    """The turn's checkpoint in the framework's own encoding (as fleet-rlm wrote them before), carrying
    the gadget in its metadata."""
    checkpoint = await StoreCheckpointStorage(engine.workspace.store).get_latest(workflow_name=workflow_name(turn_id))
    assert checkpoint is not None
    checkpoint.metadata["planted"] = gadget
    return encode_checkpoint_value(checkpoint.to_dict())


def stored_with_pickle(home: str, turn_id: str, gadget: Gadget) -> dict[str, Any]:
    """The row exactly as stored, plus a pickled value beside it."""
    with sqlite3.connect(Path(home) / "fleet.db", timeout=30) as db:
        (row,) = db.execute(
            "SELECT data_json FROM agent_checkpoints WHERE workflow_name = ? ORDER BY created_at DESC LIMIT 1",
            (workflow_name(turn_id),),
        ).fetchone()
    return {**json.loads(row), "planted": pickled(gadget)}


@pytest.mark.parametrize("form", ["framework encoding", "stored row plus a pickle"])
async def test_a_planted_checkpoint_runs_no_code_when_the_turn_resumes(
    engine: Engine, agent_env: dict[str, str], tmp_path: Path, form: str
) -> None:
    home = agent_env["FLEET_HOME"]
    marker = tmp_path / "gadget-ran"
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "please remember my favourite bird")
    assert paused.status == "paused"
    gadget = Gadget(marker)
    if form == "framework encoding":
        planted = await framework_encoded(engine, paused.turn_id, gadget)
    else:
        planted = stored_with_pickle(home, paused.turn_id, gadget)
    plant(home, paused.turn_id, planted)

    decided, feed = await host.answer(paused.pending[0].id, True, actor="test")
    assert decided.status == "approved" and feed is not None
    done = await feed.outcome()
    assert not marker.exists()  # the pickle was never loaded
    assert done.status == "failed" and done.error is not None
    assert "send the message again" in done.error and "Traceback" not in done.error, done.error
    assert not memory_file(home).exists()  # the turn did not go on from a checkpoint it could not trust


async def test_every_checkpoint_of_a_turn_is_written_as_data(
    engine: Engine, agent_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "please remember my favourite bird")
    rows = engine.workspace.store.agent.workflow_checkpoints(workflow_name(paused.turn_id))
    assert rows and "__pickled__" not in json.dumps([r.data for r in rows])
    _, feed = await host.answer(paused.pending[0].id, True, actor="test")
    assert (await feed.outcome()).status == "done"  # resumed from the data
    # The framework only logs a checkpoint it could not save and goes on: none may be missing.
    assert not [r for r in caplog.records if "Failed to create checkpoint" in r.getMessage()]
