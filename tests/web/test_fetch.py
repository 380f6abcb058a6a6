"""POST /api/runs with context_urls, repo_url and repo_ref, through the app, against a web site and a
smart-HTTP git server on 127.0.0.1 that the test allows explicitly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.web_site import REPORT, Site, page_and_repo
from tests.web.conftest import wait_finished

pytestmark = pytest.mark.anyio


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with page_and_repo(tmp_path, b"<html><body><p>Ringing code KR-17.</p></body></html>") as s:
        yield s


async def test_a_run_over_a_page_and_a_repo(
    client: httpx.AsyncClient, oracle: OracleLM, site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_FETCH_ALLOWED_HOSTS", "127.0.0.1")  # read with the settings at each run
    oracle.add(Scenario("what codes", [REPORT]))
    page, repo = site.url("page.html"), site.url("repo.git")
    body = {"question": "what codes?", "context_urls": [page], "repo_url": repo, "repo_ref": "v1"}
    started = await client.post("/api/runs", json=body)
    assert started.status_code == 202, started.text
    done = await wait_finished(client, started.json()["run_id"])
    assert done["status"] == "succeeded", done
    assert done["answer"] == f"{page} | {repo}@v1/NOTES.md || KR-17 TAG-1"


async def test_a_private_address_is_a_400_before_a_run(client: httpx.AsyncClient, site: Site) -> None:
    refused = await client.post("/api/runs", json={"question": "q", "context_urls": [site.url("page.html")]})
    assert refused.status_code == 400
    assert refused.json()["message"].startswith(f"cannot fetch {site.url('page.html')}: 127.0.0.1 is not a public")
    bad = await client.post("/api/runs", json={"question": "q", "repo_url": "ftp://example.org/r.git"})
    assert bad.status_code == 400 and "only http:// and https://" in bad.json()["message"]
    assert (await client.get("/api/runs")).json()["runs"] == [] and site.requests == []
