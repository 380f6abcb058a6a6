"""The agent's chat client: the route a model takes, retries, and what a failed call tells the user."""

from __future__ import annotations

import sys

import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.agent.client import ModelChatClient, route_for
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.lm import build_lm
from fleet_rlm.errors import FleetError
from tests.agent.conftest import MEMORY, memory_file
from tests.agent.test_cli import agent_chat
from tests.support.agent_lm import AgentLM

pytestmark = pytest.mark.anyio

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def route_name(engine: Engine, model: str) -> str:
    engine.settings.agent_lm_model = model
    return type(route_for(build_lm(engine.settings, role="agent"), HELLO).engine).__name__


async def test_openai_compatible_models_take_the_native_route(engine: Engine) -> None:
    assert route_name(engine, "openai/agent") == "AsyncLM15Engine"
    assert route_name(engine, "hosted_vllm/agent") == "AsyncLM15Engine"


async def test_a_model_only_litellm_routes_still_streams_and_calls_tools(
    engine: Engine, agent_lm: AgentLM, agent_env: dict[str, str]
) -> None:
    # LM Studio's server speaks the OpenAI wire; the native route has no door for its prefix.
    assert route_name(engine, "lm_studio/agent") == "AsyncLiteLLMEngine"
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "please remember my favourite bird")
    assert paused.status == "paused" and paused.pending[0].tool == "write_memory"
    _, feed = await host.answer(paused.pending[0].id, True, actor="test")
    assert feed is not None and (await feed.outcome()).status == "done"
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY
    assert "litellm" in sys.modules and all(r.stream for r in agent_lm.requests)
    # A request neither route can carry is one sentence, like a failed call.
    client = ModelChatClient.from_settings(engine.settings)
    with pytest.raises(FleetError, match=r"the agent's model lm_studio/agent at .* failed: .*'weird'"):
        client._route({"messages": [{"role": "user", "content": [{"type": "weird"}]}]})


async def test_rate_limits_are_retried_with_the_configured_retries(engine: Engine, agent_lm: AgentLM) -> None:
    host = AgentHost.of(engine)
    engine.settings.lm_retries = 2
    agent_lm.fail_next(429, times=2)
    conv = await host.create_conversation()
    assert (await host.chat(conv.id, "remember it")).status == "paused"  # the third attempt answered
    assert len(agent_lm.requests) == 3
    engine.settings.lm_retries = 0
    agent_lm.fail_next(503)
    failed = await host.chat((await host.create_conversation()).id, "remember it")
    assert failed.status == "failed" and "the agent's model openai/agent" in (failed.error or ""), failed


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (401, "rejected the API key: set FLEET_AGENT_LM_API_KEY"),
        (404, "is not a model it serves: check FLEET_AGENT_LM_MODEL"),
        (429, "is rate limiting requests and retries ran out"),
    ],
)
async def test_a_refused_call_says_what_to_fix(engine: Engine, agent_lm: AgentLM, status: int, says: str) -> None:
    agent_lm.fail_next(status)
    host = AgentHost.of(engine)
    failed = await host.chat((await host.create_conversation()).id, "remember it")
    assert failed.status == "failed" and says in (failed.error or ""), failed
    assert "sk-test-agent" not in (failed.error or "")


@pytest.mark.slow
def test_the_terminal_agent_never_imports_litellm_for_an_openai_compatible_model(agent_env: dict[str, str]) -> None:
    """LiteLLM's import costs several CPU-seconds, more than the rest of the agent's start."""
    proc = agent_chat("remember my favourite bird\ny\n/quit\n", {**agent_env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0 and "wrote" in proc.stdout, proc.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "agent_framework" in imported and "dspy" in imported  # the profile covers the agent and the runtime
    assert not [name for name in imported if name.split(".")[0] == "litellm"]
