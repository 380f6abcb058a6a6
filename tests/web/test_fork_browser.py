"""The "Fork from here" flow in a real browser (chromium via Playwright, against `fleet web` with the real
sandbox and the scripted model): the step's code opens in a line-numbered editor, the edited code runs
as the fork's step, the fork's page says where it came from, and a replay of it shows its verdict."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support.oracle_lm import OracleLM, Scenario, oracle_env
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import UI, _require_chromium, chromium, clean_page

pytestmark = pytest.mark.slow

QUESTION = "FORK-WEB: add up"
STEPS = ["x = 40\nprint(x)", "x += 2\nprint(x)", "SUBMIT(str(x))"]


@pytest.fixture(scope="module")
def fork_oracle() -> Iterator[OracleLM]:
    with OracleLM(Scenario("FORK-WEB", STEPS)) as lm:
        yield lm


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fork_oracle: OracleLM) -> Iterator[WebServer]:
    _require_chromium()
    root = tmp_path_factory.mktemp("fork-web")
    with fleet_web(root, oracle_env(root, fork_oracle.base_url)) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: WebServer) -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def ui(browser: Browser, server: WebServer, tmp_path: Path) -> Iterator[UI]:
    with clean_page(browser, server, tmp_path) as view:
        yield view


def test_fork_from_here_runs_the_edited_step_and_shows_the_lineage(ui: UI, fork_oracle: OracleLM) -> None:
    page = ui.page
    with ui.server.api() as api:
        source = api.post("/api/runs", json={"question": QUESTION, "context_text": ["x"]}).json()["run_id"]
    ui.login(f"#/runs/{source}")
    expect(page.locator(".answer")).to_have_text("42", timeout=60_000)
    asked = len(fork_oracle.requests())

    page.locator(".trace .step[data-step='2']").get_by_role("button", name="Fork from here").click()
    dialog = page.get_by_role("dialog", name="Fork from step 2")
    editor = dialog.get_by_label("Code for step 2 of the fork")
    expect(editor).to_have_value(STEPS[1])
    editor.fill("x = x * 3\nprint('tripled')\nprint(x)")
    expect(dialog.locator(".gutter")).to_have_text("1\n2\n3")  # the line numbers follow the edit
    ui.shot("fork-editor")
    dialog.get_by_role("button", name="Run this code").click()

    expect(page).not_to_have_url(re.compile(f"#/runs/{source}$"))
    expect(page.locator(".answer")).to_have_text("120", timeout=60_000)
    fork_id = page.url.rsplit("/", 1)[-1]
    expect(page.locator(".lineage")).to_have_text(f"forked from {source} at step 2")
    expect(page.locator(".trace .step")).to_have_count(3)
    expect(page.locator(".trace .step[data-step='1']")).to_contain_text("replayed")
    assert len(fork_oracle.requests()) == asked + 1  # only step 3 asked the model
    ui.shot("fork")

    page.get_by_role("button", name="Replay").click()
    expect(page.locator(".lineage")).to_contain_text(f"replay of {fork_id}", timeout=30_000)
    expect(page.locator(".replay-verdict")).to_have_text("no divergence", timeout=60_000)
    assert len(fork_oracle.requests()) == asked + 1  # the replay asked nothing

    page.get_by_role("link", name=fork_id).click()  # back to the fork through the lineage link
    ui.go("#/runs")
    expect(page.locator(f"tr[data-run='{fork_id}'] .lineage")).to_have_text(f"forked from {source} at step 2")
