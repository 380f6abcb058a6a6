"""The agent's tools: each calls the Engine or the workspace (never a face), built per turn over a
``TurnContext`` (the conversation, the turn, and where live events go).

Read-only tools run at once. Tools with side effects or network access are ``always_require``: the turn
pauses for an approval before they run (``approvals``). Errors written for people come back to the model
as the tool's result, so it can say what went wrong.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any

from agent_framework import FunctionTool, tool
from pydantic import Field

from fleet_rlm.core import operations
from fleet_rlm.errors import FleetError, NotFound, TooLarge, UserError
from fleet_rlm.limits import MAX_COST
from fleet_rlm.volumes import Expect, VolumeChanged, parse_volume_ref

if TYPE_CHECKING:
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.store import Conversation

Emit = Callable[[dict[str, Any]], None]
READ_CHARS = 20_000  # of a volume file per call: the model reads big files with an RLM run instead
TRACE_CHARS = 12_000
MEMORY_MAX_BYTES = 1024 * 1024
PROGRESS_SECONDS = 0.5
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MCP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
# The file an approved write_memory call may replace, as its approval card showed it (none: a new file only):
# set by the approval gate around the call it runs (approvals.ApprovalGate); None, no condition.
SHOWN_FILE: ContextVar[Expect | None] = ContextVar("fleet_shown_file", default=None)


@dataclass
class TurnContext:
    engine: Engine
    conversation: Conversation
    turn_id: str
    emit: Emit
    runs: list[str] = field(default_factory=list)

    @property
    def store(self) -> Any:
        return self.engine.workspace.store

    def volume(self, given: str | None) -> str:
        return volume_name(self.engine, self.conversation.volume, given)


def volume_name(engine: Engine, default: str, given: str | None) -> str:
    """The volume a call writes to: the one it names, else the conversation's (checked)."""
    name = given or default
    engine.workspace.check_volume_name(name)
    return name


def memory_target(path: str) -> str:
    """The volume path a write_memory call writes: ``path`` under memory/, a leading 'memory/' not doubled,
    in the form the volume resolves it to. The approval card names the file through this too."""
    rel = "/".join(p for p in path.strip().replace("\\", "/").split("/") if p not in ("", "."))
    return "memory/" + (rel.removeprefix("memory/") if rel != "memory" else "")


def repo_folder(url: str, name: str | None) -> str:
    """The folder under buffers/ a repository is copied to (the approval card names it through this too)."""
    return buffer_name(name or url.rstrip("/").removesuffix(".git"), "")


