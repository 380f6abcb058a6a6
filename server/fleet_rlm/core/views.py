"""What every face shows of runs, traces and volumes, computed once.

MCP returns these models as structured tool output, the web app serializes them as JSON, the CLI
draws them. No face keeps its own idea of "what a run looks like". No DSPy here: faces import it
for free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet_rlm.core.progress import ProgressTracker
from fleet_rlm.core.trace import build_trace, summarize_step
from fleet_rlm.errors import NotFound
from fleet_rlm.types import CONTEXT_LOADED, Event, RunResult, RunStatus, tokens_of

if TYPE_CHECKING:
    from fleet_rlm.store import RunRecord

PREVIEW = 200


class View(BaseModel):
    """A view every face returns. Its schema is built on first use, not on import: a read command
    uses two of these views, and building all of them was a fifth of its start-up."""

    model_config = ConfigDict(defer_build=True)


# -- runs ---------------------------------------------------------------------------------------


class InputsSummary(View):
    """What went into a run's context: counts, the files skipped and why, and the size report, from the
    run's ``context.loaded`` event. Every face shows this one view (a run page, a tool result)."""

    summary: str = Field(
        description='The counts in one line: "1 document (3 pages) · 1 image · 12,345 characters from 3 sources".'
    )
    chars: int = Field(description="Characters of the context the REPL reads.")
    sources: int = Field(description="Entries of `sources`: files, pasted texts, pages, images.")
    documents: int = Field(0, description="Documents converted to text (PDF, DOCX, PPTX, XLSX, EPUB, ...).")
    pages: int = Field(0, description="Pages of the PDFs among them.")
    images: int = Field(0, description="Images kept as files for llm_query(images=...).")
    cached: int = Field(0, description="Documents whose text came from the conversion cache.")
    skipped_count: int = Field(0, description="Files that could not be read; `skipped` lists the first 50.")
    skipped: list[str] = Field(default_factory=list, description='Skipped files, as "name: reason".')
    report: str = Field("", description="The size report: every source with its size and parts, every skip.")


def _counted(n: int, noun: str) -> str:
    return f"{n:,} {noun if n == 1 else noun + 's'}"


def inputs_summary(data: dict[str, Any]) -> InputsSummary:
    """The view of one ``context.loaded`` event's data (events from before the counts read as zeros)."""
    skipped = [str(line) for line in data.get("skipped") or []]
    counts = {k: int(data.get(k) or 0) for k in ("chars", "sources", "documents", "pages", "images", "cached")}
    skipped_count = int(data.get("skipped_count") or len(skipped))
    parts = []
    if counts["documents"]:
        within = [_counted(counts["pages"], "page")] if counts["pages"] else []
        within += [f"{counts['cached']:,} from the cache"] if counts["cached"] else []
        parts.append(_counted(counts["documents"], "document") + (f" ({', '.join(within)})" if within else ""))
    if counts["images"]:
        parts.append(_counted(counts["images"], "image"))
    parts.append(f"{_counted(counts['chars'], 'character')} from {_counted(counts['sources'], 'source')}")
    if skipped_count:
        parts.append(f"{_counted(skipped_count, 'file')} skipped")
    return InputsSummary(
        summary=" · ".join(parts), **counts, skipped_count=skipped_count, skipped=skipped,
        report=str(data.get("report") or ""),
    )  # fmt: skip


def inputs_of(events: Sequence[Event]) -> InputsSummary | None:
    """What went into the run whose events these are; None if it loaded no context (a session's
    follow-up without new inputs keeps the session's)."""
    for event in events:
        if event["kind"] == CONTEXT_LOADED and (event.get("node") or "root") == "root":
            return inputs_summary(event.get("data") or {})
    return None


class RunOutput(View):
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
    inputs: InputsSummary | None = Field(
        None, description="What went into the context (counts, skipped files); null if the run loaded none."
    )


class Progress(View):
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


