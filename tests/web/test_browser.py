"""The web UI in a real browser: Debian's chromium, driven by Playwright, against `fleet web`.

The server is the real command (``fleet web --no-open --port 0``) with a fresh FLEET_HOME, the
scripted LM server as the model, the real local sandbox, and a real OS keyring (gnome-keyring on a
private D-Bus session, as in .ci/run). Each test asserts what a user sees, and that the browser's
console stays free of errors. Screenshots go to $FLEET_SCREENSHOTS (a temporary folder if unset);
docs/img/ holds copies refreshed by hand when the UI changes.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, expect, sync_playwright

from tests.support import prereqs
from tests.support.oracle_lm import OracleLM, Scenario, oracle_env
from tests.support.patience import patience
from tests.support.workloads import NEEDLE_STEPS, write_haystack
from tests.web.conftest import BIN, WebServer, fleet_web

pytestmark = pytest.mark.slow

CHROMIUM = str(prereqs.CHROMIUM)

NEEDLE_Q = "NEEDLE-WEB: what is the secret code in the uploaded file?"
CODE = "ORCHID4471"
FOLLOW_Q = "FOLLOW-WEB: say the code again from the REPL"
SLOW_Q = "SLOW-CLI: count slowly and report"
SECRET = "sk-web-ui-secret-5e6f7a8b"
LATENCY = 0.25  # per model call: the trace must be seen growing before the answer arrives


def _require_chromium() -> None:
    prereqs.require(f"Debian's chromium ({CHROMIUM})", Path(CHROMIUM).exists())
    # Assertions wait for their condition and return as soon as it holds: a deadline long enough for a
    # machine whose cores other work shares costs a passing test nothing (Playwright's default is 5 s).
    expect.set_options(timeout=patience(20) * 1000)


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's chromium, headless, through Playwright (never a downloaded browser)."""
    _require_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--disable-background-networking"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def web_oracle() -> Iterator[OracleLM]:
    slow_steps = [f"import time\ntime.sleep(3)\nprint({n!r})" for n in ("one", "two", "three")]
    slow_steps.append("SUBMIT('counted')")
    child_steps = ["kid = rlm_query('CHILD-INNER: report the code', context='The secret code is KID5.')\nprint(kid)",
                   "SUBMIT(kid)"]  # fmt: skip
    with OracleLM(
        Scenario("FOLLOW-WEB", ["SUBMIT('again: ' + found[0])"]),  # `found` is the first run's variable
        Scenario("NEEDLE-WEB", NEEDLE_STEPS),
        Scenario("SLOW-CLI", slow_steps),
        Scenario("CHILD-WEB", child_steps),
        Scenario("CHILD-INNER", ["SUBMIT('KID5')"]),
        latency=LATENCY,
    ) as lm:
        yield lm


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, web_oracle: OracleLM) -> Iterator[WebServer]:
    _require_chromium()
    root = tmp_path_factory.mktemp("web")
    user_home = root / "user-home"
    user_home.mkdir()
    env = {k: v for k, v in oracle_env(root, web_oracle.base_url).items() if k != "FLEET_NO_KEYRING"}
    env["HOME"] = str(user_home)  # the keyring's files go here, never the developer's
    wrap: list[str] = []
    if prereqs.has_secret_service():
        script = prereqs.UNLOCK_KEYRING + 'exec "$@"'
        wrap = ["dbus-run-session", "--", "sh", "-c", script, "sh"]
    with fleet_web(root, env, wrap) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: WebServer) -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("FLEET_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class UI:
    page: Page
    errors: list[str]
    server: WebServer
    shots: Path

    def login(self, route: str = "") -> None:
        self.page.goto(self.server.login_url)
        expect(self.page.get_by_role("heading", name="Workbench", exact=True)).to_be_visible()
        if route:
            self.go(route)

    def go(self, route: str) -> None:
        self.page.evaluate("route => { location.hash = route; }", route)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path))
        assert path.stat().st_size > 5000, f"screenshot {path} looks blank"
        return path


