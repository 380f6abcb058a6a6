"""The Agent Framework's checkpoint storage, in the fleet-rlm store (the ``agent_checkpoints`` table).

A paused turn is its workflow's latest checkpoint: written through the store's writer thread, committed
before the turn reports itself paused, and read back by any later process.

Checkpoints are plain JSON data. The framework's own encoding pickles every value JSON cannot hold, and
its restricted unpickler still lets a pickle call framework constructors (one creates folders) and
``getattr``: a row planted in the database would run code in the server when the turn resumes. So the
few framework types a turn's checkpoints hold (messages and their contents, the agent's response, the
workflow's queued messages and pending request events, their enums) go through a fixed table: written
with their own ``to_dict`` or attributes, rebuilt from that data, never unpickled. A value of any other
type fails the save (the framework logs that and goes on without the checkpoint; a test checks a whole
turn saves every one). A row in any other form (written by an earlier fleet-rlm, or planted) is refused
when read, with a message that says to send the message again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_framework import (
    AgentExecutorResponse,
    AgentResponse,
    Content,
    Message,
    WorkflowCheckpoint,
    WorkflowEvent,
    WorkflowEventSource,
    WorkflowMessage,
)
from agent_framework._workflows._runner_context import MessageType
from agent_framework.exceptions import WorkflowCheckpointException

from fleet_rlm.errors import UserError

if TYPE_CHECKING:
    from fleet_rlm.store import Store

FORMAT = "fleet-rlm/checkpoint-1"
TAG = "$fleet"  # marks an encoded value; a plain dict holding this key is itself encoded, so never confused
_PLAIN = (str, int, float, bool, type(None))


class CheckpointRefused(UserError):
    """A stored checkpoint is not in the form this fleet-rlm writes, so it is not loaded."""


@dataclass(frozen=True)
class _Codec:
    kind: type
    dump: Callable[[Any], Any]  # the value as data (encoded further by ``to_data``)
    load: Callable[[Any], Any]  # the value back from that data (already decoded)


def _attributes(value: Any) -> dict[str, Any]:
    return dict(vars(value))


def _enum_value(value: Any) -> Any:
    return value.value


def _rebuilt(kind: type) -> Callable[[Any], Any]:
    """Loads an object from its attributes without calling its constructor, as pickle would, but from data."""

    def load(fields: Any) -> Any:
        if not isinstance(fields, dict) or not all(isinstance(k, str) and not k.startswith("__") for k in fields):
            raise ValueError(f"bad attributes for {kind.__name__}")
        value = kind.__new__(kind)
        value.__dict__.update(fields)
        return value

    return load


_CODECS: dict[str, _Codec] = {
    "message": _Codec(Message, Message.to_dict, Message.from_dict),
    "content": _Codec(Content, Content.to_dict, Content.from_dict),
    "agent_response": _Codec(AgentResponse, AgentResponse.to_dict, AgentResponse.from_dict),
    "agent_executor_response": _Codec(AgentExecutorResponse, _attributes, _rebuilt(AgentExecutorResponse)),
    "workflow_message": _Codec(WorkflowMessage, _attributes, _rebuilt(WorkflowMessage)),
    "workflow_event": _Codec(WorkflowEvent, _attributes, _rebuilt(WorkflowEvent)),
    "message_type": _Codec(MessageType, _enum_value, MessageType),
    "event_source": _Codec(WorkflowEventSource, _enum_value, WorkflowEventSource),
}
_TAGS = {codec.kind: tag for tag, codec in _CODECS.items()}
# The classes a pending request event names as its request and response types.
_CLASSES: dict[str, type] = {"message": Message, "content": Content}
_CLASS_NAMES = {kind: name for name, kind in _CLASSES.items()}


def to_data(value: Any) -> Any:
    """``value`` as JSON-ready data; WorkflowCheckpointException names a type with no encoding."""
    if type(value) in _PLAIN:
        return value
    if type(value) is list:
        return [to_data(v) for v in value]
    if type(value) is dict:
        if TAG not in value and all(type(k) is str for k in value):
            return {k: to_data(v) for k, v in value.items()}
        return {TAG: "dict", "items": [[to_data(k), to_data(v)] for k, v in value.items()]}
    if isinstance(value, type) and value in _CLASS_NAMES:
        return {TAG: "class", "name": _CLASS_NAMES[value]}
    tag = _TAGS.get(type(value))
    if tag is None:
        raise WorkflowCheckpointException(
            f"fleet-rlm writes checkpoints as data and has no encoding for {type(value).__qualname__}"
        )
    return {TAG: tag, "data": to_data(_CODECS[tag].dump(value))}


def from_data(value: Any) -> Any:
    """The value ``to_data`` made; raises (KeyError, ValueError, TypeError ...) on anything else."""
    if isinstance(value, list):
        return [from_data(v) for v in value]
    if not isinstance(value, dict):
        return value
    if TAG not in value:
        return {k: from_data(v) for k, v in value.items()}
    tag = value[TAG]
    if tag == "dict":
        return {from_data(k): from_data(v) for k, v in value["items"]}
    if tag == "class":
        return _CLASSES[value["name"]]
    return _CODECS[tag].load(from_data(value["data"]))


def _decode(row: Any) -> WorkflowCheckpoint:
    refused = CheckpointRefused(
        "this turn's saved state is not in the form this fleet-rlm writes (an earlier version wrote it, or it"
        " was changed) and loading it could run code, so it is not resumed: send the message again"
    )
    if not isinstance(row, dict) or set(row) != {"format", "checkpoint"} or row["format"] != FORMAT:
        raise refused
    try:
        return WorkflowCheckpoint.from_dict(from_data(row["checkpoint"]))
    except Exception:
        raise refused from None


class StoreCheckpointStorage:
    """Implements the framework's ``CheckpointStorage`` protocol over ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        row = {"format": FORMAT, "checkpoint": to_data(checkpoint.to_dict())}
        await self.store.write(
            self.store.agent.save_checkpoint, checkpoint.checkpoint_id, checkpoint.workflow_name, row
        )
        return checkpoint.checkpoint_id

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        row = self.store.agent.load_checkpoint(checkpoint_id)
        if row is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return _decode(row.data)

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        return [_decode(row.data) for row in self.store.agent.workflow_checkpoints(workflow_name)]

    async def delete(self, checkpoint_id: str) -> bool:
        return await self.store.write(self.store.agent.delete_checkpoint, checkpoint_id)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        rows = self.store.agent.workflow_checkpoints(workflow_name)
        return _decode(rows[-1].data) if rows else None

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        return [c.checkpoint_id for c in await self.list_checkpoints(workflow_name=workflow_name)]
