"""The first hour in a real browser (Debian's chromium via Playwright) against `fleet web`: the
Workbench says which model runs (or that none is set, with the way to Settings), an error whose fix
is a setting links to the Settings page, the first steps load the sample in examples/, and signing in
works with the whole address `fleet web` printed, pasted in the form or opened in a signed-out tab."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import UI, _require_chromium, chromium, clean_page, open_page
from tests.web.test_browser import shots as shots  # the screenshot folder fixture

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "incident"
# Answers from the context it was given: proves the sample's logs reached the sandbox.
READ_SAMPLE = ["SUBMIT('pool exhausted' if 'connection pool exhausted' in context else 'not the sample')"]


def _env(home: Path, **settings: str) -> dict[str, str]:
    """The inherited environment without any FLEET_ setting of the developer's, plus ``settings``."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return {**inherited, "FLEET_HOME": str(home), "FLEET_NO_KEYRING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **settings}  # fmt: skip


@pytest.fixture(scope="module")
def onboarding_oracle() -> Iterator[OracleLM]:
    with OracleLM(Scenario("Which service failed first", READ_SAMPLE)) as lm:
        yield lm


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, onboarding_oracle: OracleLM) -> Iterator[WebServer]:
    """`fleet web` with the scripted model configured."""
    _require_chromium()
    root = tmp_path_factory.mktemp("onboarding-web")
    env = _env(root / "home", FLEET_LM_MODEL="openai/oracle", FLEET_LM_API_BASE=onboarding_oracle.base_url,
               FLEET_LM_API_KEY="sk-test-oracle-0000", FLEET_LM_RETRIES="0")  # fmt: skip
    with fleet_web(root, env) as web:
        yield web


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """`fleet web` on a fresh machine: no model configured anywhere."""
    _require_chromium()
    root = tmp_path_factory.mktemp("onboarding-bare")
    with fleet_web(root, _env(root / "home")) as web:
        yield web


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def ui(browser: Browser, server: WebServer, shots: Path) -> Iterator[UI]:
    with clean_page(browser, server, shots) as view:
        yield view


@pytest.fixture
def bare_ui(browser: Browser, bare_server: WebServer, shots: Path) -> Iterator[UI]:
    with open_page(browser, bare_server, shots) as view:
        yield view
    # The refused run is logged by the browser itself (a 400); nothing else may be.
    assert [e for e in view.errors if "400" not in e] == [], "\n".join(view.errors)


def test_the_workbench_names_the_configured_model(ui: UI) -> None:
    ui.login()
    status = ui.page.locator("#model-status")
    expect(status).to_contain_text("openai/oracle")
    expect(status).not_to_contain_text("No model")


def test_without_a_model_the_workbench_says_so_and_links_to_settings(bare_ui: UI) -> None:
    page = bare_ui.page
    bare_ui.login()
    status = page.locator("#model-status")
    expect(status).to_contain_text("No model configured")
    status.get_by_role("link", name=re.compile("Settings")).click()
    expect(page.get_by_role("heading", name="Settings", exact=True)).to_be_visible()
    # Human labels, with the key name still shown small for `fleet-rlm config set`.
    model = page.get_by_label("Root model", exact=True)
    expect(model).to_have_attribute("data-setting", "lm_model")
    expect(page.locator(".field", has=model).locator("code.key")).to_have_text("lm_model")


def test_a_configure_error_links_to_the_settings_page(bare_ui: UI) -> None:
    page = bare_ui.page
    bare_ui.login()
    page.get_by_label("Question", exact=True).fill("What went wrong?")
    page.get_by_role("button", name="Run", exact=True).click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("No model configured")
    alert.get_by_role("link", name=re.compile("Settings")).click()
    expect(page.get_by_role("heading", name="Settings", exact=True)).to_be_visible()


def test_a_run_failed_by_a_refused_key_links_to_the_settings_page(ui: UI, onboarding_oracle: OracleLM) -> None:
    """A run whose model call is refused mid-way (after the preflight passed) fails with the key's fix."""
    page = ui.page
    ui.login()
    onboarding_oracle.state.fail_kind["root"] = 401
    try:
        page.get_by_label("Question", exact=True).fill("Anything at all?")
        page.get_by_role("button", name="Run", exact=True).click()
        block = page.locator("article.turn .answer-block")
        expect(block).to_contain_text("API key", timeout=60_000)
    finally:
        onboarding_oracle.state.fail_kind.clear()
    block.get_by_role("link", name=re.compile("Settings")).click()
    expect(page.get_by_role("heading", name="Settings", exact=True)).to_be_visible()


def test_the_first_steps_load_the_sample_as_the_context(ui: UI) -> None:
    page = ui.page
    ui.login()
    guide = page.locator("#first-steps")
    expect(guide.locator("ol > li")).to_have_count(3)
    guide.get_by_role("button", name=re.compile("sample")).click()
    expect(page.get_by_role("list", name="Files and folders added")).to_contain_text(str(SAMPLE))
    expect(page.get_by_label("Question", exact=True)).to_have_value(re.compile("Which service failed first"))
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator("article.turn .answer")).to_have_text("pool exhausted", timeout=60_000)
    expect(guide).to_be_hidden()  # the space is the trace's now


def _open_token_form(page: Page, server: WebServer) -> None:
    page.goto(server.base + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_the_token_field_accepts_the_whole_sign_in_address(browser: Browser, server: WebServer, shots: Path) -> None:
    with open_page(browser, server, shots) as view:
        page = view.page
        _open_token_form(page, server)
        page.get_by_label("Token").fill(server.login_url)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Workbench", exact=True)).to_be_visible()
        assert [e for e in view.errors if "401" not in e] == [], "\n".join(view.errors)


def test_opening_the_sign_in_address_in_a_signed_out_tab_signs_in(
    browser: Browser, server: WebServer, shots: Path
) -> None:
    with open_page(browser, server, shots) as view:
        page = view.page
        _open_token_form(page, server)
        # What the address bar does with the same page and a new fragment: no reload, a hashchange.
        page.evaluate("token => { location.hash = `#token=${token}`; }", server.token)
        expect(page.get_by_role("heading", name="Workbench", exact=True)).to_be_visible()
        assert server.token not in page.url and "token" not in page.url, page.url
        assert [e for e in view.errors if "401" not in e] == [], "\n".join(view.errors)
