"""schemathesis against ``/openapi.json``: requests generated from the document for every operation
of the API, answered by the app in process (fast fake sandbox, scripted model): never a 5xx, and
every error is the documented JSON shape. ``/mcp`` is the MCP SDK's own endpoint (tests/mcp)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.python.asgi import shutdown_lifespans

from fleet_rlm.web.app import create_app, endpoints
from fleet_rlm.web.openapi import document
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import AUTH, QUICK, TOKEN

APP = create_app(token=TOKEN)  # any port: schemathesis talks to it in process
schema = schemathesis.openapi.from_dict(document(endpoints(), mcp=False))
schema.app = APP


@pytest.fixture(scope="module", autouse=True)
def fleet_home() -> Iterator[None]:
    """One FLEET_HOME and model for the module: the app's Engine outlives single test cases."""
    with tempfile.TemporaryDirectory() as tmp, OracleLM() as lm, pytest.MonkeyPatch.context() as env:
        lm.add(Scenario("", QUICK))  # every question gets a quick answer
        fake_sandbox.register()
        for key, value in {
            "FLEET_HOME": str(Path(tmp) / "home"), "FLEET_LM_MODEL": "openai/oracle",
            "FLEET_LM_API_BASE": lm.base_url, "FLEET_LM_API_KEY": "sk-test-oracle-0000", "FLEET_LM_RETRIES": "0",
            "FLEET_SANDBOX": "fake",
        }.items():  # fmt: skip
            env.setenv(key, value)
        env.chdir(tmp)
        try:
            yield
        finally:
            shutdown_lifespans()  # closes the app's Engine while its folder still exists


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    response = case.call(base_url="http://127.0.0.1", headers=AUTH)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        assert {"error", "message"} <= set(body) <= {"error", "message", "hint"} and body["message"], body
        assert "Traceback" not in body["message"]
