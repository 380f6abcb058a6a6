"""fleet-rlm: a workspace for recursive language models.

The public Python API, for notebooks, scripts and hosts (the Agent Framework host uses it too)::

    from fleet_rlm import Engine, RunRequest

    async with Engine() as engine:
        result = await engine.run(RunRequest("What failed first?", context_paths=["logs/"]))

``SandboxInterpreter`` runs stock ``dspy.RLM`` on the same sandbox:
``dspy.RLM("context, query -> answer", interpreter_factory=SandboxInterpreter)``.
Names load on first use, so ``import fleet_rlm`` stays cheap (the engine imports DSPy).
See docs/python-api.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Engine": "fleet_rlm.core.engine",
    "RunRequest": "fleet_rlm.types",
    "RunResult": "fleet_rlm.types",
    "Workspace": "fleet_rlm.core.workspace",
    "SandboxInterpreter": "fleet_rlm.sandbox.interpreter",
    "FleetError": "fleet_rlm.errors",
    "UserError": "fleet_rlm.errors",
    "NotFound": "fleet_rlm.errors",
    "Conflict": "fleet_rlm.errors",
    "Unavailable": "fleet_rlm.errors",
    "load_settings": "fleet_rlm.config",
}
__all__ = [
    "Conflict", "Engine", "FleetError", "NotFound", "RunRequest", "RunResult", "SandboxInterpreter",
    "Unavailable", "UserError", "Workspace", "__version__", "load_settings",
]

if TYPE_CHECKING:
    from fleet_rlm.config import load_settings
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.errors import Conflict, FleetError, NotFound, Unavailable, UserError
    from fleet_rlm.sandbox.interpreter import SandboxInterpreter
    from fleet_rlm.types import RunRequest, RunResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet_rlm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