class RunState(View):
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
    kind: str = Field("run", description="run, or replay (a rerun answered from its parent's record).")
    parent_run_id: str | None = Field(None, description="What a replay replays, or a fork was forked from.")
    fork_at: str | None = Field(None, description="A fork's step in its parent run, NODE:STEP (root:3).")
    pinned: bool = Field(False, description="Kept by retention (pin_run).")
    inputs: InputsSummary | None = Field(
        None, description="What went into the context (counts, skipped files); null until it is loaded, or none."
    )


class RunSummary(View):
    run_id: str
    status: RunStatus
    question: str = Field(description="The question, cut to 200 characters.")
    answer_preview: str | None
    created_at: float
    seconds: float | None
    session_id: str | None
    kind: str = "run"
    parent_run_id: str | None = Field(None, description="What a replay replays, or a fork was forked from.")
    fork_at: str | None = Field(None, description="A fork's step in its parent run, NODE:STEP (root:3).")
    pinned: bool = Field(False, description="Kept by retention (pin_run).")
    iterations: int = Field(0, description="Steps of the root RLM so far.")
    llm_calls: int = Field(0, description="Model calls of the run and its sub-queries so far.")


class CancelResult(View):
    """What a request to stop a run did (every face returns this one view)."""

    run_id: str
    cancelled: bool = Field(description="True if this request stopped the run.")
    status: RunStatus
    message: str


class RunList(View):
    runs: list[RunSummary]
    offset: int
    has_more: bool


def progress_of(events: Sequence[Event]) -> Progress:
    tracker = ProgressTracker()
    for event in events:
        tracker.feed(event)
    return Progress.model_validate(tracker.state.__dict__)


def run_state(rec: RunRecord, events: Sequence[Event]) -> RunState:
    progress = progress_of(events)
    return RunState(
        run_id=rec.id,
        status=rec.status,
        question=rec.question,
        answer=rec.answer,
        error=rec.error,
        stop_reason=rec.stop_reason,
        session_id=rec.session_id,
        created_at=rec.created_at,
        started_at=rec.started_at,
        finished_at=rec.finished_at,
        seconds=seconds_of(rec),
        # While a run is going the row's counters are still 0; the events know better.
        iterations=rec.iterations or progress.root_steps,
        llm_calls=rec.llm_calls or progress.llm_calls,
        usage=rec.usage or {},
        progress=progress,
        pinned=rec.pinned,
        inputs=inputs_of(events),
        **lineage_of(rec),
    )


def run_summary(rec: RunRecord) -> RunSummary:
    return RunSummary(
        run_id=rec.id,
        status=rec.status,
        question=rec.question[:PREVIEW],
        answer_preview=(rec.answer or "")[:PREVIEW] or None,
        created_at=rec.created_at,
        seconds=seconds_of(rec) if rec.started_at else None,
        session_id=rec.session_id,
        pinned=rec.pinned,
        iterations=rec.iterations,
        llm_calls=rec.llm_calls,
        **lineage_of(rec),
    )


def lineage_of(rec: RunRecord) -> dict[str, Any]:
    """Where a replay or fork comes from (an optimization's runs name the optimization instead)."""
    parent = rec.parent_run_id if rec.kind in ("run", "replay") else None
    return {"kind": rec.kind, "parent_run_id": parent, "fork_at": rec.fork_at}


def lineage_line(kind: str, parent_run_id: str | None, fork_at: str | None) -> str | None:
    """One line every face shows: "forked from RUN at step 3", "replay of RUN" (None: neither)."""
    if parent_run_id is None:
        return None
    if kind == "replay":
        return f"replay of {parent_run_id}"
    node, _, step = (fork_at or "root:?").rpartition(":")
    return f"forked from {parent_run_id} at step {step}" + (f" of {node}" if node != "root" else "")


def run_result(rec: RunRecord) -> RunResult:
    return RunResult(
        run_id=rec.id,
        status=rec.status,
        answer=rec.answer,
        iterations=rec.iterations or 0,
        llm_calls=rec.llm_calls or 0,
        usage=rec.usage or {},
        seconds=seconds_of(rec),
        stop_reason=rec.stop_reason,
        error=rec.error,
        session_id=rec.session_id,
    )