@contextmanager
def open_page(browser: Browser, server: WebServer, shots: Path, width: int = 1280, height: int = 800) -> Iterator[UI]:
    """A fresh browser context (no cookies) whose console errors and page errors are collected."""
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="light")
    try:
        page = context.new_page()
        errors: list[str] = []

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                errors.append(f"console: {msg.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        page.set_default_timeout(patience(30) * 1000)
        yield UI(page, errors, server, shots)
    finally:
        context.close()


@contextmanager
def clean_page(browser: Browser, server: WebServer, shots: Path, **size: int) -> Iterator[UI]:
    """``open_page``, failing the test afterwards if the page logged any error."""
    with open_page(browser, server, shots, **size) as view:
        yield view
    assert view.errors == [], "the browser console showed errors:\n" + "\n".join(view.errors)


@pytest.fixture
def ui(browser: Browser, server: WebServer, shots: Path) -> Iterator[UI]:
    with open_page(browser, server, shots) as view:
        yield view
    assert view.errors == [], "the browser console showed errors:\n" + "\n".join(view.errors)


def test_workbench_runs_over_5mb_upload_live_then_runs_timeline_feedback(ui: UI, tmp_path: Path) -> None:
    page = ui.page
    big = write_haystack(tmp_path / "haystack.txt", 5_000_000, CODE)
    chunks = math.ceil(len(big.read_text()) / 100_000)  # NEEDLE_STEPS fan out one sub-query per 100,000 chars
    ui.login()
    assert "token" not in page.url, "the token must leave the address bar once used"

    page.get_by_label("Question", exact=True).fill(NEEDLE_Q)
    picker = page.get_by_label("Choose files", exact=True)
    picker.set_input_files(str(big))
    expect(page.locator(".chip", has_text="haystack.txt")).to_contain_text("ready", timeout=60_000)
    box = picker.bounding_box()  # the browser's own "No file chosen" beside the list is not shown
    assert box is None or box["width"] <= 1, f"the native file input shows: {box}"

    # Keyboard: from the question, Tab reaches the run button; Enter runs.
    page.get_by_label("Question", exact=True).focus()
    for _ in range(15):
        if page.evaluate("document.activeElement.id") == "run-button":
            break
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "run-button", "Tab never reached the Run button"
    page.keyboard.press("Enter")

    turn = page.locator("article.turn").first
    # The tree grows while the run is still going: a step is shown before any answer exists.
    expect(turn.locator(".step").first).to_be_visible()
    assert turn.locator(".answer").count() == 0, "the first step should stream in before the answer"
    expect(turn.locator(".fanout-head")).to_have_text(f"Batched sub-queries: {chunks} of {chunks} done", timeout=60_000)
    expect(turn.locator(".answer")).to_have_text(CODE, timeout=90_000)
    expect(turn.locator(".step")).to_have_count(3)
    expect(turn.locator(".turn-meta .badge")).to_have_text("succeeded")
    run_id = turn.get_attribute("data-run")
    assert run_id
    ui.shot("workbench")

    # A follow-up in the same session sees the first run's REPL variables.
    expect(page.get_by_role("button", name="Ask follow-up")).to_be_visible()
    page.get_by_label(re.compile("Follow-up question")).fill(FOLLOW_Q)
    page.get_by_label(re.compile("Follow-up question")).press("Control+Enter")
    expect(page.locator("article.turn").first.locator(".answer")).to_have_text(f"again: {CODE}", timeout=60_000)

    # Runs: the run is listed, search narrows the list, the inspector shows tree and timeline.
    ui.go("#/runs")
    expect(page.get_by_role("link", name=NEEDLE_Q)).to_be_visible()
    page.get_by_label("Search questions").fill("FOLLOW-WEB")
    expect(page.get_by_role("link", name=NEEDLE_Q)).to_have_count(0)
    expect(page.get_by_role("link", name=FOLLOW_Q)).to_be_visible()
    page.get_by_label("Search questions").fill("")
    page.get_by_label("Status", exact=True).select_option("failed")
    expect(page.get_by_role("link", name=NEEDLE_Q)).to_have_count(0)
    page.get_by_label("Status", exact=True).select_option("")
    ui.shot("runs")
    page.get_by_role("link", name=NEEDLE_Q).click()
    expect(page).to_have_url(re.compile(f"#/runs/{run_id}$"))
    expect(page.locator(".answer")).to_have_text(CODE)
    expect(page.locator(".trace .step")).to_have_count(3)
    expect(page.locator("table.usage")).to_contain_text("oracle")

    page.get_by_role("tab", name="Timeline").click()
    timeline = page.locator("svg.timeline")
    expect(timeline).to_be_visible()
    expect(timeline.locator("rect.tl-sub")).to_have_count(chunks)
    expect(timeline.locator("rect.tl-lm")).to_have_count(3)
    lanes = page.evaluate(
        """() => new Set([...document.querySelectorAll('rect.tl-sub')].map(r => r.getAttribute('y'))).size"""
    )
    assert lanes > 1, "sub-queries ran concurrently: the timeline must show them in parallel lanes"
    ui.shot("inspector-timeline")

    page.get_by_role("button", name="Correct").click()
    expect(page.get_by_role("status").filter(has_text="Feedback saved")).to_be_visible()
    expect(page.locator(".feedback-list li")).to_have_count(1)
    with ui.server.api() as api:
        rows = api.get(f"/api/runs/{run_id}/feedback").json()["feedback"]
    assert [r["correct"] for r in rows] == [True]


def test_cli_run_streams_live_in_the_runs_inspector(ui: UI) -> None:
    page = ui.page
    ui.login("#/runs")
    cli = subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", SLOW_Q, "--text", "a few words of context", "--json", "--trace-mode", "off"],
        env=ui.server.env | {"FLEET_NO_KEYRING": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        link = page.get_by_role("link", name=SLOW_Q)
        expect(link).to_be_visible(timeout=30_000)
        link.click()
        expect(page.locator(".trace .step").first).to_be_visible(timeout=30_000)
        # Seen live: steps are in the tree while the CLI's run has not answered yet.
        assert page.locator(".answer").count() == 0, "the CLI run should still be going"
        assert cli.poll() is None, "the CLI run finished before the browser saw it live"
        expect(page.locator(".answer")).to_have_text("counted", timeout=60_000)
        expect(page.locator(".trace .step")).to_have_count(4)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 0, err
    assert json.loads(out)["answer"] == "counted"


def _first_events(chunks: Iterator[str], count: int) -> str:
    """The first ``count`` event frames of an SSE stream, as text (the opening ``retry:`` and
    keep-alive comments left out)."""
    text = ""
    for chunk in chunks:
        text += chunk
        frames = text.replace("\r\n", "\n").split("\n\n")[:-1]  # the complete ones
        events = [f for f in frames if re.search(r"^id: ", f, re.MULTILINE)]
        if len(events) >= count:
            return "\n\n".join(events[:count]) + "\n\n"
    raise AssertionError(f"the stream ended before {count} events: {text!r}")


def test_a_dropped_event_stream_resumes_after_its_last_event(ui: UI) -> None:
    """The inspector's first stream ends after two events (served by the route, as a connection
    that drops); the page reconnects by itself with Last-Event-ID and shows the whole run once."""
    page = ui.page
    question = "NEEDLE-WEB: resume the stream"
    with ui.server.api() as api:
        started = api.post("/api/runs", json={"question": question, "context_text": ["The secret code is RESUME9."]})
        run_id = started.json()["run_id"]
        with api.stream("GET", f"/api/runs/{run_id}/events") as stream:
            head = _first_events(stream.iter_text(), 2)
    requests: list[dict[str, str]] = []

    def drop_the_first(route: Route) -> None:
        requests.append(route.request.headers)
        if len(requests) == 1:
            route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body="retry: 50\n\n" + head)
        else:
            route.continue_()

    page.route(re.compile(r"/api/runs/[^/]+/events"), drop_the_first)
    ui.login(f"#/runs/{run_id}")
    expect(page.locator(".answer")).to_have_text("RESUME9", timeout=60_000)
    expect(page.locator(".trace .step")).to_have_count(len(NEEDLE_STEPS))
    assert [r.get("last-event-id") for r in requests] == [None, "2"], requests
    assert all(r["authorization"].startswith("Bearer ") for r in requests)  # the tab's session, no cookie


def test_workbench_context_from_a_volume_file(ui: UI) -> None:
    page = ui.page
    with ui.server.api() as api:
        assert api.post("/api/volumes", json={"name": "ctx"}).status_code == 201
        put = api.put(
            "/api/volumes/ctx/raw", params={"path": "artifacts/needle.txt"}, content="The secret code is VOL88."
        )
        assert put.status_code in (200, 201)
    ui.login()
    page.get_by_text("Add files from a volume").click()
    page.get_by_label("Volume", exact=True).select_option("ctx")
    page.locator(".vol-picker").get_by_role("button", name="artifacts/").click()
    page.get_by_role("button", name="Add artifacts/needle.txt as context").click()
    expect(page.get_by_role("list", name="Files and folders added")).to_contain_text("vol:ctx/artifacts/needle.txt")
    page.get_by_label("Question", exact=True).fill("NEEDLE-WEB: the code in the volume file?")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator("article.turn .answer")).to_have_text("VOL88", timeout=60_000)


