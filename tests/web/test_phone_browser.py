"""The web UI on a phone and the routes and code views of its first hour, in a real browser (Debian's
chromium via Playwright) against `fleet web` with the real sandbox and the scripted model: every page
at 390 px without sideways scrolling under a one-row top bar whose menu works; the Runs list keeps its
Started and Time; Chat mode has its own address (Back and a direct load keep it); code in a trace is
highlighted, and markup inside it stays text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.oracle_lm import OracleLM, Scenario, oracle_env
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import UI, _require_chromium, chromium, clean_page

pytestmark = pytest.mark.slow

PHONE = 390  # an iPhone 12-15's CSS width
# One row: the tallest control in the bar (a 1.3-line button with its padding and border, about 37 px)
# plus the bar's own padding and border; two rows would need at least 90 px.
BAR_MAX = 64
PAYLOAD = "<img src=x onerror=window.__pwned=1>"
CODE = (f"# look for {PAYLOAD} here\n"
        f"found = \"{PAYLOAD}\"\n"
        "for n in range(42):\n"
        "    pass\n"
        "SUBMIT('done ' + str(n))")  # fmt: skip
QUESTION = "HIGHLIGHT-WEB: show me code"


@pytest.fixture(scope="module")
def phone_oracle() -> Iterator[OracleLM]:
    with OracleLM(Scenario("HIGHLIGHT-WEB", [CODE])) as lm:
        yield lm


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, phone_oracle: OracleLM) -> Iterator[WebServer]:
    _require_chromium()
    root = tmp_path_factory.mktemp("phone-web")
    with fleet_web(root, oracle_env(root, phone_oracle.base_url)) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: WebServer) -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def run_id(server: WebServer) -> str:
    """A run whose only step holds the code to highlight (the tests wait for what they need of it)."""
    with server.api() as api:
        return str(api.post("/api/runs", json={"question": QUESTION, "context_text": ["x"]}).json()["run_id"])


@pytest.fixture
def phone(browser: Browser, server: WebServer, tmp_path: Path) -> Iterator[UI]:
    with clean_page(browser, server, tmp_path, width=PHONE, height=844) as view:
        yield view


@pytest.fixture
def ui(browser: Browser, server: WebServer, tmp_path: Path) -> Iterator[UI]:
    with clean_page(browser, server, tmp_path) as view:
        yield view


def _no_sideways_scroll(page: Page, route: str) -> None:
    page.wait_for_load_state("networkidle")
    scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= inner, f"{route} scrolls sideways in a {inner} px window: {scroll} px wide"


def test_every_page_fits_a_phone_under_a_one_row_bar(phone: UI, run_id: str) -> None:
    page = phone.page
    rows = "".join(
        json.dumps({"question": f"question {n}", "context": "text", "answer": str(n)}) + "\n" for n in range(5)
    )
    with phone.server.api() as api:  # the Optimization page with a dataset in its table
        assert api.post("/api/datasets", json={"name": "phone-rows", "jsonl": rows}).status_code == 201
    phone.login()
    routes = [("#/workbench", "Workbench"), ("#/workbench/chat", "Workbench"), ("#/runs", "Runs"),
              (f"#/runs/{run_id}", QUESTION), ("#/volumes", "Volumes"), ("#/optimize", "Optimization"),
              ("#/settings", "Settings")]  # fmt: skip
    for route, heading in routes:
        phone.go(route)
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        _no_sideways_scroll(page, route)
        bar = page.locator(".topbar").bounding_box()
        assert bar and bar["height"] <= BAR_MAX, f"the top bar on {route} is {bar and bar['height']} px tall"
    phone.shot("phone-settings")


def test_the_phone_menu_opens_the_pages_and_closes(phone: UI) -> None:
    page = phone.page
    phone.login()
    nav = page.get_by_role("navigation", name="Pages")
    expect(nav.get_by_role("link", name="Runs")).to_be_hidden()
    menu = page.get_by_role("button", name="Menu")
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#theme")).to_be_visible()
    phone.shot("phone-menu")
    nav.get_by_role("link", name="Runs").click()
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(nav.get_by_role("link", name="Runs")).to_be_hidden()
    menu.click()
    page.keyboard.press("Escape")
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(menu).to_be_focused()


def test_the_runs_list_on_a_phone_shows_started_and_time(phone: UI, run_id: str) -> None:
    page = phone.page
    phone.login("#/runs")
    row = page.locator(f"tr[data-run='{run_id}']")
    expect(row).to_be_visible()
    for cell in (row.locator("td").nth(2), row.locator("td").nth(3)):  # Started, Time
        expect(cell).to_be_visible()
        box = cell.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE, f"a cell lies off screen: {box}"
        assert cell.evaluate("td => td.scrollWidth <= td.clientWidth"), f"{cell.inner_text()!r} is cut"
    assert page.locator(".table-wrap").evaluate("w => w.scrollWidth <= w.clientWidth"), "the table scrolls"
    phone.shot("phone-runs")


def test_chat_mode_has_an_address_that_back_and_a_direct_load_keep(ui: UI) -> None:
    page = ui.page
    ui.login()
    page.get_by_role("tab", name="Chat").click()
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()
    assert page.url.endswith("#/workbench/chat")
    ui.go("#/runs")
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    page.go_back()
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()
    expect(page.get_by_role("tab", name="Chat")).to_have_attribute("aria-selected", "true")
    page.get_by_role("tab", name="Run").click()
    expect(page.get_by_role("button", name="Run", exact=True)).to_be_visible()
    page.go_back()
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()

    page.goto(f"{ui.server.base}/?fresh#/workbench/chat")  # a new load of the page (the session stays)
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()
    expect(page.get_by_role("tab", name="Chat")).to_have_attribute("aria-selected", "true")


def test_code_in_a_trace_is_highlighted_and_markup_in_it_stays_text(ui: UI, run_id: str) -> None:
    page = ui.page
    ui.login(f"#/runs/{run_id}")
    code = page.locator(".trace pre.code").first
    expect(code).to_have_text(CODE)
    expect(code.locator(".tok-kw")).to_have_text(["for", "in", "pass"])
    expect(code.locator(".tok-str")).to_have_text([f'"{PAYLOAD}"', "'done '"])
    expect(code.locator(".tok-com")).to_have_text([f"# look for {PAYLOAD} here"])
    expect(code.locator(".tok-num")).to_have_text(["42"])
    assert page.locator(".trace img").count() == 0, "markup from the model's code became an element"
    assert page.evaluate("window.__pwned") is None
    ui.shot("highlighted-code")
