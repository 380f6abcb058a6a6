"""Core views dressed for MCP (with resource links), and the one place errors become tool errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mcp.server.mcpserver.exceptions import ToolError

from fleet_rlm.core.errors import FleetError, RunNotFound
from fleet_rlm.mcp.models import RunOutput, RunState, trace_uri
from fleet_rlm.redaction import redact_text

if TYPE_CHECKING:
    from fleet_rlm.core.types import RunResult
    from fleet_rlm.core.workspace import Workspace


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
        hint = " (list_runs lists recent ones)" if isinstance(exc, RunNotFound) else ""
        raise ToolError(redact_text(exc.message) + hint) from exc


def run_output(result: RunResult) -> RunOutput:
    return RunOutput(**result.to_dict(), trace_uri=trace_uri(result.run_id))


def run_state(workspace: Workspace, run_id: str) -> RunState:
    """NotFound (a FleetError) when there is no such run."""
    state = workspace.run_state(run_id)
    return RunState(**state.model_dump(), trace_uri=trace_uri(state.run_id))
