"""``completion/complete``: what clients offer while a user fills in a prompt or a resource URI.

* run ids for ``fleet://runs/{run_id}`` and ``fleet://runs/{run_id}/trace`` (newest first);
* session ids for the ``follow_up`` prompt (most recently used first);
* volume names and file paths for ``fleet://volumes/{volume}/{+path}``;
* ``vol:<volume>/<path>`` references for prompt arguments that take paths (for ``paths``, the
  last of the comma- or newline-separated entries is completed and the others kept).

Values start with what the user typed, at most 100 per answer (``has_more`` says when there
are more). A prompt or template this server does not have is -32602; an argument nothing is
known for gets an empty list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.types import (
    INVALID_PARAMS,
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
)

from fleet_rlm.errors import UserError
from fleet_rlm.mcp.prompts import prompt_arguments
from mcp import MCPError

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.mcp.provider import EngineProvider

MAX_VALUES = 100  # the protocol's cap per answer
RUN_SCAN = 500  # newest runs looked at for run-id completion
PATH_ARGUMENTS = {"path", "paths"}
_LAST_ENTRY = re.compile(r"^(.*[,\n]\s*)?([^,\n]*)$", re.DOTALL)


def matching(candidates: Iterable[str], prefix: str) -> Completion:
    """The candidates that start with ``prefix``, in the given order, capped at MAX_VALUES."""
    found = list(dict.fromkeys(c for c in candidates if c.startswith(prefix)))
    return Completion(values=found[:MAX_VALUES], total=len(found), has_more=len(found) > MAX_VALUES)


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    async def engine() -> Engine | None:
        try:
            return await provider.get()
        except ValueError:  # broken settings: nothing to offer (tools and `doctor` say what to fix)
            return None

    @server.completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        known = (context.arguments if context else None) or {}
        if isinstance(ref, PromptReference):
            takes = await prompt_arguments(server, ref.name)
            if argument.name not in takes:
                return matching([], "")
        else:
            templates = {t.uri_template for t in await server.list_resource_templates()}
            if ref.uri not in templates:
                raise MCPError(INVALID_PARAMS, f"unknown resource template {ref.uri!r}: this server has "
                               f"{', '.join(sorted(templates))}")  # fmt: skip
        eng = await engine()
        if eng is None:
            return matching([], "")
        template = isinstance(ref, ResourceTemplateReference)
        # In a worker thread: listing a volume is network I/O with Daytona volumes.
        return await anyio.to_thread.run_sync(candidates, eng, argument, known, template)


def candidates(eng: Engine, argument: CompletionArgument, known: dict[str, str], template: bool) -> Completion:
    """Completions for one argument of a resource template (``template``) or a prompt."""
    name, value = argument.name, argument.value
    if name == "run_id":
        return matching((r.id for r in eng.list_runs(limit=RUN_SCAN)), value)
    if name == "session_id":
        return matching((s.id for s in eng.workspace.list_sessions().sessions), value)
    if name == "volume":
        return matching(volume_names(eng), value)
    if template and name == "path":  # the volume-file template: files of the volume chosen before
        return matching(volume_files(eng, known["volume"]) if "volume" in known else [], value)
    if name in PATH_ARGUMENTS:  # a prompt argument: volume references
        head, last = _LAST_ENTRY.match(value).groups()  # type: ignore[union-attr]  # matches any string
        head = head or ""
        done = matching(volume_refs(eng, last), last)
        return Completion(values=[head + v for v in done.values], total=done.total, has_more=done.has_more)
    return matching([], "")


def volume_names(eng: Engine) -> list[str]:
    return [v.name for v in eng.workspace.volume_list().volumes]


def volume_files(eng: Engine, volume: str) -> list[str]:
    try:
        listing = eng.workspace.files(volume, "", recursive=True, limit=None)
    except UserError:  # no such volume, or a bad name: nothing to offer
        return []
    return [e.path for e in listing.entries if e.type == "file"]


def volume_refs(eng: Engine, typed: str) -> list[str]:
    """``vol:<name>/`` for every volume; once a volume is named, ``vol:<name>/<file>`` for its files."""
    from fleet_rlm.volumes import parse_volume_ref, volume_uri

    named = parse_volume_ref(typed) if "/" in typed else None
    if named is None:
        return [f"{volume_uri(n)}/" for n in volume_names(eng)]
    return [volume_uri(named[0], path) for path in volume_files(eng, named[0])]
