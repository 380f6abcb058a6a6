"""The Agent Framework's checkpoint storage, in the fleet-rlm store (the ``agent_checkpoints`` table).

A paused turn is its workflow's latest checkpoint: written through the store's writer thread, committed
before the turn reports itself paused, and read back by any later process. The framework encodes values
it cannot write as JSON as restricted pickles; loading allows only its own and the built-in types (we put
no types of ours into a checkpoint), and a checkpoint that would not load is refused when saved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_framework import WorkflowCheckpoint

# The encoding FileCheckpointStorage uses (not exported by the package; pinned version).
from agent_framework._workflows._checkpoint_encoding import decode_checkpoint_value, encode_checkpoint_value
from agent_framework.exceptions import WorkflowCheckpointException

if TYPE_CHECKING:
    from fleet_rlm.store import Store


class StoreCheckpointStorage:
    """Implements the framework's ``CheckpointStorage`` protocol over ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        data = encode_checkpoint_value(checkpoint.to_dict())
        decode_checkpoint_value(data, allowed_types=frozenset())  # raises now, not at the resume
        await self.store.write(self.store.save_checkpoint, checkpoint.checkpoint_id, checkpoint.workflow_name, data)
        return checkpoint.checkpoint_id

    @staticmethod
    def _decode(data: dict[str, object]) -> WorkflowCheckpoint:
        return WorkflowCheckpoint.from_dict(decode_checkpoint_value(data, allowed_types=frozenset()))

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        data = self.store.load_checkpoint(checkpoint_id)
        if data is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return self._decode(data)

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        return [self._decode(d) for d in self.store.workflow_checkpoints(workflow_name)]

    async def delete(self, checkpoint_id: str) -> bool:
        return await self.store.write(self.store.delete_checkpoint, checkpoint_id)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        rows = self.store.workflow_checkpoints(workflow_name)
        return self._decode(rows[-1]) if rows else None

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        return [c.checkpoint_id for c in await self.list_checkpoints(workflow_name=workflow_name)]
