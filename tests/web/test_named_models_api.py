"""Named models (issue 38) through the web API: the Settings page's JSON text is saved to settings.json
without any key, shown back without keys, and applies to the next run without a restart."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.oracle_lm import OracleLM, Scenario, default_sub
from tests.web.conftest import wait_finished

pytestmark = pytest.mark.anyio


async def test_models_saved_from_the_settings_page_serve_the_next_run(
    client: httpx.AsyncClient, fake_env: dict, oracle: OracleLM
) -> None:
    oracle.add(Scenario("ask cheap", ["SUBMIT(llm_query('The secret code is W1', model='cheap'))"]))
    with OracleLM(Scenario("never a root here", ["SUBMIT('x')"], sub=lambda p: "cheap:" + default_sub(p))) as cheap:
        text = json.dumps({"cheap": {"model": "openai/gpt-4o-mini", "api_base": cheap.base_url}})
        saved = await client.put("/api/settings", json={"models": text})  # the form sends the field's text
        assert saved.status_code == 200, saved.text
        rows = {r["name"]: r for r in saved.json()["settings"]}
        assert rows["models"]["value"] == {"cheap": {"model": "openai/gpt-4o-mini", "api_base": cheap.base_url}}
        on_disk = json.loads((Path(fake_env["FLEET_HOME"]) / "settings.json").read_text())
        assert on_disk["models"] == json.loads(text)

        refused = await client.put(
            "/api/settings", json={"models": {"cheap": {"model": "openai/x", "api_key": "sk-never-on-disk-0000"}}}
        )
        assert refused.status_code == 400 and "never saved to a file" in refused.json()["message"]
        assert "sk-never-on-disk" not in (Path(fake_env["FLEET_HOME"]) / "settings.json").read_text()

        started = await client.post("/api/runs", json={"question": "ask cheap", "context_text": ["x"]})
        run = await wait_finished(client, started.json()["run_id"])
        assert run["status"] == "succeeded" and run["answer"] == "cheap:W1"
        assert len(cheap.requests()) == 1
        # A server on loopback with no key configured gets the placeholder, never the root's key.
        assert cheap.requests()[0].auth == "Bearer not-needed"
