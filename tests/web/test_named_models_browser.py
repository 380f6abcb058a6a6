"""The web run page, and the one-file HTML export, show usage per configured model once a named model
(FLEET_MODELS) answered: the real ``fleet web`` command, two scripted model servers, Debian's chromium
(issue 38)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from playwright.sync_api import expect

from tests.support.oracle_lm import OracleLM, Scenario, default_sub, oracle_env
from tests.web.conftest import fleet_web
from tests.web.test_browser import chromium

STEPS = [
    "a = llm_query('The secret code is S1')\nb = llm_query('The secret code is F1', model='fast')",
    "SUBMIT(a + b)",
]


def test_the_run_page_shows_each_named_models_usage(tmp_path: Path) -> None:
    fast_scenario = Scenario("never a root here", ["SUBMIT('x')"], sub=lambda p: "fast:" + default_sub(p))
    with OracleLM(Scenario("NAMED-WEB", STEPS)) as oracle, OracleLM(fast_scenario) as fast:
        env = oracle_env(tmp_path, oracle.base_url) | {"FLEET_SANDBOX": "local"}
        env["FLEET_MODELS"] = json.dumps({"fast": {"model": "openai/gpt-4o-mini", "api_base": fast.base_url}})
        with fleet_web(tmp_path, env) as server, chromium() as browser:
            with server.api() as api:
                run_id = api.post("/api/runs", json={"question": "NAMED-WEB", "context_text": ["ctx"]}).json()["run_id"]
                deadline = time.monotonic() + 60
                while api.get(f"/api/runs/{run_id}").json().get("status") in ("queued", "running"):
                    assert time.monotonic() < deadline, "the run did not finish"
                    time.sleep(0.2)
                assert api.get(f"/api/runs/{run_id}").json()["answer"] == "S1fast:F1"
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(server.login_url)
            page.goto(f"{server.base}/#/runs/{run_id}")
            table = page.locator("table.usage")
            expect(table.locator("tbody tr")).to_have_count(3)
            expect(table).to_contain_text("root (openai/oracle)")
            expect(table).to_contain_text("sub (openai/oracle)")
            expect(table).to_contain_text("fast (openai/gpt-4o-mini)")
            # The one-file HTML export shows the same rows.
            with server.api() as api:
                exported = api.get(f"/api/runs/{run_id}/export.html")
            assert exported.status_code == 200
            (tmp_path / "trace.html").write_text(exported.text)
            page.goto((tmp_path / "trace.html").as_uri())
            expect(page.locator("#usage tbody tr")).to_have_count(3)
            expect(page.locator("#usage")).to_contain_text("fast (openai/gpt-4o-mini)")
            assert not errors, errors
    assert len(fast.requests()) == 1
