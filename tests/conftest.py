"""Shared fixtures: an isolated FLEET_HOME, the scripted LM server and its needle-in-a-file scenario."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["FLEET_NO_KEYRING"] = "1"  # tests never touch the developer's keyring

from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def oracle() -> Iterator[OracleLM]:
    with OracleLM() as lm:
        yield lm


@pytest.fixture
def needle(oracle: OracleLM) -> OracleLM:
    """The oracle finding the secret code in a file, for questions that mention "secret code"."""
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    return oracle


@pytest.fixture
def fleet_env(tmp_path: Path, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing the runtime at the oracle and a fresh FLEET_HOME."""
    env = {
        "FLEET_HOME": str(tmp_path / "home"),
        "FLEET_LM_MODEL": "openai/oracle",
        "FLEET_LM_API_BASE": oracle.base_url,
        "FLEET_LM_API_KEY": "sk-test-oracle-0000",
        "FLEET_LM_RETRIES": "0",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return env


@pytest.fixture
def ctrl_c_reaches_children() -> Iterator[None]:
    """Children start with SIGINT's default disposition, as a terminal's Ctrl-C finds them. A shell
    that runs the suite in the background (``cmd &`` without job control) makes pytest ignore
    SIGINT, every child inherits that, and asyncio then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