def seconds_of(rec: RunRecord) -> float:
    end = rec.finished_at or time.time()
    return round(end - (rec.started_at or rec.created_at), 3)


def total_tokens(usage: dict[str, Any]) -> int:
    """Prompt plus completion tokens of a run's usage (``{"total": {...}, "by_model": {...}}``)."""
    return tokens_of(usage.get("total") or {})


def cache_note(counts: dict[str, Any]) -> str:
    """The prompt cache's part in one call's or a run's total counts, as " · 62% of prompt cached, $0.0012
    saved"; empty when the provider read none of the prompt from its cache."""
    cached, prompt = counts.get("cached_tokens") or 0, counts.get("prompt_tokens") or 0
    if not cached or not prompt:
        return ""
    saved = counts.get("saved") or 0.0
    return f" · {cached / prompt:.0%} of prompt cached" + (f", ${saved:.4f} saved" if saved else "")


def models_note(usage: dict[str, Any]) -> str:
    """Calls and tokens per configured model, as " · models: root 2 calls 1,200 tok, fast 3 calls 90 tok";
    empty unless a named model (settings.models) answered some, so a run of the root and sub model reads
    as it always did."""
    by_name = usage.get("by_name") or {}
    if not set(by_name) - {"root", "sub"}:
        return ""
    parts = []
    for name, part in by_name.items():
        cost = f", ${part['cost']:.4f}" if part.get("cost") else ""
        parts.append(f"{name} {int(part.get('calls') or 0)} ({tokens_of(part):,} tok{cost})")
    return " · models: " + ", ".join(parts)


class SessionInfo(View):
    id: str
    name: str | None
    created_at: float
    last_used_at: float
    closed_at: float | None


class SessionList(View):
    sessions: list[SessionInfo]


class Feedback(View):
    """A person's judgement of a run's answer, kept for optimization."""

    id: int
    run_id: str
    correct: bool
    expected: str | None = Field(description="The answer that would have been right, if given.")
    comment: str | None
    created_at: float


# -- traces -------------------------------------------------------------------------------------


class StepSummary(View):
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
    tool_calls: int = 0
    tool_errors: int = 0
    children: list[str]


class SubcallView(View):
    index: int = Field(description="Position among this step's sub-queries.")
    prompt_preview: str | None = None
    prompt_chars: int | None = None
    response_preview: str | None = None
    response_chars: int | None = None
    error: str | None = None
    model: str | None = None
    batch: dict[str, Any] | None = None


class StepDetail(View):
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
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="The step's tool calls (tool.called): server, tool, sizes, seconds, error."
    )


class TraceView(View):
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
    lineage: dict[str, Any] | None = Field(
        None, description="A replay's or fork's source: {kind, source, at} (at: a fork's NODE:STEP)."
    )


def trace_page(
    run_id: str,
    events: Sequence[Event],
    *,
    node: str = "root",
    step: int | None = None,
    detail: Literal["summary", "full"] = "summary",
    offset: int = 0,
    limit: int = 20,
) -> TraceView:
    """A page of one node's steps, or one step in full with its sub-queries paged."""
    trace = build_trace(events)
    nodes = trace["nodes"]
    if node not in nodes:
        raise NotFound(f"run '{run_id}' has no node '{node}'; its nodes are: {', '.join(nodes)}")
    n = nodes[node]
    steps = sorted(n["steps"], key=lambda s: s["step"])
    run = trace["run"]
    view: dict[str, Any] = {
        "run_id": run_id,
        "run_status": run.get("status") or "running",
        "question": run.get("question"),
        "answer": run.get("answer"),
        "node": node,
        "node_status": n.get("status"),
        "parent": n.get("parent"),
        "depth": int(n.get("depth") or 0),
        "query_preview": n.get("query_preview"),
        "answer_preview": n.get("answer_preview"),
        "children": list(n.get("children") or []),
        "warnings": [str(w) for w in n.get("warnings") or []],
        "nodes": list(nodes),
        "steps_total": len(steps),
        "offset": offset,
        "lineage": run.get("lineage"),
    }
    if step is not None:
        found = next((s for s in steps if s["step"] == step), None)
        if found is None:
            have = f"steps 1..{steps[-1]['step']}" if steps else "no steps yet"
            raise NotFound(f"node '{node}' of run '{run_id}' has {have}")
        detail_view = step_detail(found, offset, limit)
        more = offset + limit < detail_view.subcalls_total
        return TraceView(**view, steps=[], step=detail_view, has_more=more)
    page = steps[offset : offset + limit]
    listed: list[StepSummary] | list[StepDetail]
    if detail == "full":
        listed = [step_detail(s, 0, 0) for s in page]
    else:
        listed = [StepSummary.model_validate(summarize_step(s)) for s in page]
    return TraceView(**view, steps=listed, step=None, has_more=offset + limit < len(steps))