def test_stop_cancels_a_running_run(ui: UI) -> None:
    page = ui.page
    ui.login()
    page.get_by_label("Question", exact=True).fill("SLOW-CLI: started in the browser, then stopped")
    page.get_by_role("button", name="Run", exact=True).click()
    turn = page.locator("article.turn").first
    expect(turn.locator(".step").first).to_be_visible()
    turn.get_by_role("button", name="Stop").click()
    expect(turn.locator(".turn-meta .badge")).to_have_text("cancelled", timeout=30_000)
    expect(turn.locator(".answer-block")).to_contain_text("No answer")
    expect(turn.get_by_role("button", name="Stop")).to_be_hidden()


def test_child_rlm_nests_under_its_step_and_on_the_timeline(ui: UI) -> None:
    page = ui.page
    with ui.server.api() as api:
        run_id = api.post("/api/runs", json={"question": "CHILD-WEB: ask a child", "context_text": ["x"]}).json()[
            "run_id"
        ]
    ui.login(f"#/runs/{run_id}")
    expect(page.locator(".answer")).to_have_text("KID5", timeout=60_000)
    child = page.locator(".root-node .step .child-node")
    expect(child).to_have_count(1)
    expect(child.locator(".node-head")).to_contain_text("CHILD-INNER: report the code")
    expect(child.locator(".step")).to_have_count(1)
    page.get_by_role("tab", name="Timeline").click()
    expect(page.locator("svg.timeline rect.tl-child")).to_have_count(1)


