"""completion/complete offers run ids, session ids, volume names and paths, in both eras."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.types import INVALID_PARAMS, PromptReference, ResourceTemplateReference

from mcp import Client, MCPError
from tests.support.oracle_lm import OracleLM
from tests.support.workloads import write_haystack

pytestmark = pytest.mark.anyio

RUN = ResourceTemplateReference(uri="fleet://runs/{run_id}")
TRACE = ResourceTemplateReference(uri="fleet://runs/{run_id}/trace")
FILE = ResourceTemplateReference(uri="fleet://volumes/{volume}/{+path}")


async def values(client: Client, ref: object, name: str, value: str, **known: str) -> list[str]:
    result = await client.complete(ref, {"name": name, "value": value}, known or None)  # type: ignore[arg-type]
    return result.completion.values


async def test_capability_is_advertised(client: Client) -> None:
    assert client.server_capabilities is not None and client.server_capabilities.completions is not None


async def test_run_and_session_ids(client: Client, needle: OracleLM, tmp_path: Path) -> None:
    hay = write_haystack(tmp_path / "hay.txt", 150_000, "OWL4")
    question = {"question": "What is the secret code?", "context_paths": [str(hay)]}
    first = (await client.call_tool("run", {**question, "session_id": "incident-1"})).structured_content
    second = (await client.call_tool("run", question)).structured_content
    ids = [second["run_id"], first["run_id"]]  # type: ignore[index]  # newest first
    assert await values(client, RUN, "run_id", "") == ids
    assert await values(client, TRACE, "run_id", first["run_id"][:-1]) == [first["run_id"]]  # type: ignore[index]
    assert await values(client, RUN, "run_id", "zzz") == []
    follow_up = PromptReference(name="follow_up")
    assert await values(client, follow_up, "session_id", "inc") == ["incident-1"]
    assert await values(client, follow_up, "session_id", "other") == []
    assert await values(client, follow_up, "question", "") == []  # free text: nothing to offer


async def test_volume_names_and_paths(client: Client) -> None:
    for volume, path in [("notes", "memory/a.md"), ("notes", "artifacts/report.md"), ("logs", "memory/x.log")]:
        await client.call_tool("write_file", {"volume": volume, "path": path, "content": "text"})
    assert await values(client, FILE, "volume", "") == ["logs", "notes"]
    assert await values(client, FILE, "volume", "no") == ["notes"]
    # The path of the file template completes inside the volume chosen first.
    assert await values(client, FILE, "path", "", volume="notes") == ["artifacts/report.md", "memory/a.md"]
    assert await values(client, FILE, "path", "mem", volume="notes") == ["memory/a.md"]
    assert await values(client, FILE, "path", "", volume="missing") == []
    assert await values(client, FILE, "path", "") == []  # no volume yet

    # Prompt arguments that take paths complete volume references.
    document = PromptReference(name="analyze_document")
    assert await values(client, document, "path", "") == ["vol:logs/", "vol:notes/"]
    assert await values(client, document, "path", "vol:n") == ["vol:notes/"]
    assert await values(client, document, "path", "vol:notes/m") == ["vol:notes/memory/a.md"]
    cite = PromptReference(name="answer_with_citations")
    assert await values(client, cite, "paths", "/srv/a.md, vol:logs/") == ["/srv/a.md, vol:logs/memory/x.log"]


async def test_unknown_references_are_invalid_params(client: Client) -> None:
    with pytest.raises(MCPError) as prompt:
        await values(client, PromptReference(name="test_prompt_with_arguments"), "arg1", "par")
    assert prompt.value.error.code == INVALID_PARAMS
    assert "unknown prompt 'test_prompt_with_arguments'" in prompt.value.error.message
    with pytest.raises(MCPError) as template:
        await values(client, ResourceTemplateReference(uri="test://template/{id}"), "id", "")
    assert template.value.error.code == INVALID_PARAMS and "unknown resource template" in template.value.error.message
