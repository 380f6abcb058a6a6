"""Web pages and repositories as a run's context, through the engine, against a web site and a git
server on 127.0.0.1 (tests/support/web_site.py) that each test allows explicitly: staged under their
URLs, fetched events recorded, and every refusal or failure a sentence, never an internal error."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from fleet_rlm.core.engine import Engine
from fleet_rlm.errors import UserError
from fleet_rlm.types import PAYLOADS, RunRequest
from tests.support.documents import pdf
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.web_site import REPORT, Site, make_repo

pytestmark = pytest.mark.anyio
PAGE = (
    b"<html><head><title>Kestrels</title><script>var leak = 'SCRIPT-1';</script></head><body>"
    b"<h1>Kestrels</h1><p>The ringing code of the kestrel is KR-17.</p></body></html>"
)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    served = tmp_path / "served"
    served.mkdir()
    (served / "page.html").write_bytes(PAGE)
    (served / "notes.txt").write_text("Field notes: falcon code FN-3.\n")
    (served / "docs").mkdir()
    (served / "docs" / "report.pdf").write_bytes(pdf(["Page one says PDF-1.", "Page two says PDF-2."]))
    make_repo(
        served,
        "tracker.git",
        tagged={"README.md": "# Tracker\nrelease code TAG-1\n", "src/main.py": "CODE = 'SRC-1'\n"},
        later={"README.md": "# Tracker\nrelease code MAIN-2\n"},
    )
    (served / "article").write_bytes(PAGE.replace(b"KR-17", b"AR-5"))  # no suffix: the type says what it is
    (served / "pdf").mkdir()
    (served / "pdf" / "2512").write_bytes(pdf(["An arXiv-style address: ARX-9."]))
    types = {"/article": "text/html", "/pdf/2512": "application/pdf"}
    with Site(served, redirects={"/away": "http://10.1.2.3/secret"}, types=types) as s:
        yield s


@pytest.fixture
def allowed(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("FLEET_FETCH_ALLOWED_HOSTS", "127.0.0.1")
    return fleet_env


async def test_a_page_and_a_repo_at_a_tag_are_staged_under_their_urls(
    allowed: dict[str, str], oracle: OracleLM, site: Site
) -> None:
    oracle.add(Scenario("what codes", [REPORT]))
    page, notes, repo = site.url("page.html"), site.url("notes.txt"), site.url("tracker.git")
    async with Engine() as engine:
        result = await engine.run(
            RunRequest("what codes are there?", context_urls=[page, notes], repo_url=repo, repo_ref="v1")
        )
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    names, codes = (result.answer or "").split(" || ")
    assert names.split(" | ") == [page, notes, f"{repo}@v1/README.md", f"{repo}@v1/src/main.py"]
    # The page as text (its script dropped), the repository at the tag, not at main's later commit.
    assert codes.split() == ["KR-17", "FN-3", "TAG-1", "SRC-1"]
    fetched = [e["data"] for e in events if e["kind"] == "context.fetched"]
    assert [(f["kind"], f["name"]) for f in fetched] == [("page", page), ("page", notes), ("repo", f"{repo}@v1")]
    assert (
        fetched[0]["status"] == 200 and fetched[0]["bytes"] == len(PAGE) and fetched[0]["content_type"] == "text/html"
    )
    assert fetched[2]["files"] == 2 and fetched[2]["ref"] == "v1"
    for data in fetched:
        TypeAdapter(PAYLOADS["context.fetched"]).validate_python(data)
    loaded = next(e["data"] for e in events if e["kind"] == "context.loaded")
    assert loaded["sources"] == 4
    assert [e["kind"] for e in events].index("context.fetched") < [e["kind"] for e in events].index("context.loaded")
    assert list(engine.settings.work_root.glob("*/fetched")) == []  # gone with the run's scratch folder
    # Smart HTTP served a shallow clone of one ref: the pack was asked for once, after the ref list.
    assert next(p for p in site.requests if "tracker.git" in p).endswith("info/refs?service=git-upload-pack")


async def test_a_pdf_page_is_converted_with_its_pages(allowed: dict[str, str], oracle: OracleLM, site: Site) -> None:
    oracle.add(
        Scenario(
            "which pages",
            [
                "parts = sources[0]['parts']\n"
                "pages = [(p['n'], context[p['start']:p['end']].split('---')[-1].strip()) for p in parts]\n"
                "SUBMIT(repr(pages))"
            ],
        )
    )
    async with Engine() as engine:
        result = await engine.run(RunRequest("which pages?", context_urls=[site.url("docs/report.pdf")]))
    assert result.status == "succeeded", result.error
    assert result.answer == repr([(1, "Page one says PDF-1."), (2, "Page two says PDF-2.")])


async def test_pages_at_addresses_without_a_suffix_are_converted_by_their_type(
    allowed: dict[str, str], oracle: OracleLM, site: Site
) -> None:
    oracle.add(Scenario("what codes", [REPORT]))
    article, paper = site.url("article"), site.url("pdf/2512")
    async with Engine() as engine:
        result = await engine.run(RunRequest("what codes are there?", context_urls=[article, paper]))
        loaded = next(e["data"] for e in engine.events(result.run_id) if e["kind"] == "context.loaded")
    assert result.status == "succeeded", result.error
    assert result.answer == f"{article} | {paper} || AR-5 ARX-9"  # the script's SCRIPT-1 never reached the text
    assert (loaded["documents"], loaded["pages"]) == (2, 1)  # the PDF converted at staging, its page kept


async def test_a_loopback_url_is_refused_before_a_run_exists(fleet_env: dict[str, str], site: Site) -> None:
    async with Engine() as engine:
        for url in (site.url("page.html"), site.url("page.html", host="localhost"), "http://[::1]:9/x"):
            with pytest.raises(UserError, match=r"cannot fetch .*not a public address.*fetch_allowed_hosts"):
                await engine.start_run(RunRequest("q", context_urls=[url]))
        with pytest.raises(UserError, match="cannot fetch"):
            await engine.start_run(RunRequest("q", repo_url=site.url("tracker.git"), repo_ref="v1"))
        assert engine.list_runs() == []
    assert site.requests == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("missing.html", "answered HTTP 404"),
        ("away", "10.1.2.3 is not a public address"),  # a redirect is a new hop, checked again
        ("tracker.git@nope", "cloning .* failed: "),
    ],
)
async def test_a_failed_fetch_fails_the_run_with_the_reason(
    allowed: dict[str, str], oracle: OracleLM, site: Site, path: str, reason: str
) -> None:
    oracle.add(Scenario("q", ["SUBMIT('never')"]))
    url, _, ref = site.url(path).partition("@")
    req = RunRequest("q", repo_url=url, repo_ref=ref) if ref else RunRequest("q", context_urls=[url])
    async with Engine() as engine:
        result = await engine.run(req)
        kinds = [e["kind"] for e in engine.events(result.run_id)]
    assert result.status == "failed" and result.error is not None
    assert result.error.startswith(f"cannot fetch {url}: ") and "internal" not in result.error
    assert re.search(reason, result.error), result.error
    assert "context.loaded" not in kinds and oracle.requests() == []  # no sandbox staged, no model asked


async def test_a_closed_port_is_a_clear_failure(allowed: dict[str, str], oracle: OracleLM) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/page.html"
    async with Engine() as engine:
        result = await engine.run(RunRequest("q", context_urls=[url]))
    assert result.status == "failed"
    assert result.error == f"cannot fetch {url}: could not be reached: connection refused"


def test_requests_check_their_urls_at_construction() -> None:
    for bad, said in [
        ("ftp://example.org/x", "only http:// and https://"),
        ("file:///etc/passwd", "only http:// and https://"),
        ("https://user:pw@example.org/", "user name or password"),
        ("https:///nohost", "no host"),
        ("http://example.org:99999/", "not a URL"),
        ("http://exa mple.org/", "not a URL"),
    ]:
        with pytest.raises(UserError, match=said):
            RunRequest("q", context_urls=[bad])
    with pytest.raises(UserError, match="ref without a repository"):
        RunRequest("q", repo_ref="v1")
    with pytest.raises(UserError, match="not a branch or tag"):
        RunRequest("q", repo_url="https://example.org/r.git", repo_ref="--upload-pack=evil")
    with pytest.raises(UserError, match="at most 20"):
        RunRequest("q", context_urls=[f"https://example.org/{i}" for i in range(21)])
    assert RunRequest("q", repo_url="https://example.org/r.git", repo_ref="release/1.2").repo_ref == "release/1.2"
