"""The Optimization page in a real browser (Debian's chromium via Playwright) against `fleet web`:
import a dataset, launch a bootstrap optimization and watch its score chart fill, compare, promote
(the next run answers with the new version), roll back. The console stays free of errors."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.optimize.conftest import shout_rows, teach
from tests.support.oracle_lm import OracleLM
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import _require_chromium, chromium, open_page
from tests.web.test_browser import shots as shots  # the screenshot folder fixture

pytestmark = pytest.mark.slow


@contextmanager
def optimize_server(root: Path) -> Iterator[tuple[WebServer, OracleLM]]:
    """`fleet web` in ``root`` with a fresh FLEET_HOME and the scripted model taught the shout task."""
    _require_chromium()
    with OracleLM() as oracle:
        teach(oracle)
        env = {**os.environ, "FLEET_HOME": str(root / "home"), "FLEET_LM_MODEL": "openai/oracle",
               "FLEET_LM_API_BASE": oracle.base_url, "FLEET_LM_API_KEY": "sk-test-oracle-0000",
               "FLEET_LM_RETRIES": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "FLEET_NO_KEYRING": "1"}  # fmt: skip
        with fleet_web(root, env) as web:
            yield web, oracle


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebServer, OracleLM]]:
    with optimize_server(tmp_path_factory.mktemp("optimize-web")) as served:
        yield served


def test_import_optimize_compare_promote_rollback(
    server: tuple[WebServer, OracleLM], browser: Browser, shots: Path
) -> None:
    web, _oracle = server
    jsonl = "".join(json.dumps(r) + "\n" for r in shout_rows())
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
        axes = page.locator(".score-chart svg text")
        for label in ("score", "trial", "0", "0.5", "1", "1", "2"):
            expect(axes.filter(has_text=re.compile(rf"^{re.escape(label)}$")).first).to_be_visible()
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


def _failing_version(home: Path) -> str:
    """A version that scored 1.000 before and 0.000 after (as a bad optimization leaves one)."""
    from fleet_rlm.optimize.versions import builtin_state
    from fleet_rlm.store import ProgramVersion, Store

    scores = {"train_before": 1.0, "train_after": 0.0, "holdout_before": 1.0, "holdout_after": 0.0, "n_train": 4,
              "n_holdout": 1}  # fmt: skip
    with Store(home / "fleet.db") as store:
        store.optimize.add_program_version(ProgramVersion(
            id="vfailing", base_id=None, optimization_id=None, dataset_id=None, optimizer="gepa", metric="exact",
            scores=scores, state=builtin_state(), changes={}, created_at=time.time(),
        ))  # fmt: skip
    return "vfailing"


def _failed_run(web: WebServer, oracle: OracleLM) -> str:
    """A run that failed without an answer (the model server refused its first call)."""
    oracle.state.fail_next.append(500)
    with web.api() as api:
        run_id = api.post("/api/runs", json={"question": "Shout the word in the context (fig)"}).json()["run_id"]
        deadline = time.monotonic() + 60
        while (state := api.get(f"/api/runs/{run_id}").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert state["status"] == "failed" and not state["answer"]
    return str(run_id)


def test_a_run_without_an_answer_cannot_be_marked_correct_in_the_page(
    browser: Browser, tmp_path: Path, shots: Path
) -> None:
    with optimize_server(tmp_path) as (web, oracle):
        run_id = _failed_run(web, oracle)
        with open_page(browser, web, shots) as ui:
            ui.login(f"#/runs/{run_id}")
            expect(ui.page.get_by_role("button", name="Correct")).to_be_disabled()
            expect(ui.page.get_by_text("This run gave no answer, so it cannot be correct")).to_be_visible()
            assert ui.errors == [], "\n".join(ui.errors)


def test_a_failing_version_is_promoted_only_with_a_reason_typed_in_the_page(
    browser: Browser, tmp_path: Path, shots: Path
) -> None:
    folder = tmp_path / "questions"
    folder.mkdir()
    (folder / "word.txt").write_text("Word: plum")
    jsonl = folder / "rel.jsonl"
    jsonl.write_text(json.dumps({"question": "Shout the word in the context (plum)", "context_path": "word.txt",
                                 "answer": "PLUM"}) + "\n")  # fmt: skip
    with optimize_server(tmp_path) as (web, _oracle):
        version = _failing_version(web.home)
        with web.api() as api:
            refused = api.post(f"/api/programs/{version}/promote", json={})
        assert refused.status_code == 409 and "1.000 -> 0.000" in refused.json()["message"]
        assert "--" not in refused.json()["message"], "a web user has no command-line flags"
        with open_page(browser, web, shots) as ui:
            page = ui.page
            ui.login("#/optimize")
            page.get_by_label("Dataset name").fill("relative")
            page.get_by_label("JSONL file").set_input_files(str(jsonl))
            expect(page.get_by_label("JSON lines")).to_have_value(re.compile("word.txt"))
            page.get_by_role("button", name="Import dataset").click()
            error = page.locator(".error").filter(has_text="context_path 'word.txt' is relative")
            expect(error).to_contain_text("give the folder the file is in")
            page.get_by_label("Folder the file is in").fill(str(folder))
            page.get_by_role("button", name="Import dataset").click()
            expect(page.get_by_text("Dataset relative: 1 train, 0 holdout rows.")).to_be_visible()

            row = page.locator(f"tr[data-version='{version}']")
            expect(row).to_contain_text("1.000 → 0.000")
            expect(row.get_by_role("button", name=f"Promote {version}")).to_have_count(0)
            row.get_by_role("button", name="Promote anyway…").click()
            reason = page.get_by_label("Reason for the override")
            promote = page.get_by_role("button", name="Promote with this reason")
            expect(promote).to_be_disabled()
            reason.fill("the scorer was broken; checked by hand")
            promote.click()
            expect(page.get_by_text(f"Version {version} is active: new runs use it.")).to_be_visible()
            ui.shot("optimize-override")
            unexpected = [e for e in ui.errors if "status of 400" not in e]  # the refused import's, on purpose
            assert unexpected == [], "the browser console showed errors:\n" + "\n".join(unexpected)
        with web.api() as api:
            listed = api.get("/api/programs").json()
        assert listed["active"] == version
        assert listed["history"][0]["reason"] == "override: the scorer was broken; checked by hand"
