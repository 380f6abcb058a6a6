"""Request bodies, query strings and the small responses of the JSON API that are not views of
core (``fleet_rlm.core.views`` holds runs, traces and volumes). Their JSON Schemas are what
``/openapi.json`` publishes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet_rlm.core import views
from fleet_rlm.limits import MAX_COST, MAX_DEPTH, MAX_ITERS, MAX_LLM_CALLS, MAX_SECONDS, MAX_TOKENS
from fleet_rlm.types import RunStatus

ID = Field(min_length=1, max_length=200)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_OFFSET = 2**62  # SQLite integers and file offsets are 64-bit: a bigger one is a 400, not a crash

# -- runs ---------------------------------------------------------------------------------------


class RunsQuery(BaseModel):
    limit: int = Field(50, ge=1, le=500)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    status: RunStatus | None = None
    q: str | None = Field(None, max_length=1000, description="Only runs whose question contains this.")
    session_id: str | None = Field(None, max_length=200)


class DeleteRunsQuery(BaseModel):
    older_than_days: float = Field(gt=0, le=100_000, description="Delete finished runs created before this.")


class RunStart(Strict):
    question: str = Field(min_length=1, max_length=200_000)
    context_text: list[str] = Field(default_factory=list, description="Pasted text, one source each.")
    context_paths: list[str] = Field(
        default_factory=list, description="Host paths within FLEET_CONTEXT_ROOTS, or vol:NAME/PATH."
    )
    upload_ids: list[str] = Field(default_factory=list, description="Files sent before with POST /api/uploads.")
    context_urls: list[str] = Field(
        default_factory=list,
        description="Web pages (http/https, at most 20) fetched as text before the run: public addresses only, "
        "unless fetch_allowed_hosts allows a private one.",
    )
    repo_url: str | None = Field(None, description="A git repository (http/https), cloned shallowly as context.")
    repo_ref: str | None = Field(None, description="Its branch or tag; unset: the default branch.")
    session_id: str | None = Field(None, max_length=64, description="Continue in this session's REPL.")
    volume: str | None = Field(None, max_length=64, description="Mount only this volume (created if new).")
    mcp_servers: list[str] = Field(
        default_factory=list, description="Configured MCP servers whose tools the REPL gets (docs/tools.md)."
    )
    allow_tools: list[str] = Field(
        default_factory=list, description="Tools ('server.tool' or 'server.*') allowed although not read-only."
    )
    # The schema advertises each limit's declared bounds; RunRequest checks them (400 with the message every
    # face gives), not pydantic.
    max_iters: Annotated[int | None, MAX_ITERS] = None
    max_depth: Annotated[int | None, MAX_DEPTH] = None
    max_llm_calls: Annotated[int | None, MAX_LLM_CALLS] = None
    max_seconds: Annotated[float | None, MAX_SECONDS] = None
    max_cost: Annotated[float | None, MAX_COST] = None
    max_tokens: Annotated[int | None, MAX_TOKENS] = None
    include_hidden: bool = False


class RunStarted(BaseModel):
    run_id: str
    status: RunStatus


class PinIn(Strict):
    pinned: bool = Field(True, description="True keeps the run when retention deletes old runs; false lets it go.")


class ForkStart(Strict):
    """A fork of a finished run (docs/replay.md): its steps before ``at`` come from its record."""

    at: str = Field(min_length=1, max_length=200, description="The step to branch at: 3, or NODE:STEP (root.1:2).")
    code: str | None = Field(None, max_length=1_000_000, description="Python to run at that step, asking no model.")
    instruction: str | None = Field(
        None, max_length=20_000, description="Added to the transcript before the model is asked at that step."
    )
    max_iters: int | None = Field(None, ge=1, le=1000, description="Steps per node (default: the run's).")


class TraceQuery(BaseModel):
    node: str = Field("root", max_length=200)
    step: int | None = Field(None, ge=0)
    detail: Literal["summary", "full"] = "summary"
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    limit: int = Field(20, ge=1, le=500)


class TraceTree(BaseModel):
    """The whole run folded into a tree (``core.trace.build_trace``): steps and sub-calls carry ``ts``."""

    model_config = ConfigDict(extra="allow")
    run: dict[str, Any]
    root: str
    nodes: dict[str, dict[str, Any]]


class FeedbackIn(Strict):
    correct: bool
    expected: str | None = Field(None, max_length=200_000, description="The right answer, if the run's was wrong.")
    comment: str | None = Field(None, max_length=20_000)


class FeedbackList(BaseModel):
    feedback: list[views.Feedback]


class Deleted(BaseModel):
    deleted: int


class Upload(BaseModel):
    upload_id: str
    name: str
    size: int


class UploadList(BaseModel):
    uploads: list[Upload]


# -- sessions -----------------------------------------------------------------------------------


class SessionsQuery(BaseModel):
    include_closed: bool = False


class SessionCreate(Strict):
    name: str | None = Field(None, max_length=200)


class SessionCreated(BaseModel):
    id: str


# -- volumes ------------------------------------------------------------------------------------


class VolumeCreate(Strict):
    name: str = Field(min_length=1, max_length=64)


class VolumeCreated(BaseModel):
    name: str


class FilesQuery(BaseModel):
    path: str = Field("", max_length=4096)
    recursive: bool = False


class TextQuery(BaseModel):
    path: str = Field(min_length=1, max_length=4096)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    length: int = Field(65536, ge=1, le=8 * 1024 * 1024)


class PathQuery(BaseModel):
    path: str = Field(min_length=1, max_length=4096)


# -- settings and system ------------------------------------------------------------------------


class Setting(BaseModel):
    name: str
    env: str = Field(description="The environment variable that sets it (and overrides a saved value).")
    value: Any = Field(description="The value in effect; always null for secrets.")
    source: Literal["env", "keyring", "dotenv", "file", "default"]
    secret: bool
    set: bool
    overridden_by_env: bool = Field(description="A saved value exists but the environment variable wins.")
    withheld: str | None = Field(
        None, description="A model key that is not sent, because it is for another endpoint than its model's: why."
    )
    restart_only: str | None = Field(
        None, description="Set only from the environment or the CLI, then restart (a running server refuses it): why."
    )
    description: str


class SettingList(BaseModel):
    settings: list[Setting]


class Check(BaseModel):
    model_config = ConfigDict(extra="allow")
    ok: bool
    detail: str
    fix: str | None = None


class DiskUse(BaseModel):
    runs: int = Field(description="Bytes of the store (runs, events) and runs' scratch folders.")
    uploads: int
    volumes: int
    total: int = Field(description="Bytes of all of FLEET_HOME.")
    retention_days: int | None


class Sample(BaseModel):
    path: str | None = Field(description="The sample's folder, to give as a context path; null when this "
                             "installation has none or FLEET_CONTEXT_ROOTS keeps runs from reading it.")  # fmt: skip
    question: str = Field(description="A question to ask about it.")


class Health(BaseModel):
    status: Literal["ok"]


class Error(BaseModel):
    error: str = Field(description="A short kind: bad_request, unauthorized, not_found, conflict, too_large, ...")
    message: str = Field(description="What went wrong and how to fix it.")
    hint: Literal["settings"] | None = Field(
        None, description="Where the fix is made, when it is a setting: the web UI links to its Settings page."
    )
