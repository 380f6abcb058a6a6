"""The vocabulary every face shares: run requests and results, statuses, event kinds and payloads.

A leaf: it imports nothing of DSPy and nothing of this package but the error classes and the run limits
(``fleet_rlm.limits``, a leaf too), so the CLI, MCP, web and desktop faces can import it for free, and core
modules depend on it, not on each other.

Events travel in a versioned envelope (``EVENT_VERSION``)::

    {"v": 1, "run_id", "seq", "ts", "kind", "node", "parent", "depth", "data"}

``seq`` is gap-free per run. ``data`` is the payload of its kind, one ``TypedDict`` below each;
``docs/events.schema.json`` is the published JSON Schema of the envelope and every payload.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, Protocol
from urllib.parse import urlsplit

from typing_extensions import TypedDict  # pydantic builds the events schema from these (needs it before 3.12)

from fleet_rlm.errors import UserError
from fleet_rlm.limits import LIMITS, check_limits

# -- run statuses -----------------------------------------------------------------------------

# ``partial``: a budget (steps, calls, time, cost) stopped the run before it submitted, and the
# answer was extracted from the work so far; never to be read as a clean ``succeeded``.
RunStatus = Literal["queued", "running", "succeeded", "partial", "failed", "cancelled", "interrupted"]
QUEUED: Final = "queued"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
PARTIAL: Final = "partial"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
INTERRUPTED: Final = "interrupted"
STATUSES: Final[tuple[RunStatus, ...]] = (QUEUED, RUNNING, SUCCEEDED, PARTIAL, FAILED, CANCELLED, INTERRUPTED)
ACTIVE_STATUSES: Final[tuple[RunStatus, ...]] = (QUEUED, RUNNING)
FINAL_STATUSES: Final[tuple[RunStatus, ...]] = (SUCCEEDED, PARTIAL, FAILED, CANCELLED, INTERRUPTED)


def tokens_of(counts: Mapping[str, Any]) -> int:
    """Prompt plus completion tokens of one usage record (a call's, a model's or a run's total)."""
    return int(counts.get("prompt_tokens") or 0) + int(counts.get("completion_tokens") or 0)


# -- events -----------------------------------------------------------------------------------

EVENT_VERSION: Final = 1
RUN_STARTED: Final = "run.started"
RUN_FINISHED: Final = "run.finished"
CONTEXT_LOADED: Final = "context.loaded"
CONTEXT_FETCHED: Final = "context.fetched"  # a page or repository fetched for the context, before staging
LM_CALL: Final = "lm.call"
CODE_EXECUTED: Final = "code.executed"
SUBCALL_FINISHED: Final = "subcall.finished"
TOOL_CALLED: Final = "tool.called"  # a tool of an MCP server, or a registered Python function, called from the REPL
CHILD_STARTED: Final = "child.started"
CHILD_FINISHED: Final = "child.finished"
WARNING: Final = "warning"
# The root transcript was compacted before it passed the model's window (core/compaction.py).
HISTORY_COMPACTED: Final = "history.compacted"
# A replay met a call whose request changed, one the record has no reply for, or a host call that
# returned something else than recorded (core/tape.py, docs/replay.md).
REPLAY_DIVERGED: Final = "replay.diverged"
# An optimization is a run-like stream under its own id (a runs row of kind "optimize"): these
# kinds, then run.finished last, as for every run.
OPTIMIZE_STARTED: Final = "optimize.started"
OPTIMIZE_EVAL: Final = "optimize.eval"
OPTIMIZE_SCORED: Final = "optimize.scored"
OPTIMIZE_FINISHED: Final = "optimize.finished"
EventKind = Literal[
    "run.started",
    "run.finished",
    "context.loaded",
    "context.fetched",
    "lm.call",
    "code.executed",
    "subcall.finished",
    "tool.called",
    "child.started",
    "child.finished",
    "warning",
    "history.compacted",
    "replay.diverged",
    "optimize.started",
    "optimize.eval",
    "optimize.scored",
    "optimize.finished",
]
EVENT_KINDS: Final = frozenset(
    {RUN_STARTED, RUN_FINISHED, CONTEXT_LOADED, CONTEXT_FETCHED, LM_CALL, CODE_EXECUTED, SUBCALL_FINISHED,
     TOOL_CALLED, CHILD_STARTED, CHILD_FINISHED, WARNING, REPLAY_DIVERGED, OPTIMIZE_STARTED, OPTIMIZE_EVAL,
     OPTIMIZE_SCORED, OPTIMIZE_FINISHED, HISTORY_COMPACTED}
)


class Event(TypedDict):
    """The envelope. ``node`` is "root" or a child such as "root.2"; ``parent`` its parent node."""

    v: int
    run_id: str
    seq: int
    ts: float
    kind: str
    node: str
    parent: str | None
    depth: int
    data: dict[str, Any]


class Usage(TypedDict, total=False):
    """Tokens and cost of one model call (every field may be missing when the provider is silent)."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    cost: float | None
    latency: float
    replayed: bool  # answered from a run's record (a replay, a fork's first steps): no model was called
    cached_tokens: int  # of prompt_tokens, read from the provider's prompt cache (only when it reported a cache)
    cache_write_tokens: int  # of prompt_tokens, written to it (Anthropic; only when some were)
    saved: float  # USD the cache saved against the input rate (negative: a write's premium), LiteLLM's rates


class Lineage(TypedDict):
    """Where a replay or a fork comes from."""

    kind: Literal["replay", "fork"]
    source: str  # the run it replays or forks
    at: str | None  # a fork's step, "NODE:STEP" ("root:3")


class _RunOpening(TypedDict):
    question: str  # capped at 2,000 characters
    limits: dict[str, Any]
    session_id: str | None


class RunStartedData(_RunOpening, total=False):
    lineage: Lineage  # a replay's or a fork's only


class RunFinishedData(TypedDict):
    """Always the last event of a run."""

    status: RunStatus
    answer: str | None
    stop_reason: str | None
    error: str | None
    usage: dict[str, Any]  # {"total": {...}, "by_model": {model: {...}}, "reply_forms": {form: count}}
    iterations: int
    llm_calls: int
    seconds: float


class ContextLoadedData(TypedDict):
    chars: int
    sources: int
    skipped: list[str]
    report: str
    documents: int  # converted to text (PDF, DOCX, ...)
    pages: int  # of the PDFs among them
    images: int
    cached: int  # documents whose text came from the conversion cache
    skipped_count: int  # ``skipped`` holds the first 50


class _ContextFetched(TypedDict):
    url: str  # as the request named it
    kind: Literal["page", "repo"]
    name: str  # its name in ``sources`` (a repository's files are NAME/PATH)
    bytes: int  # the page's body; the repository's files
    seconds: float


class ContextFetchedData(_ContextFetched, total=False):
    status: int  # a page's HTTP status
    content_type: str  # a page's
    final_url: str  # a page's, after redirects
    ref: str | None  # a repository's branch or tag (None: its default branch)
    files: int  # a repository's files in its work tree


# How a root-model reply was written (``core.replies``); "unreadable" ones are only counted.
ReplyForm = Literal["fields", "fields_unclosed", "json", "xml", "prose_code", "plain_text"]


class LmCallData(Usage):
    """One root-model step (``predictor`` "act") or the final extraction ("extract")."""

    step: int
    predictor: Literal["act", "extract"]
    reasoning: str
    reply_form: ReplyForm | None  # None: a predictor that reports no form (an optimizer's wrapper)


class CodeExecutedData(TypedDict, total=False):
    step: int
    code: str
    output: str  # what the model saw (capped head+tail)
    output_chars: int
    error: str | None
    error_kind: str | None
    duration: float
    submitted: bool


class SubcallFinishedData(Usage, total=False):
    """One ``llm_query`` (``batch`` set when it was part of ``llm_query_batched``)."""

    prompt_preview: str
    prompt_chars: int
    response_preview: str
    response_chars: int
    error: str | None
    batch: dict[str, int]  # {"id", "index", "size"}
    images: int  # image parts the call sent (llm_query(images=...)); never their pixels
    image_bytes: int  # their bytes together
    model_name: str  # the configured model that answered: "sub", or a name of settings.models (model=NAME)


class ToolCalledData(TypedDict, total=False):
    """One tool call from the REPL (core/tools.py): sizes and time, never the arguments or result themselves."""

    server: str  # the configured MCP server, or "python" for a registered function
    tool: str  # the tool's name at its server, or "module:function"
    arg_chars: int  # the arguments, as JSON characters
    result_chars: int
    seconds: float
    error: str | None
    replayed: bool  # answered from the run's record (a replay, a fork's first steps): no tool was called


class ChildStartedData(TypedDict):
    query_preview: str
    query_chars: int
    context_chars: int


class ChildFinishedData(TypedDict):
    status: str
    answer_preview: str
    iterations: int
    stop_reason: str | None
    error: str | None
    seconds: float


class WarningData(TypedDict):
    message: str


class HistoryCompactedData(Usage, total=False):
    """Steps folded into one summary before the transcript passed the root model's window; the summary
    call's usage. The REPL's ``history`` and the trace keep every step."""

    step: int  # the step whose model call comes next
    steps_folded: int  # steps newly folded by this compaction
    through: int  # the summary covers steps 1..through
    chars_before: int  # the transcript's length before and after
    chars_after: int
    summary_chars: int
    window: int  # the root model's window, tokens


class ReplayDivergedData(TypedDict):
    """Where a replay left its record: the call's position (core/tape.py) and why."""

    slot: str  # "root#3/act", "root#2/sub0", "root#2>root.1#1/act", "root#0/inputs"
    step: int
    reason: Literal["prompt", "missing", "host", "inputs"]
    detail: str


class OptimizeStartedData(TypedDict):
    """An optimization began: what it works on, and the estimate shown before it started."""

    dataset: str
    optimizer: str
    metric: str
    base_version: str | None
    train: int  # rows
    holdout: int
    estimate: dict[str, Any]  # {"evaluations", "llm_calls", "cost" (None: prices unknown)}
    resumed_from: str | None


class OptimizeEvalData(TypedDict):
    """One replay of a dataset row by one candidate program (``cached``: skipped, already evaluated)."""

    trial: int  # the candidate's number, in the order candidates were first evaluated
    candidate: str  # a short hash of the candidate's instructions and demos
    example: str  # a short hash of the row's inputs
    score: float
    feedback: str
    run_id: str | None
    cached: bool
    evaluations: int  # evaluations so far, cached ones included
    llm_calls: int  # model calls of the replays so far


class OptimizeScoredData(TypedDict):
    """A full score of a program on a split: before (the base program) or after (the candidate)."""

    split: Literal["train", "holdout"]
    program: Literal["before", "after"]
    score: float
    n: int


class OptimizeFinishedData(TypedDict):
    """The optimization's outcome, just before its run.finished."""

    status: RunStatus
    version_id: str | None
    scores: dict[str, float | None]  # train_before, train_after, holdout_before, holdout_after
    gate: dict[str, Any]  # {"passed": bool, "reason": str}
    error: str | None


PAYLOADS: Final[dict[str, type]] = {
    RUN_STARTED: RunStartedData,
    RUN_FINISHED: RunFinishedData,
    CONTEXT_LOADED: ContextLoadedData,
    CONTEXT_FETCHED: ContextFetchedData,
    LM_CALL: LmCallData,
    CODE_EXECUTED: CodeExecutedData,
    SUBCALL_FINISHED: SubcallFinishedData,
    TOOL_CALLED: ToolCalledData,
    CHILD_STARTED: ChildStartedData,
    CHILD_FINISHED: ChildFinishedData,
    WARNING: WarningData,
    HISTORY_COMPACTED: HistoryCompactedData,
    REPLAY_DIVERGED: ReplayDivergedData,
    OPTIMIZE_STARTED: OptimizeStartedData,
    OPTIMIZE_EVAL: OptimizeEvalData,
    OPTIMIZE_SCORED: OptimizeScoredData,
    OPTIMIZE_FINISHED: OptimizeFinishedData,
}

# -- requests and results ---------------------------------------------------------------------

MAX_CONTEXT_URLS: Final = 20  # pages one run fetches
MAX_URL_CHARS: Final = 2000
# A branch or tag name git accepts and no option can hide in: a letter or digit first, no "..".
GIT_REF: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")


def check_fetch_url(url: object, what: str = "URL") -> str:
    """``url`` if it is a plain http(s) URL with a host and no user name or password, else the
    UserError every face gives. Only its form: whether its host may be fetched is the fetch policy's
    (``core.inputs.fetch``), where names are resolved."""
    if not isinstance(url, str) or not url.strip():
        raise UserError(f"{what} is empty: give an http:// or https:// URL")
    shown = url if len(url) <= 80 else url[:80] + "…"
    if len(url) > MAX_URL_CHARS or any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise UserError(f"{what} '{shown}' is not a URL (too long, or with spaces or control characters)")
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port out of range or not a number raises here
    except ValueError:
        raise UserError(f"{what} '{shown}' is not a URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise UserError(f"{what} '{shown}': only http:// and https:// URLs can be fetched")
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise UserError(f"{what} '{shown}' has no host, or carries a user name or password: give a plain URL")
    return url


def check_git_ref(ref: str) -> str:
    if not isinstance(ref, str) or not GIT_REF.fullmatch(ref) or ".." in ref:
        raise UserError(f"repository ref {str(ref)[:80]!r} is not a branch or tag name")
    return ref


def split_repo(spec: str) -> tuple[str, str | None]:
    """``URL[@REF]`` (the CLI's ``--repo``) as (url, ref): an ``@`` after the host starts the ref."""
    parts = urlsplit(spec)
    if "@" in parts.path:
        url, _, ref = spec.rpartition("@")
        return url, ref or None
    return spec, None


@dataclass
class RunRequest:
    """What a face asks for. Limits left as None take the settings' values; the rest are checked against
    their one declaration (``fleet_rlm.limits``), so every face refuses a bad one with the same sentence.

    Construction checks what can be checked without the settings or the file system, so a bad
    request never becomes a recorded run."""

    question: str
    context_paths: list[str] = field(default_factory=list)
    context_text: list[str] = field(default_factory=list)
    session_id: str | None = None
    volume: str | None = None
    max_iters: int | None = None
    max_depth: int | None = None
    max_llm_calls: int | None = None
    max_seconds: float | None = None
    max_cost: float | None = None
    max_tokens: int | None = None
    include_hidden: bool = False  # hidden and ignored files of context folders
    context_urls: list[str] = field(default_factory=list)  # web pages, fetched as text before staging
    repo_url: str | None = None  # a git repository, cloned shallowly and staged like a folder
    repo_ref: str | None = None  # its branch or tag; None: the default branch
    mcp_servers: list[str] = field(default_factory=list)  # configured MCP servers whose tools the REPL gets
    tools: list[str] = field(default_factory=list)  # Python functions ("module:function") the REPL gets (the CLI)
    allow_tools: list[str] = field(default_factory=list)  # "server.tool" (or "server.*") that may change things

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise UserError("the question is empty: say what you want to know")
        check_limits({name: getattr(self, name) for name in LIMITS})
        if len(self.context_urls) > MAX_CONTEXT_URLS:
            raise UserError(f"{len(self.context_urls)} context URLs: a run fetches at most {MAX_CONTEXT_URLS}")
        for url in self.context_urls:
            check_fetch_url(url, "context URL")
        if self.repo_url is not None:
            check_fetch_url(self.repo_url, "repository URL")
        if self.repo_ref is not None:
            if self.repo_url is None:
                raise UserError("a repository ref without a repository: give repo_url too")
            check_git_ref(self.repo_ref)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["context_text"] = [f"({len(t):,} chars)" for t in self.context_text]  # keep rows small
        return data


@dataclass
class RunResult:
    run_id: str
    status: RunStatus
    answer: str | None
    iterations: int
    llm_calls: int
    usage: dict[str, Any]
    seconds: float
    stop_reason: str | None = None
    error: str | None = None
    session_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the step loop's view of a node ---------------------------------------------------------------


class StepOutcome(Protocol):
    shown: str  # what the model sees of the step
    final: str | None  # the submitted answer, if the step submitted one


class NodeHost(Protocol):
    """What the step loop (core/program.py) needs from one RLM node; core/node.py implements it.

    Defined here so the loop depends on this contract, not on the node module (no import circle)."""

    max_iters: int
    budget: Any  # core.budget.Budget: reserve(n), check()

    def query_preview(self) -> str: ...

    def opening_observation(self) -> str: ...

    def status_line(self, step: int) -> str: ...

    def warn(self, message: str) -> None: ...

    async def predict(self, predictor: Any, *, step: int, final: bool = False, **inputs: Any) -> Any: ...

    async def execute(self, reply: str, *, step: int) -> StepOutcome: ...

    def over_window(self, transcript: str) -> bool: ...

    async def compact(
        self, transcript: str, *, step: int, opening: str, shown_steps: list[str], folded: int, summary: str
    ) -> tuple[str, str] | None: ...
