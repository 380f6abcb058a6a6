"""Run limits are declared once (``fleet_rlm.limits``): the same bad limit is refused with the same
sentence by every face (Python API, CLI, MCP, web, the agent's rlm_run), each in its own error frame
("error: ", "Error executing tool run: ", a 400's message, "Error: "), and every face advertises the
same bounds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import UserError
from fleet_rlm.mcp.server import build_server
from fleet_rlm.types import RunRequest
from mcp import Client
from tests.web.conftest import api_client

BIN = Path(sys.executable).parent

# The documented bounds (docs/cli.md, docs/http-api.md, docs/mcp.md), as JSON Schema keywords.
BOUNDS = {
    "max_iters": {"minimum": 1, "maximum": 1000},
    "max_depth": {"minimum": 0, "maximum": 10},
    "max_llm_calls": {"minimum": 1, "maximum": 100_000},
    "max_seconds": {"exclusiveMinimum": 0, "maximum": 86_400},
    "max_cost": {"exclusiveMinimum": 0, "maximum": 10_000},
    "max_tokens": {"minimum": 1, "maximum": 1_000_000_000},
}

# One bad value per bound, and the one sentence every face answers it with.
INVALID = [
    ("max_iters", 0, "max_iters must be a whole number between 1 and 1000 (got 0)"),
    ("max_iters", 1001, "max_iters must be a whole number between 1 and 1000 (got 1001)"),
    ("max_depth", -1, "max_depth must be a whole number between 0 and 10 (got -1)"),
    ("max_depth", 11, "max_depth must be a whole number between 0 and 10 (got 11)"),
    ("max_llm_calls", 0, "max_llm_calls must be a whole number between 1 and 100000 (got 0)"),
    ("max_llm_calls", 100_001, "max_llm_calls must be a whole number between 1 and 100000 (got 100001)"),
    ("max_seconds", 0, "max_seconds must be more than 0 and at most 86400 (got 0)"),
    ("max_seconds", 86_401, "max_seconds must be more than 0 and at most 86400 (got 86401)"),
    ("max_cost", 0, "max_cost must be more than 0 and at most 10000 (got 0)"),
    ("max_cost", 10_001, "max_cost must be more than 0 and at most 10000 (got 10001)"),
    ("max_tokens", 0, "max_tokens must be a whole number between 1 and 1000000000 (got 0)"),
    ("max_tokens", 1_000_000_001, "max_tokens must be a whole number between 1 and 1000000000 (got 1000000001)"),
]

AGENT_LIMITS = {"max_cost"}  # the agent's model may cap a run's cost; the rest are the user's settings


def python_api(name: str, value: Any) -> str:
    with pytest.raises(UserError) as refused:
        RunRequest("q", context_text=["x"], **{name: value})
    return refused.value.message


def cli(name: str, value: Any) -> str:
    flag = "--" + name.replace("_", "-")
    done = subprocess.run(
        [str(BIN / "fleet-rlm"), "run", "q", "--text", "x", flag, str(value)],
        capture_output=True, text=True, env=dict(os.environ), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    return done.stderr.removeprefix("error: ").strip()


async def mcp(name: str, value: Any) -> str:
    async with Client(build_server()) as client:
        result = await client.call_tool("run", {"question": "q", "context_text": "x", name: value})
    assert result.is_error, result.content
    text: str = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("Error executing tool run: "), text  # the MCP library's frame of every tool error
    return text.removeprefix("Error executing tool run: ")


async def web(name: str, value: Any) -> str:
    async with api_client() as client:
        response = await client.post("/api/runs", json={"question": "q", "context_text": ["x"], name: value})
    assert response.status_code == 400, response.text
    return response.json()["message"]


async def agent(name: str, value: Any) -> str:
    from fleet_rlm.agent.tools import TurnContext, build_tools
    from fleet_rlm.store import Conversation

    async with Engine() as engine:
        conversation = Conversation(
            id="c-limits",
            title="limits",
            session_id="chat-c-limits",
            volume="workspace",
            grants=[],
            mcp_servers=[],
            created_at=0.0,
            updated_at=0.0,
        )
        tools = {t.name: t for t in build_tools(TurnContext(engine, conversation, "t-limits", lambda _e: None))}
        arguments = {"question": "q", "context_text": "x", "include_attachments": False, name: value}
        reply = await tools["rlm_run"].invoke(arguments=arguments, skip_parsing=True)
        assert engine.workspace.list_runs().runs == []  # refused before a run was recorded
    assert str(reply).startswith("Error: "), reply
    return str(reply).removeprefix("Error: ")


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "value", "message"), INVALID)
async def test_a_bad_limit_gets_the_same_message_on_every_face(
    fleet_env: dict[str, str], name: str, value: Any, message: str
) -> None:
    answers = {"python": python_api(name, value), "cli": cli(name, value), "mcp": await mcp(name, value),
               "web": await web(name, value)}  # fmt: skip
    if name in AGENT_LIMITS:
        answers["agent"] = await agent(name, value)
    assert answers == dict.fromkeys(answers, message)


@pytest.mark.parametrize(
    ("value", "shown"), [(float("nan"), "nan"), (True, "True"), ("3", "'3'"), (2.5, "2.5"), (float("inf"), "inf")]
)
def test_the_python_api_refuses_what_no_wire_format_can_send(value: Any, shown: str) -> None:
    assert python_api("max_iters", value) == f"max_iters must be a whole number between 1 and 1000 (got {shown})"


def test_the_bounds_themselves_are_allowed() -> None:
    RunRequest("q", max_iters=1000, max_depth=0, max_llm_calls=100_000, max_seconds=86_400, max_cost=10_000,
               max_tokens=1_000_000_000)  # fmt: skip
    RunRequest("q", max_iters=1, max_depth=10, max_llm_calls=1, max_seconds=0.001, max_cost=0.001, max_tokens=1)


def advertised(prop: dict[str, Any]) -> dict[str, Any]:
    """The bounds a JSON Schema property states for its number branch (``anyOf`` with null, or bare)."""
    number = next(b for b in prop.get("anyOf", [prop]) if b.get("type") in ("integer", "number"))
    return {k: v for k, v in number.items() if k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")}


def limit_properties(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: advertised(v) for k, v in schema["properties"].items() if k in BOUNDS}


def test_the_declaration_states_the_documented_bounds() -> None:
    from fleet_rlm.limits import LIMITS

    assert {name: limit.json_schema_bounds() for name, limit in LIMITS.items()} == BOUNDS


@pytest.mark.anyio
async def test_every_face_advertises_the_declared_bounds(fleet_env: dict[str, str]) -> None:
    from fleet_rlm.config import Settings

    async with Client(build_server()) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    assert limit_properties(tools["run"]) == BOUNDS
    assert limit_properties(tools["start_run"]) == BOUNDS
    assert limit_properties(tools["fork_run"]) == {"max_iters": BOUNDS["max_iters"]}

    async with api_client() as web_client:
        openapi = (await web_client.get("/openapi.json")).json()
    assert limit_properties(openapi["components"]["schemas"]["RunStart"]) == BOUNDS

    assert limit_properties(Settings.model_json_schema()) == BOUNDS

    shown = subprocess.run([str(BIN / "fleet-rlm"), "run", "--help"], capture_output=True, text=True, timeout=120)
    help_text = " ".join(shown.stdout.split())  # argparse wraps lines wherever it likes
    for name, _value, message in INVALID:
        span = message.split(" must be ")[1].split(" (got ")[0]
        assert f"--{name.replace('_', '-')}" in help_text and span in help_text, (name, span)
