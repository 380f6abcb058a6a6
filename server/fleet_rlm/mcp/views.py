"""Core views dressed for MCP (with resource links), and the one place errors become tool errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mcp.server.mcpserver.exceptions import ToolError

from fleet_rlm.config import NoModelConfigured
from fleet_rlm.errors import FleetError, RunNotFound
from fleet_rlm.mcp.models import RunOutput, RunState, trace_uri
from fleet_rlm.redaction import redact_text

if TYPE_CHECKING:
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.types import RunResult


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Errors written for people (every ``FleetError``) become tool errors the model reads.

    Any other exception reaches the client only as "Error executing tool". Secrets are masked:
    the reply leaves this machine's trust boundary."""
    try:
        yield
    except ToolError:
        raise
    except FleetError as exc:
        raise ToolError(redact_text(exc.message) + _hint(exc)) from exc


# An exported FLEET_LM_MODEL is not seen: clients start servers with their configured environment only.
NO_MODEL_HINT = (
    " MCP clients pass only the environment written in their configuration to the servers they start, not your "
    "shell's: add FLEET_LM_MODEL and its key (FLEET_LM_API_KEY) to this server's \"env\" in the client's "
    "configuration (MCP Inspector: -e FLEET_LM_MODEL=... -e FLEET_LM_API_KEY=...), or save them once for every "
    "launch with `fleet-rlm config set`."
)


def _hint(exc: FleetError) -> str:
    """Where the MCP face's user goes next, beyond what the core message says."""
    if isinstance(exc, RunNotFound):
        return " (list_runs lists recent ones)"
    return NO_MODEL_HINT if isinstance(exc, NoModelConfigured) else ""


def run_output(result: RunResult, workspace: Workspace) -> RunOutput:
    """A finished run's result with what went into it (the core view every face shows)."""
    inputs = workspace.inputs(result.run_id)
    return RunOutput(**result.to_dict(), inputs=inputs, trace_uri=trace_uri(result.run_id))


def run_state(workspace: Workspace, run_id: str) -> RunState:
    """NotFound (a FleetError) when there is no such run."""
    state = workspace.run_state(run_id)
    return RunState(**state.model_dump(), trace_uri=trace_uri(state.run_id))
