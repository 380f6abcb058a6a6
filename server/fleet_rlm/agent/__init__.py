"""The workspace agent: a conversation over the workspace, hosted by the Microsoft Agent Framework.

An Agent Framework ``Agent`` (``client.ModelChatClient``: any model the runtime can use) with tools over
the Engine (``tools``): RLM runs, runs and traces, volume files and memory, web pages and repositories
pulled into ``buffers/``, the user's own MCP servers. Every turn is a workflow built for it and
checkpointed in the store (``turn``, ``checkpoints``); a tool with side effects pauses the turn for an
approval, durably, until someone answers it from any face (``approvals``, ``host``). Faces use
``AgentHost.of(engine)`` and the models in ``views``. See docs/agent.md. Names load on first use, so
faces that only need the models stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["AgentHost", "Feed"]

if TYPE_CHECKING:
    from fleet_rlm.agent.host import AgentHost, Feed


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("fleet_rlm.agent.host"), name)
    raise AttributeError(f"module 'fleet_rlm.agent' has no attribute {name!r}")
