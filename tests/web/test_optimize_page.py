"""The Optimization page in a real browser (Debian's chromium via Playwright) against `fleet web`:
import a dataset, launch a bootstrap optimization and watch its score chart fill, compare, promote
(the next run answers with the new version), roll back. The console stays free of errors."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.optimize.conftest import shout_rows, teach
from tests.support.oracle_lm import OracleLM
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import CHROMIUM, _require_chromium, open_page
from tests.web.test_browser import shots as shots  # the screenshot folder fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebServer, OracleLM]]:
    _require_chromium()
    root = tmp_path_factory.mktemp("optimize-web")
    with OracleLM() as oracle:
        teach(oracle)
        env = {**os.environ, "FLEET_HOME": str(root / "home"), "FLEET_LM_MODEL": "openai/oracle",
               "FLEET_LM_API_BASE": oracle.base_url, "FLEET_LM_API_KEY": "sk-test-oracle-0000",
               "FLEET_LM_RETRIES": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "FLEET_NO_KEYRING": "1"}  # fmt: skip
        with fleet_web(root, env) as web:
            yield web, oracle


def test_import_optimize_compare_promote_rollback(server: tuple[WebServer, OracleLM], shots: Path) -> None:
    web, _oracle = server
    jsonl = "".join(json.dumps(r) + "\n" for r in shout_rows())
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--disable-background-networking"])
        with open_page(browser, web, shots) as ui:
            page = ui.page
            ui.login("#/optimize")
            expect(page.get_by_role("heading", name="Optimization", exact=True)).to_be_visible()
            expect(page.get_by_role("link", name="Optimization")).to_be_visible()

            page.get_by_label("Dataset name").fill("shout")
            page.get_by_label("JSON lines").fill(jsonl)
            page.get_by_role("button", name="Import dataset").click()
            expect(page.get_by_text("Dataset shout: 8 train, 2 holdout rows.")).to_be_visible()
            expect(page.locator("tr[data-dataset='shout']")).to_be_visible()

            page.get_by_label("Dataset", exact=True).select_option("shout")
            page.get_by_label("Optimizer").select_option("bootstrap")
            page.get_by_label("Metric").select_option("exact")
            page.get_by_role("button", name="Start optimization").click()
            expect(page.locator(".opt-result")).to_contain_text("succeeded", timeout=120_000)
            expect(page.locator(".opt-result")).to_contain_text("gate passes")
            expect(page.locator(".score-chart circle")).to_have_count(2)
            expect(page.locator("[data-scored]")).to_have_count(4)
            expect(page.locator("[data-scored='after-train']")).to_have_text("after: train score 1.000 (8 rows)")
            ui.shot("optimize")

            row = page.locator("tr[data-version]").first
            version = row.get_attribute("data-version")
            assert version and version.startswith("v")
            page.get_by_role("button", name="Compare versions").click()
            expect(page.get_by_role("heading", name=f"builtin vs {version}")).to_be_visible()
            expect(page.locator("pre.diff").first).to_have_text("(the same)")  # bootstrap adds demos only
            expect(page.get_by_text(re.compile(rf"only in {version}: [1-9]"))).to_be_visible()

            page.get_by_role("button", name=f"Promote {version}").click()
            expect(page.get_by_text(f"Version {version} is active: new runs use it.")).to_be_visible()
            with web.api() as api:
                run = api.post("/api/runs", json={"question": "Shout the word in the context (plum)",
                                                  "context_text": ["Word: plum"]}).json()  # fmt: skip
                deadline = time.monotonic() + 60
                while (state := api.get(f"/api/runs/{run['run_id']}").json())["status"] in ("queued", "running"):
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert state["answer"] == "PLUM"

            page.get_by_role("button", name="Roll back").click()
            expect(page.get_by_text("Rolled back: builtin is active.")).to_be_visible()
            expect(page.get_by_text("Active: builtin")).to_be_visible()
            assert ui.errors == [], "the browser console showed errors:\n" + "\n".join(ui.errors)
        browser.close()
