"""Fixtures for the MCP face: a server per test, both protocol eras, scripted scenarios."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_rlm.mcp.server import build_server
from mcp import Client
from tests.support.oracle_lm import OracleLM, Scenario

ERAS = ["legacy", "auto"]  # 2025-11-25 handshake, 2026-07-28 discover
ROOT = Path(__file__).resolve().parents[2]

# A run that keeps working until cancelled: each step sleeps in the sandbox, then loops again.
SLOW_STEPS = ["import time\nfor i in range(600):\n    time.sleep(0.1)\nprint('done')"]


@pytest.fixture(params=ERAS)
def era(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def client(fleet_env: dict[str, str], era: str) -> AsyncIterator[Client]:
    """An in-memory client of a fresh server that opens its own engine (the stdio setup)."""
    async with Client(build_server(), mode=era) as c:
        yield c


@pytest.fixture
def slow(oracle: OracleLM) -> OracleLM:
    oracle.add(Scenario("take your time", SLOW_STEPS))
    return oracle


def server_env(fleet_env: dict[str, str]) -> dict[str, str]:
    """Environment for a server subprocess: the test settings plus what Python needs to start."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT")}
    return {**keep, **fleet_env, "FLEET_NO_KEYRING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def fleet_mcp_command() -> list[str]:
    """The installed console script, else the module (a checkout without `uv sync`)."""
    script = Path(sys.executable).with_name("fleet-mcp")
    return [str(script)] if script.exists() else [sys.executable, "-m", "fleet_rlm.mcp"]
