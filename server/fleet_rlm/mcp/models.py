"""Structured tool outputs. Each model becomes the tool's output schema and its structured content.

What a run, a trace or a volume looks like is defined once in ``core.views``; MCP adds its links."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from fleet_rlm.core import views
from fleet_rlm.core.rerun import ReplayReport
from fleet_rlm.core.views import (
    CancelResult,
    FileEntry,
    FileList,
    Progress,
    RunList,
    RunSummary,
    StepDetail,
    StepSummary,
    SubcallView,
    TraceView,
    VolumeInfo,
    VolumeList,
)
from fleet_rlm.types import RunStatus

__all__ = [
    "CancelResult", "DoctorReport", "FileContent", "FileEntry", "FileList", "ForkOutput", "Progress",
    "ReplayOutput", "RunList", "RunOutput", "RunState", "RunSummary", "StartedRun", "StepDetail", "StepSummary",
    "SubcallView", "TraceView", "VolumeInfo", "VolumeList", "WrittenFile",
]


def run_uri(run_id: str) -> str:
    return f"fleet://runs/{run_id}"


def trace_uri(run_id: str) -> str:
    return f"fleet://runs/{run_id}/trace"


class RunOutput(views.RunOutput):
    """The outcome of a finished run."""

    trace_uri: str = Field(description="Resource with the full step-by-step trace.")


class ReplayOutput(ReplayReport):
    """How a replay compares with the run it replays."""

    trace_uri: str = Field(description="Resource with the replay's own trace.")


class ForkOutput(RunOutput):
    """The outcome of a fork, with where it came from."""

    parent_run_id: str = Field(description="The run it was forked from.")
    fork_at: str = Field(description="The step it branched at, NODE:STEP (root:3).")


class RunState(views.RunState):
    """A run as it is now: status, answer when done, live counters while running."""

    trace_uri: str


class StartedRun(BaseModel):
    run_id: str
    status: RunStatus
    run_uri: str = Field(description="Resource with the run's current state.")
    trace_uri: str


class FileContent(views.TextRange):
    uri: str


class WrittenFile(BaseModel):
    volume: str
    path: str
    size: int
    uri: str = Field(description="Resource URI of the file.")
    ref: str = Field(description="Reference to pass in ``context_paths`` of a run.")


class DoctorReport(BaseModel):
    ok: bool = Field(description="True if every check passed.")
    checks: dict[str, dict[str, Any]] = Field(description="Per area: ok, detail and, when not ok, fix.")
