"""The one-file HTML trace: served by the API as a download, and opened by chromium from file:// offline."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Request, Route, expect, sync_playwright

from tests.cli.test_cli import cli
from tests.support.oracle_lm import OracleLM, Scenario
from tests.web.conftest import BASE, wait_finished
from tests.web.test_browser import CHROMIUM, UI, _require_chromium
from tests.web.test_fork_browser import QUESTION, browser, fork_oracle, server, ui  # noqa: F401 (fixtures)

HOSTILE = "</script><script>document.title='PWNED'</script><img src=https://example.invalid/x.png>"


@pytest.mark.anyio
async def test_export_html_is_a_token_protected_download(client: httpx.AsyncClient) -> None:
    started = await client.post("/api/runs", json={"question": "quick question", "context_text": ["some text"]})
    run_id = (await wait_finished(client, started.json()["run_id"]))["run_id"]
    got = await client.get(f"/api/runs/{run_id[-6:]}/export.html")  # any run reference, like every route
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/html")
    assert got.headers["content-disposition"] == f'attachment; filename="{run_id}.html"'
    assert "quick question" in got.text and "default-src 'none'" in got.text
    bare = httpx.AsyncClient(transport=client._transport, base_url=BASE)  # same app, no token
    async with bare:
        assert (await bare.get(f"/api/runs/{run_id}/export.html")).status_code == 401
    missing = await client.get("/api/runs/r0000000000000000/export.html")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


@pytest.mark.slow
def test_exported_file_renders_offline_from_file_url(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    _require_chromium()
    oracle.add(Scenario("OFFLINE-EXPORT", [f"print({HOSTILE!r})", "SUBMIT('offline answer 42')"]))
    run = cli("run", "OFFLINE-EXPORT: can you read me offline?", "--json", env=fleet_env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["status"] == "succeeded"
    page_file = tmp_path / "trace.html"
    exported = cli("export", "last", "--html", str(page_file), env=fleet_env)
    assert exported.returncode == 0, exported.stderr
    url = page_file.as_uri()

    left: list[str] = []  # every request other than the file itself, whether or not routing saw it
    errors: list[str] = []

    def only_the_file(route: Route) -> None:
        if route.request.url == url:
            route.continue_()
        else:
            route.abort()

    def seen(request: Request) -> None:
        if request.url != url:
            left.append(request.url)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--disable-background-networking"])
        try:
            page = browser.new_page()
            page.route("**/*", only_the_file)
            page.on("request", seen)
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            expect(page.locator("#question")).to_have_text("OFFLINE-EXPORT: can you read me offline?")
            expect(page.locator("#answer")).to_have_text("offline answer 42")
            expect(page.locator("#status")).to_have_text("succeeded")
            first = page.locator("details.step").first
            expect(page.locator("details.step")).to_have_count(2)
            expect(first.locator("pre.output")).to_be_hidden()
            first.locator("summary").click()
            expect(first.locator("pre.output")).to_have_text(HOSTILE)  # shown as text, not run as markup
            expect(page.locator("#usage")).to_contain_text("openai/oracle")
            expect(page.locator("#usage thead")).to_contain_text("of them cached")  # the prompt-cache figures
            expect(page.locator("#timeline svg rect").first).to_be_attached()
            assert page.title().startswith("fleet-rlm run: OFFLINE-EXPORT")
            assert page.locator("img").count() == 0
        finally:
            browser.close()
    assert left == [], f"the page made requests: {left}"
    assert errors == [], f"console errors: {errors}"


@pytest.mark.slow
def test_run_page_html_button_saves_the_file(ui: UI) -> None:  # noqa: F811 (the fixture imported above)
    page = ui.page
    with ui.server.api() as api:
        run_id = api.post("/api/runs", json={"question": QUESTION, "context_text": ["x"]}).json()["run_id"]
    ui.login(f"#/runs/{run_id}")
    expect(page.locator(".answer")).to_have_text("42", timeout=60_000)
    with page.expect_download() as download:
        page.get_by_role("link", name="HTML", exact=True).click()
    assert download.value.suggested_filename == f"{run_id}.html"
    saved = Path(download.value.path()).read_text()
    assert QUESTION in saved and "default-src 'none'" in saved
