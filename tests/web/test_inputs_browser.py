"""What went in, in a real browser (Debian's chromium via Playwright, against `fleet web` with the real
sandbox, the real isolated document parser and the scripted model): the Workbench takes documents and
images as uploads and web pages and a repository in its fields, and the run shows an inputs panel,
counts, pages, images and each skipped file with its reason, in the Workbench and on the run page, in
light and dark themes. The pages and the repository come from a web and git server on 127.0.0.1
(tests/support/web_site.py), allowed by FLEET_FETCH_ALLOWED_HOSTS."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support import documents as make
from tests.support import tools_mcp_server
from tests.support.oracle_lm import OracleLM, Scenario, oracle_env
from tests.support.web_site import Site, make_repo
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import UI, _require_chromium, chromium, clean_page

pytestmark = pytest.mark.slow

NAMES = "print([s['name'] for s in sources])\nSUBMIT(' | '.join(s['name'].rsplit('/', 1)[-1] for s in sources))"
FETCHED = (
    "import re\nnames = [s['name'] for s in sources]\nprint(names)\n"
    "SUBMIT(' | '.join(sorted(names)) + ' :: ' + re.search(r'The tide is (\\w+)', context).group(1)"
    " + ' ' + re.search(r'release (\\w+)', context).group(1))"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    served = tmp_path_factory.mktemp("site")
    (served / "tide.html").write_text("<html><body><h1>Tides</h1><p>The tide is HIGH today.</p></body></html>")
    (served / "notes.pdf").write_bytes(make.pdf(["Harbour notes, page one.", "Page two."]))
    make_repo(served, "tool.git", {"README.md": "This is release ALPHA."}, {"README.md": "This is release BETA."})
    with Site(served) as s:
        yield s


@pytest.fixture(scope="module")
def inputs_oracle() -> Iterator[OracleLM]:
    tool = Scenario("TOOLS-WEB", ["SUBMIT(lab.shout(text='tick'))"])
    with OracleLM(Scenario("INPUTS-WEB", [NAMES]), Scenario("FETCH-WEB", [FETCHED]), tool) as lm:
        yield lm


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, inputs_oracle: OracleLM, site: Site) -> Iterator[WebServer]:
    _require_chromium()
    root = tmp_path_factory.mktemp("inputs-web")
    lab = {"command": sys.executable, "args": [tools_mcp_server.__file__, "stdio", str(root / "tool-calls.log")]}
    env = oracle_env(root, inputs_oracle.base_url) | {"FLEET_FETCH_ALLOWED_HOSTS": "127.0.0.1"}
    env["FLEET_MCP_SERVERS"] = json.dumps({"lab": lab})
    with fleet_web(root, env) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: WebServer) -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def ui(browser: Browser, server: WebServer, tmp_path: Path) -> Iterator[UI]:
    shots = Path(os.environ.get("FLEET_SCREENSHOTS") or tmp_path)  # as in test_browser.py
    shots.mkdir(parents=True, exist_ok=True)
    with clean_page(browser, server, shots) as view:
        yield view


def _inputs_shown(page: Page, where: str) -> None:
    panel = page.locator(f"{where} .inputs")
    expect(panel).to_be_visible()
    summary = panel.locator(".inputs-summary")
    expect(summary).to_contain_text("1 document (3 pages)")
    expect(summary).to_contain_text("1 image")
    expect(summary).to_contain_text("from 3 sources")
    expect(summary).to_contain_text("1 file skipped")
    skipped = panel.locator(".inputs-skipped")
    expect(skipped.locator("summary")).to_have_text("1 file skipped")
    expect(skipped.locator("li")).to_have_count(1)
    expect(skipped.locator("li")).to_contain_text("locked.pdf: encrypted (password-protected)")
    expect(skipped.locator("li")).to_be_visible()  # a few skips are shown open


def test_workbench_uploads_documents_and_images_and_the_run_shows_what_went_in(ui: UI, tmp_path: Path) -> None:
    page = ui.page
    files = make.write(
        tmp_path / "files",
        {
            "report.pdf": make.pdf(["Revenue rose.", "Costs fell.", "The margin is 12%."]),
            "photo.png": make.png(),
            "locked.pdf": make.pdf(["secret"], encrypted=True),
            "notes.txt": "Plain notes.",
        },
    )
    ui.login()
    picker = page.get_by_label("Choose files", exact=True)
    assert picker.get_attribute("accept") is None, "the file input must take any file: the server decides"
    expect(page.locator(".dropzone")).to_contain_text("documents")
    picker.set_input_files([str(files / n) for n in ("report.pdf", "photo.png", "locked.pdf", "notes.txt")])
    for name in ("report.pdf", "photo.png", "locked.pdf", "notes.txt"):
        expect(page.locator(".chip", has_text=name)).to_contain_text("ready", timeout=60_000)
    page.get_by_label("Question", exact=True).fill("INPUTS-WEB: which files did you read?")
    page.get_by_role("button", name="Run", exact=True).click()

    turn = page.locator("article.turn").first
    expect(turn.locator(".answer")).to_have_text(re.compile(r"report\.pdf|photo\.png|notes\.txt"), timeout=90_000)
    answer = turn.locator(".answer").inner_text()
    assert sorted(answer.split(" | ")) == ["notes.txt", "photo.png", "report.pdf"], answer
    _inputs_shown(page, "article.turn")
    report = turn.locator(".inputs-report")
    expect(report.locator("pre")).to_be_hidden()  # the size report waits behind its summary
    report.locator("summary").click()
    expect(report.locator("pre")).to_contain_text("(PDF, 3 pages)")
    ui.shot("workbench-inputs")

    # The run page shows the same panel, built from the same server view, in both themes.
    turn.get_by_role("link", name="Open in Runs").click()
    expect(page.locator(".answer")).to_have_text(answer, timeout=30_000)
    _inputs_shown(page, "main")
    ui.shot("run-inputs-light")
    page.emulate_media(color_scheme="dark")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    text = page.locator(".inputs-summary").evaluate("el => getComputedStyle(el).color")
    assert background == "rgb(17, 20, 24)" and text != background, (background, text)
    ui.shot("run-inputs-dark")


def test_many_skipped_files_are_counted_and_collapsed(ui: UI, tmp_path: Path) -> None:
    page = ui.page
    folder = make.write(
        tmp_path / "many", {"readme.txt": "Readable.", **{f"blob-{n}.bin": b"\x00\x01" * 8 for n in range(8)}}
    )
    with ui.server.api() as api:
        started = api.post("/api/runs", json={"question": "INPUTS-WEB: and these?", "context_paths": [str(folder)]})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
    ui.login(f"#/runs/{run_id}")
    expect(page.locator(".answer")).to_have_text("readme.txt", timeout=60_000)
    skipped = page.locator(".inputs .inputs-skipped")
    expect(page.locator(".inputs-summary")).to_have_text(
        re.compile(r"^[\d,]+ characters from 1 source · 8 files skipped$")
    )
    expect(skipped.locator("summary")).to_have_text("8 files skipped")
    expect(skipped.locator("li").first).to_be_hidden()  # many: collapsed
    skipped.locator("summary").click()
    expect(skipped.locator("li")).to_have_count(8)
    expect(skipped.locator("li").first).to_have_text(f"{folder}/blob-0.bin: binary")


def test_workbench_web_pages_and_a_repository_at_a_tag(ui: UI, site: Site) -> None:
    page = ui.page
    ui.login()
    page.get_by_label("Web pages", exact=True).fill(f"{site.url('tide.html')}\n\n  {site.url('notes.pdf')}  \n")
    page.get_by_label("Repository", exact=True).fill(site.url("tool.git"))
    page.get_by_label("Branch or tag", exact=True).fill("v1")
    page.get_by_label("Question", exact=True).fill("FETCH-WEB: the tide and the release?")
    ui.shot("workbench-pages-and-repository")
    page.get_by_role("button", name="Run", exact=True).click()
    turn = page.locator("article.turn").first
    expect(turn.locator(".answer")).to_contain_text(":: HIGH ALPHA", timeout=90_000)  # the tag, not main
    names = turn.locator(".answer").inner_text().split(" :: ")[0].split(" | ")
    assert site.url("tide.html") in names and site.url("notes.pdf") in names, names
    assert any(n.startswith(site.url("tool.git")) and n.endswith("README.md") for n in names), names
    expect(turn.locator(".inputs-summary")).to_contain_text("2 documents (2 pages)")  # the HTML page and the PDF
    expect(turn.locator(".inputs-summary")).to_contain_text("from 3 sources")
    # The fields are emptied for the next question, like the pasted text.
    expect(page.get_by_label("Web pages", exact=True)).to_have_value("")
    expect(page.get_by_label("Repository", exact=True)).to_have_value("")
    expect(page.get_by_label("Branch or tag", exact=True)).to_have_value("")


def test_a_ref_without_a_repository_is_refused_before_any_run(ui: UI) -> None:
    page = ui.page
    ui.login()
    page.get_by_label("Branch or tag", exact=True).fill("v1")
    page.get_by_label("Question", exact=True).fill("FETCH-WEB: nothing to fetch")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator(".form-status")).to_contain_text("A branch or tag needs its repository")
    expect(page.get_by_label("Repository", exact=True)).to_be_focused()
    expect(page.locator("article.turn")).to_have_count(0)


def test_workbench_mounts_the_mcp_servers_ticked(ui: UI) -> None:
    page = ui.page
    ui.login()
    box = page.get_by_role("checkbox", name=re.compile(r"^lab\b"))
    expect(box).not_to_be_checked()
    box.check()
    page.get_by_label("Pasted text", exact=True).fill("x")
    page.get_by_label("Question", exact=True).fill("TOOLS-WEB: shout through the tool")
    ui.shot("workbench-mcp-servers")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator("article.turn").first.locator(".answer")).to_contain_text("TICK", timeout=90_000)