def test_volumes_browse_preview_csv_upload_delete(ui: UI, tmp_path: Path) -> None:
    page = ui.page
    with ui.server.api() as api:
        assert api.post("/api/volumes", json={"name": "data"}).status_code == 201
        csv = 'city,count,note\nOslo,3,"fine, dry"\nLima,5,<img src=x onerror=alert(1)>\n'
        md = "# Notes\n\nSome **bold** text and [a link](javascript:alert(1)).\n"
        for path, text in (("artifacts/reports/q3.csv", csv), ("memory/notes.md", md)):
            assert api.put("/api/volumes/data/raw", params={"path": path}, content=text).status_code in (200, 201)
    ui.login("#/volumes")
    page.get_by_role("button", name="data", exact=True).click()  # other tests' volumes may be listed first
    expect(page.get_by_role("heading", name="data", exact=True)).to_be_visible()
    expect(page.get_by_label("Quota use of data")).to_be_visible()

    page.get_by_role("button", name="artifacts/").click()
    page.get_by_role("button", name="reports/").click()
    page.get_by_role("button", name="q3.csv").click()
    table = page.locator("table.csv")
    expect(table.locator("thead th")).to_have_text(["city", "count", "note"])
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").first.locator("td")).to_have_text(["Oslo", "3", "fine, dry"])
    expect(table.locator("tbody tr").nth(1).locator("td").nth(2)).to_have_text("<img src=x onerror=alert(1)>")
    assert page.locator(".preview-pane img").count() == 0, "file text must never become markup"
    ui.shot("volumes")

    page.get_by_role("button", name="memory/").click()
    page.get_by_role("button", name="notes.md").click()
    expect(page.locator(".markdown strong")).to_have_text("bold")
    assert page.locator(".markdown a").count() == 0, "a javascript: link must stay text"

    # Upload through the page, into the folder opened last (memory/).
    upload = tmp_path / "hello.txt"
    upload.write_text("hello from the browser\n")
    expect(page.get_by_text("Uploads go to data/memory/")).to_be_visible()
    page.get_by_label("Upload files").set_input_files(str(upload))
    page.get_by_role("button", name="Upload", exact=True).click()
    page.get_by_role("button", name="hello.txt").click()
    expect(page.locator(".preview-pane pre")).to_have_text("hello from the browser\n")
    with page.expect_download() as download:  # fetched with the session header, saved from a blob
        page.get_by_role("link", name="Download").click()
    assert download.value.suggested_filename == "hello.txt"
    assert Path(download.value.path()).read_text() == "hello from the browser\n"

    # Delete asks first: Cancel keeps the file, Delete removes it (checked on the host).
    on_disk = ui.server.home / "volumes" / "data" / "memory" / "hello.txt"
    assert on_disk.is_file(), f"the upload should be on disk at {on_disk}"
    page.locator(".preview-head").get_by_role("button", name="Delete").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    assert on_disk.is_file()
    page.locator(".preview-head").get_by_role("button", name="Delete").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(page.get_by_role("button", name="hello.txt")).to_have_count(0)
    assert not on_disk.exists()


