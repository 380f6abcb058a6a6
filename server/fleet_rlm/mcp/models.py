"""Structured tool outputs. Each model becomes the tool's output schema and its structured content."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "interrupted"]


def run_uri(run_id: str) -> str:
    return f"fleet://runs/{run_id}"


def trace_uri(run_id: str) -> str:
    return f"fleet://runs/{run_id}/trace"


class RunOutput(BaseModel):
    """The outcome of a finished run."""

    run_id: str
    status: RunStatus
    answer: str | None = Field(description="The submitted answer; null if the run found none.")
    iterations: int = Field(description="REPL steps taken, all nodes together.")
    llm_calls: int = Field(description="Model calls made (root steps and sub-queries).")
    usage: dict[str, Any] = Field(description="Tokens and cost, in total and by model.")
    seconds: float
    stop_reason: str | None = Field(None, description="Why the run stopped without an answer, if it did.")
    error: str | None = None
    session_id: str | None = None
    trace_uri: str = Field(description="Resource with the full step-by-step trace.")


class StartedRun(BaseModel):
    run_id: str
    status: RunStatus
    run_uri: str = Field(description="Resource with the run's current state.")
    trace_uri: str


class Progress(BaseModel):
    """Counters folded from the run's events so far."""

    step: int = Field(0, description="Latest step of the node that last acted.")
    node: str = "root"
    root_steps: int = 0
    llm_calls: int = Field(0, description="Model calls so far (root steps, child steps and sub-queries).")
    subqueries_done: int = 0
    subqueries_total: int = Field(0, description="Size of the batch in progress (0 outside a batch).")
    children: int = Field(0, description="Child RLMs started.")
    tokens: int = 0
    errors: int = Field(0, description="Code steps that raised.")
    events: int = 0
    message: str = Field("", description="The latest progress line.")


class RunState(BaseModel):
    """A run as it is now: status, answer when done, live counters while running."""

    run_id: str
    status: RunStatus
    question: str
    answer: str | None
    error: str | None
    stop_reason: str | None
    session_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    seconds: float
    iterations: int
    llm_calls: int
    usage: dict[str, Any]
    progress: Progress
    trace_uri: str


class CancelOutput(BaseModel):
    run_id: str
    cancelled: bool = Field(description="True if this call stopped the run.")
    status: RunStatus
    message: str


class RunSummary(BaseModel):
    run_id: str
    status: RunStatus
    question: str = Field(description="The question, cut to 200 characters.")
    answer_preview: str | None
    created_at: float
    seconds: float | None
    session_id: str | None


class RunList(BaseModel):
    runs: list[RunSummary]
    offset: int
    has_more: bool


class StepSummary(BaseModel):
    """A step with previews and sizes; ask for ``step=N`` to see it whole."""

    step: int
    reasoning: str
    code_preview: str
    code_chars: int
    output_preview: str
    output_chars: int
    error: str | None
    submitted: bool
    subcalls: int
    subcall_errors: int
    children: list[str]


class SubcallView(BaseModel):
    index: int = Field(description="Position among this step's sub-queries.")
    prompt_preview: str | None = None
    prompt_chars: int | None = None
    response_preview: str | None = None
    response_chars: int | None = None
    error: str | None = None
    model: str | None = None
    batch: dict[str, Any] | None = None


class StepDetail(BaseModel):
    """One step in full: the code the model wrote, what it printed, and its sub-queries (paged)."""

    step: int
    reasoning: str | None
    code: str | None
    output: str | None
    output_chars: int | None
    error: str | None
    submitted: bool
    duration: float | None
    lm: dict[str, Any] | None
    children: list[str]
    subcalls_total: int
    subcalls_offset: int
    subcalls: list[SubcallView]


class TraceView(BaseModel):
    """One node of a run's trace: its steps (paged summaries or full) or one step in detail."""

    run_id: str
    run_status: str
    question: str | None
    answer: str | None
    node: str
    node_status: str | None
    parent: str | None
    depth: int
    query_preview: str | None
    answer_preview: str | None
    children: list[str] = Field(description="Child nodes; pass one as ``node`` to inspect it.")
    warnings: list[str]
    nodes: list[str] = Field(description="Every node id of the run.")
    steps_total: int
    offset: int
    steps: list[StepSummary] | list[StepDetail] = Field(
        description="Paged steps: summaries (detail='summary') or full steps (detail='full')."
    )
    step: StepDetail | None = Field(None, description="The requested step, when ``step`` was given.")
    has_more: bool


class VolumeInfo(BaseModel):
    name: str
    files: int = Field(description="Entries of any kind (files, folders, links), counted against max_files.")
    bytes: int
    quota_bytes: int = Field(description="Disk use allowed; a step that goes past it has its new files removed.")
    max_files: int


class VolumeList(BaseModel):
    volumes: list[VolumeInfo]


class FileEntry(BaseModel):
    path: str
    type: Literal["file", "dir", "link", "other"] = Field(
        description="'link': a symbolic link, never followed; 'other': a pipe, socket or device, never read."
    )
    size: int
    mtime: float


class FileList(BaseModel):
    volume: str
    path: str
    entries: list[FileEntry]
    truncated: bool = Field(description="True if more entries exist than were returned.")


class FileContent(BaseModel):
    volume: str
    path: str
    content: str = Field(description="UTF-8 text of the requested byte range.")
    offset: int
    bytes_read: int
    size: int = Field(description="Total size of the file in bytes.")
    truncated: bool = Field(description="True if the file continues past this range.")
    next_offset: int | None = Field(description="Pass as ``offset`` to read on; null at the end.")
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
