"""Fixtures for the workspace agent: the scripted agent model beside the scripted RLM model, a fresh
FLEET_HOME, the fast in-process sandbox, and the agent's standard policies."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fleet_rlm.config import load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.uploads import UploadWriter
from tests.support import fake_sandbox
from tests.support.agent_lm import AgentLM, Call, Policy, Say
from tests.support.oracle_lm import PRICED, OracleLM
from tests.support.workloads import write_haystack

CODE = "KESTREL42"
MEMORY = "The user's favourite bird is the kestrel."

# The agent's scripted behaviour, one policy per kind of request the tests make.
POLICIES = [
    Policy(
        "what is the secret code",
        [
            Call("rlm_run", {"question": "Find the secret code in the attached file.", "max_cost": 0.5}),
            Say(lambda r: f"The secret code is {r.json.get('answer')} (run {r.json.get('run_id')})."),
        ],
    ),
    Policy(
        "remember",
        [
            Call("write_memory", {"path": "birds.md", "text": MEMORY}),
            Say(lambda r: f"Memory update result: {r.result}"),
        ],
    ),
    Policy(
        "uncapped",
        [
            Call("rlm_run", {"question": "Find the secret code in the attached file."}),
            Say(lambda r: f"Run result: {r.result}"),
        ],
    ),
]


@pytest.fixture
def agent_lm() -> Iterator[AgentLM]:
    with AgentLM(*POLICIES) as lm:
        yield lm


@pytest.fixture
def agent_env(
    fleet_env: dict[str, str], agent_lm: AgentLM, needle: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    fake_sandbox.register()
    env = {
        **fleet_env,
        "FLEET_SANDBOX": "fake",
        "FLEET_AGENT_LM_MODEL": "openai/agent",
        "FLEET_AGENT_LM_API_BASE": agent_lm.base_url,
        "FLEET_AGENT_LM_API_KEY": "sk-test-agent-0000",
        **PRICED,  # a run's cost cap is enforceable, so one within the threshold is approved by policy
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def subprocess_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a `fleet --agent` subprocess: the fake sandbox is registered in this test process
    only, so the subprocess keeps the default (these terminals start no run)."""
    return {k: v for k, v in {**os.environ, **env}.items() if k != "FLEET_SANDBOX"}


@pytest.fixture
async def engine(agent_env: dict[str, str]) -> AsyncIterator[Engine]:
    async with Engine(load_settings()) as eng:
        yield eng


def upload(engine: Engine, tmp_path: Path, name: str = "haystack.txt") -> str:
    """A file uploaded as the web app would: its upload id."""
    source = write_haystack(tmp_path / name, 20_000, CODE)
    writer = UploadWriter(engine.settings, name)
    writer.write(source.read_bytes())
    return str(writer.commit(engine.workspace)["upload_id"])


def memory_file(home: str) -> Path:
    return Path(home) / "volumes" / "workspace" / "memory" / "birds.md"