def _friendly(fn: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
    """A FleetError becomes the tool's result, so the model reads what went wrong and the fix."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> str:
        try:
            return await fn(*args, **kwargs)
        except VolumeChanged:  # a file write whose card no longer holds: the gate refuses it and audits that
            raise
        except FleetError as exc:
            return f"Error: {exc.message}"

    return call


def _dump(value: Any, limit: int) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def build_tools(tc: TurnContext) -> list[FunctionTool]:
    """Every tool of the agent, bound to this turn."""
    engine, ws = tc.engine, tc.engine.workspace

    @tool(
        name="rlm_run",
        approval_mode="always_require",
        description="Answer a question over large inputs with a recursive language model (RLM): it reads the "
        "conversation's attached files (documents and images too), the volume paths, web pages and repository "
        "you give in a sandboxed Python REPL and returns one answer. Use it whenever the answer depends on file "
        "contents. Runs of one conversation share a REPL. Runs without a cost cap, or with one above the user's "
        "threshold, wait for the user's approval.",
    )
    @_friendly
    async def rlm_run(
        question: Annotated[str, Field(description="The question, stated fully: the run sees nothing of this chat.")],
        volume_paths: Annotated[
            list[str] | None, Field(description="Extra inputs: 'vol:NAME/PATH' references.")
        ] = None,
        include_attachments: Annotated[bool, Field(description="Read the files attached to this conversation.")] = True,
        context_text: Annotated[str | None, Field(description="Text to work over that is in no file.")] = None,
        urls: Annotated[
            list[str] | None, Field(description="Public web pages (http/https) to fetch and read, PDFs too.")
        ] = None,
        repo_url: Annotated[str | None, Field(description="A public git repository to clone and read.")] = None,
        repo_ref: Annotated[str | None, Field(description="The repository's branch or tag (default branch).")] = None,
        max_cost: Annotated[float | None, MAX_COST] = None,  # checked by RunRequest, as on every face
    ) -> str:
        from fleet_rlm.core import uploads
        from fleet_rlm.types import RunRequest

        paths = list(volume_paths or [])
        bad = [p for p in paths if parse_volume_ref(p) is None]
        if bad:
            raise UserError(f"only volume paths ('vol:NAME/PATH') can be read, not {', '.join(bad)}")
        upload_ids = (
            [a.upload_id for a in tc.store.agent.attachments(tc.conversation.id)] if include_attachments else []
        )
        if not paths and not upload_ids and not context_text and not urls and not repo_url:
            raise UserError("nothing to read: attach a file, give volume_paths, urls or repo_url, or pass context_text")
        request = RunRequest(
            question,
            context_paths=paths,
            context_text=[context_text] if context_text else [],
            context_urls=list(urls or []),
            repo_url=repo_url,
            repo_ref=repo_ref,
            session_id=tc.conversation.session_id,
            max_cost=max_cost,
        )
        run_id = await uploads.start_run(engine, request, upload_ids)
        result = await _in_turn(tc, run_id)
        return json.dumps(
            {
                "run_id": run_id,
                "status": result.status,
                "answer": result.answer,
                "error": result.error,
                "stop_reason": result.stop_reason,
            },
            ensure_ascii=False,
        )

    @tool(
        name="replay_run",
        description="Run a finished RLM run again on the current code, every model call answered from its record "
        "(no model calls, no cost; volumes read-only). Says per step whether code, output and the model's request "
        "match the record, and the first step where they part and why.",
    )
    @_friendly
    async def replay_run(run_id: Annotated[str, Field(description="The run to replay.")]) -> str:
        replay_id = await engine.replay(run_id)
        await _in_turn(tc, replay_id)
        return _dump(ws.replay_report(replay_id).model_dump(mode="json"), TRACE_CHARS)

    @tool(
        name="fork_run",
        approval_mode="always_require",
        description="A new RLM run from a finished one: its steps before `at` replayed from the record (no model "
        "calls), then at that step run `code`, or ask the model with `instruction` added, and go on live (model "
        "calls and cost from there). Waits for the user's approval.",
    )
    @_friendly
    async def fork_run(
        run_id: Annotated[str, Field(description="The run to fork.")],
        at: Annotated[str, Field(description="The step to branch at: '3', or 'NODE:STEP' in a child ('root.1:2').")],
        code: Annotated[
            str | None, Field(description="Python to run at that step instead of asking the model.")
        ] = None,
        instruction: Annotated[str | None, Field(description="Added before the model is asked at that step.")] = None,
    ) -> str:
        fork_id = await engine.fork(run_id, at, code=code, instruction=instruction)
        result = await _in_turn(tc, fork_id)
        return json.dumps({"run_id": fork_id, "forked_from": run_id, "at": at, "status": result.status,
                           "answer": result.answer, "error": result.error}, ensure_ascii=False)  # fmt: skip

    @tool(name="list_runs", description="Recent RLM runs, newest first: id, status, question and answer previews.")
    @_friendly
    async def list_runs(limit: Annotated[int, Field(ge=1, le=50, description="How many runs.")] = 10) -> str:
        return _dump(ws.list_runs(limit=limit).model_dump(mode="json"), TRACE_CHARS)

    @tool(
        name="inspect_trace",
        description="How a run found its answer: its steps (code, output, sub-queries) page by page, or one step "
        "in full.",
    )
    @_friendly
    async def inspect_trace(
        run_id: Annotated[str, Field(description="A run id.")],
        step: Annotated[int | None, Field(description="One step in full (1-based); unset: the list.")] = None,
    ) -> str:
        view = ws.trace_page(run_id, step=step, detail="full" if step else "summary")
        return _dump(view.model_dump(mode="json"), TRACE_CHARS)

    @tool(
        name="read_volume_file",
        description="Read a text file of a volume (memory/ notes, buffers/ pulled-in context, artifacts/ results). "
        f"Returns up to {READ_CHARS} characters from offset; for big files ask rlm_run instead.",
    )
    @_friendly
    async def read_volume_file(
        path: Annotated[str, Field(description="Path inside the volume, e.g. 'memory/notes.md'.")],
        volume: Annotated[str | None, Field(description="Volume name; unset: the conversation's volume.")] = None,
        offset: Annotated[int, Field(ge=0, description="Byte offset to start at.")] = 0,
    ) -> str:
        name = tc.volume(volume)
        if not path.strip("/"):
            return _dump(ws.files(name, "", recursive=True, limit=200).model_dump(mode="json"), TRACE_CHARS)
        view = ws.text(name, path, offset=offset, length=READ_CHARS)
        return _dump(view.model_dump(mode="json"), READ_CHARS + 2000)

    @tool(
        name="write_memory",
        approval_mode="always_require",
        description="Write (or append to) a note in the memory/ folder of a volume, kept across conversations. "
        "Waits for the user's approval.",
    )
    @_friendly
    async def write_memory(
        path: Annotated[str, Field(description="Path under memory/, e.g. 'project.md'.")],
        text: Annotated[str, Field(description="The text to write.")],
        append: Annotated[bool, Field(description="Append instead of replacing the file.")] = False,
        volume: Annotated[str | None, Field(description="Volume name; unset: the conversation's volume.")] = None,
    ) -> str:
        name = tc.volume(volume)
        rel = memory_target(path)
        data = text.encode()
        expect = SHOWN_FILE.get()  # the file the card showed: the write happens only over that one
        too_long = UserError(f"a memory note is limited to {MEMORY_MAX_BYTES // 1024} KB: write a shorter one")
        if append:
            try:
                data = await asyncio.to_thread(engine.workspace.file_bytes, name, rel, MEMORY_MAX_BYTES) + data
            except NotFound:  # a new file: nothing to append to
                pass
            except TooLarge:
                raise too_long from None
        if len(data) > MEMORY_MAX_BYTES:
            raise too_long
        write = functools.partial(engine.workspace.write_file, roots=("memory",), expect=expect)
        entry = await asyncio.to_thread(write, name, rel, data)
        return f"wrote {entry.size} bytes to vol:{name}/{rel}"

    @tool(
        name="add_context_from_url",
        approval_mode="always_require",
        description="Fetch a public web page as text into buffers/ of a volume, to read it with rlm_run "
        "('vol:NAME/buffers/...'). Waits for the user's approval.",
    )
    @_friendly
    async def add_context_from_url(
        url: Annotated[str, Field(description="An http(s) URL.")],
        name: Annotated[str | None, Field(description="File name under buffers/; unset: from the URL.")] = None,
        volume: Annotated[str | None, Field(description="Volume name; unset: the conversation's volume.")] = None,
    ) -> str:
        from fleet_rlm.agent.fetch import fetch_text

        vol = tc.volume(volume)
        text, final = await fetch_text(url, engine.settings)
        file = buffer_name(name or final, ".txt")
        entry = await asyncio.to_thread(engine.workspace.write_file, vol, f"buffers/{file}", text, roots=("buffers",))
        return f"saved {entry.size} bytes of text from {final} as vol:{vol}/buffers/{file}"

    @tool(
        name="add_context_from_repo",
        approval_mode="always_require",
        description="Clone a git repository (http/https) at a branch or tag into buffers/ of a volume, to read it "
        "with rlm_run ('vol:NAME/buffers/NAME/'). Size-limited, no submodules. Waits for the user's approval.",
    )
    @_friendly
    async def add_context_from_repo(
        url: Annotated[str, Field(description="The repository URL, http(s).")],
        ref: Annotated[str | None, Field(description="Branch or tag; unset: the default branch.")] = None,
        name: Annotated[str | None, Field(description="Folder name under buffers/; unset: from the URL.")] = None,
        volume: Annotated[str | None, Field(description="Volume name; unset: the conversation's volume.")] = None,
    ) -> str:
        from fleet_rlm.agent.repo import add_repo

        vol = tc.volume(volume)
        folder = repo_folder(url, name)
        copied = await add_repo(url, ref, engine.settings, engine.workspace, vol, f"buffers/{folder}")
        skipped = f"; skipped {len(copied.skipped)} (links, special files or past the limit)" if copied.skipped else ""
        return f"copied {copied.files} files ({copied.bytes} bytes) to vol:{vol}/buffers/{folder}/{skipped}"

    @tool(
        name="add_mcp_server",
        approval_mode="always_require",
        description="Add one of the user's MCP servers (a local command speaking MCP over stdio) as tools for "
        "the rest of this conversation. The user sees the exact command and must approve it.",
    )
    @_friendly
    async def add_mcp_server(
        name: Annotated[str, Field(description="A short name: letters, digits, '_' or '-'.")],
        command: Annotated[str, Field(description="The program to run.")],
        args: Annotated[list[str] | None, Field(description="Its arguments.")] = None,
    ) -> str:
        if not MCP_NAME.fullmatch(name):
            raise UserError(f"MCP server name {name!r}: use letters, digits, '_' or '-', starting with a letter")
        servers = [s for s in tc.conversation.mcp_servers or [] if s["name"] != name]
        servers.append({"name": name, "command": command, "args": list(args or []), "added_at": time.time()})
        await tc.store.write(tc.store.agent.set_mcp_servers, tc.conversation.id, servers)
        tc.conversation = replace(tc.conversation, mcp_servers=servers)
        # This turn's tool list is fixed when it starts: the servers are opened at the start of the next one.
        return f"added MCP server '{name}': its tools are yours from the user's next message on, not in this reply"

    return [
        rlm_run,
        replay_run,
        fork_run,
        list_runs,
        inspect_trace,
        read_volume_file,
        write_memory,
        add_context_from_url,
        add_context_from_repo,
        add_mcp_server,
    ]


def buffer_name(source: str, suffix: str) -> str:
    """A safe single file or folder name from a URL or a given name."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", source.split("://")[-1].split("?")[0].strip("/")).strip("-.")[-60:]
    base = base.lstrip("-.") or "page"
    return base if not suffix or base.endswith(suffix) else base + suffix


async def _in_turn(tc: TurnContext, run_id: str) -> Any:
    """Follow a run the turn started to its end, linked to the conversation, its progress in the chat; a
    stopped turn stops its run."""
    engine = tc.engine
    tc.runs.append(run_id)
    await tc.store.write(tc.store.agent.link_run, tc.conversation.id, run_id, tc.turn_id)
    tc.emit({"kind": "run.started", "run_id": run_id})

    async def progress(_events: int, line: str) -> None:
        tc.emit({"kind": "run.progress", "run_id": run_id, "message": line})

    # A stopped turn stops its run.
    result = await operations.follow_to_end(engine, run_id, progress, interval=PROGRESS_SECONDS)
    tc.emit({"kind": "run.finished", "run_id": run_id, "status": result.status})
    return result