def step_detail(step: dict[str, Any], offset: int, limit: int) -> StepDetail:
    """A step in full; its sub-queries paged (limit 0: counted, not listed)."""
    subcalls = step.get("subcalls") or []
    page = subcalls[offset : offset + limit] if limit else []
    keys = ("prompt_preview", "prompt_chars", "response_preview", "response_chars", "error", "model", "batch")
    return StepDetail(
        step=step["step"],
        reasoning=step.get("reasoning"),
        code=step.get("code"),
        output=step.get("output"),
        output_chars=step.get("output_chars"),
        error=step.get("error"),
        submitted=bool(step.get("submitted")),
        duration=step.get("duration"),
        lm=step.get("lm"),
        children=list(step.get("children") or []),
        subcalls_total=len(subcalls),
        subcalls_offset=offset,
        subcalls=[SubcallView(index=offset + i, **{k: s.get(k) for k in keys}) for i, s in enumerate(page)],
        tools=list(step.get("tools") or []),
    )


# -- volumes ------------------------------------------------------------------------------------


class VolumeInfo(View):
    name: str
    files: int = Field(description="Entries of any kind (files, folders, links), counted against max_files.")
    bytes: int
    quota_bytes: int = Field(description="Disk use allowed; a step that goes past it has its new files removed.")
    max_files: int


class VolumeList(View):
    volumes: list[VolumeInfo]


class FileEntry(View):
    path: str
    type: Literal["file", "dir", "link", "other"] = Field(
        description="'link': a symbolic link, never followed; 'other': a pipe, socket or device, never read."
    )
    size: int
    mtime: float


class FileList(View):
    volume: str
    path: str
    entries: list[FileEntry]
    truncated: bool = Field(description="True if more entries exist than were returned.")


class TextRange(View):
    """A byte range of a text file, decoded without cutting a character in half."""

    volume: str
    path: str
    content: str = Field(description="UTF-8 text of the requested byte range.")
    offset: int
    bytes_read: int
    size: int = Field(description="Total size of the file in bytes.")
    truncated: bool = Field(description="True if the file continues past this range.")
    next_offset: int | None = Field(description="Pass as ``offset`` to read on; null at the end.")


def text_range(volume: str, path: str, data: bytes, offset: int, size: int) -> TextRange:
    """Decode ``data`` (read at ``offset`` from a file of ``size`` bytes) for a person or a model."""
    text, used = decode_prefix(data, at_end=offset + len(data) >= size)
    end = offset + used
    return TextRange(
        volume=volume,
        path=path,
        content=text,
        offset=offset,
        bytes_read=used,
        size=size,
        truncated=end < size,
        next_offset=end if end < size else None,
    )


def decode_prefix(data: bytes, *, at_end: bool) -> tuple[str, int]:
    """Decode UTF-8, leaving out a character cut in half at the end of the range.

    Returns the text and how many bytes it used, so the next read starts on a character.
    """
    if not at_end:
        for cut in range(0, min(4, len(data))):
            try:
                return data[: len(data) - cut].decode("utf-8"), len(data) - cut
            except UnicodeDecodeError as exc:
                if exc.start < len(data) - 4:  # a real encoding error, not a cut character
                    break
    return data.decode("utf-8", errors="replace"), len(data)