def test_settings_save_a_key_shown_masked_and_doctor(ui: UI) -> None:
    prereqs.require_secret_service()
    page = ui.page
    ui.login("#/settings")
    expect(page.locator("[data-doctor=keyring]")).to_contain_text("SecretService")
    expect(page.locator("[data-doctor=isolation]")).not_to_be_empty()
    expect(page.locator("table.caps")).to_contain_text("memory")

    key = page.locator("input[data-setting=sub_lm_api_key]")
    expect(key).to_have_attribute("type", "password")
    key.fill(SECRET)
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator("[data-masked=sub_lm_api_key]")).to_have_text(re.compile(r"^set( \(…\w{4}\))? \(keyring\)$"))
    expect(page.locator("input[data-setting=sub_lm_api_key]")).to_have_value("")
    assert SECRET not in page.content(), "the key must never come back to the page"

    page.get_by_role("button", name="Remove from the keyring").click()
    expect(page.locator("[data-masked=sub_lm_api_key]")).to_have_text("not set")
    key.fill(SECRET)
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator("[data-masked=sub_lm_api_key]")).to_contain_text("keyring")

    page.get_by_role("button", name="Test the model").click()
    expect(page.locator(".check-result").first).to_contain_text("✓")
    ui.shot("settings")
    # The key is in the keyring, in no file of ours.
    files = [p for p in ui.server.home.rglob("*") if p.is_file()]
    assert files and all(SECRET.encode() not in p.read_bytes() for p in files)

    # Dark theme on request: the toggle cycles auto -> light -> dark and changes the colours.
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.locator("#theme").click()
    page.locator("#theme").click()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != light
    ui.shot("settings-dark")


def test_narrow_window_has_no_horizontal_overflow(browser: Browser, server: WebServer, shots: Path) -> None:
    with open_page(browser, server, shots, width=480) as view:
        _check_narrow(view)


def _check_narrow(view: UI) -> None:
    question = "NEEDLE-WEB: a narrow look"
    with view.server.api() as api:
        started = api.post("/api/runs", json={"question": question, "context_text": ["The secret code is NARROW7."]})
    run_id = started.json()["run_id"]
    view.login()
    for route, heading in [("#/workbench", "Workbench"), ("#/runs", "Runs"), ("#/volumes", "Volumes"),
                           ("#/settings", "Settings"), (f"#/runs/{run_id}", question)]:  # fmt: skip
        view.go(route)
        expect(view.page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        if route.endswith(run_id):
            expect(view.page.locator(".answer")).to_have_text("NARROW7", timeout=60_000)
            view.page.get_by_role("tab", name="Timeline").click()
            expect(view.page.locator("svg.timeline")).to_be_visible()
        view.page.wait_for_load_state("networkidle")
        width = view.page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"{route} overflows a 480 px window: {width[0]} px wide"
    view.shot("narrow-inspector")
    assert view.errors == [], "\n".join(view.errors)


def test_page_heading_takes_focus_without_a_ring_and_controls_use_the_ui_font(ui: UI) -> None:
    """What a page shows on load: focus moves to its heading (screen readers start there) without drawing
    a ring around it, and every control, the file input's button too, is in the UI's font, not serif."""
    page = ui.page
    ui.login()
    for route, heading in (("#/workbench", "Workbench"), ("#/volumes", "Volumes"), ("#/settings", "Settings")):
        ui.go(route)
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_focused()
        ring = page.evaluate("(s => [s.outlineStyle, s.outlineWidth])(getComputedStyle(document.activeElement))")
        assert ring[0] == "none" or ring[1] == "0px", f"{route}: the heading is drawn with a focus ring {ring}"
        fonts = page.evaluate("""() => [...document.querySelectorAll('main :is(button, input, select, textarea)')]
            .map(el => [el.outerHTML.slice(0, 60), getComputedStyle(el).fontFamily,
                        el.type === 'file' ? getComputedStyle(el, '::file-selector-button').fontFamily : null])""")
        ui_font = page.evaluate("getComputedStyle(document.body).fontFamily")
        assert fonts, f"{route} has no controls to check"
        for control, font, file_button in fonts:
            assert font == ui_font and file_button in (None, ui_font), (
                f"{route}: {control} is in {font} / {file_button}"
            )
    page.keyboard.press("Tab")  # a keyboard user still sees where focus is
    ring = page.evaluate("(s => [s.outlineStyle, s.outlineWidth])(getComputedStyle(document.activeElement))")
    assert ring[0] != "none" and ring[1] != "0px", ring


def test_token_form_when_not_signed_in(browser: Browser, server: WebServer, shots: Path) -> None:
    with open_page(browser, server, shots) as view:
        page = view.page
        _sign_in_with_the_form(page, server)
        # Refused requests are logged by the browser itself; nothing else may be.
        assert [e for e in view.errors if "401" not in e] == [], "\n".join(view.errors)


def _sign_in_with_the_form(page: Page, server: WebServer) -> None:
    page.goto(server.base + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Token").fill("not-the-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not accepted")
    page.get_by_label("Token").fill(server.token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Workbench", exact=True)).to_be_visible()
