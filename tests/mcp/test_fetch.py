"""The run tools over web pages and repositories, through a real MCP client (both protocol eras),
against a web site and a smart-HTTP git server on 127.0.0.1 allowed by the test's setting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mcp import Client
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.web_site import REPORT, Site, page_and_repo

pytestmark = pytest.mark.anyio
PAGE = b"<html><body><p>Ringing code KR-17.</p><style>p{}</style></body></html>"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with page_and_repo(tmp_path, PAGE) as s:
        yield s


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_FETCH_ALLOWED_HOSTS", "127.0.0.1")


async def test_run_over_context_urls_and_a_repo(allowed: None, client: Client, oracle: OracleLM, site: Site) -> None:
    oracle.add(Scenario("what codes", [REPORT]))
    page, repo = site.url("page.html"), site.url("repo.git")
    messages: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    result = await client.call_tool(
        "run",
        {"question": "what codes?", "context_urls": [page], "repo_url": repo, "repo_ref": "v1"},
        progress_callback=on_progress,
    )
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["status"] == "succeeded"
    assert out["answer"] == f"{page} | {repo}@v1/NOTES.md || KR-17 TAG-1"
    assert any(m and m.startswith(f"fetched {page} (") for m in messages), messages


async def test_start_run_fetches_in_the_background(allowed: None, client: Client, oracle: OracleLM, site: Site) -> None:
    oracle.add(Scenario("what codes", [REPORT]))
    started = await client.call_tool("start_run", {"question": "what codes?", "context_urls": [site.url("page.html")]})
    assert not started.is_error, started.content
    run_id = started.structured_content["run_id"]  # type: ignore[index]
    with anyio.fail_after(60):
        while True:
            state = (await client.call_tool("get_run", {"run_id": run_id})).structured_content
            assert state is not None
            if state["status"] not in ("queued", "running"):
                break
            await anyio.sleep(0.1)
    assert state["status"] == "succeeded" and state["answer"] == f"{site.url('page.html')} || KR-17"


async def test_private_addresses_and_bad_urls_are_tool_errors(client: Client, oracle: OracleLM, site: Site) -> None:
    refused = await client.call_tool("run", {"question": "q", "context_urls": [site.url("page.html")]})
    assert refused.is_error
    text = refused.content[0].text  # type: ignore[union-attr]
    assert f"cannot fetch {site.url('page.html')}: 127.0.0.1 is not a public address" in text
    assert "fetch_allowed_hosts" in text
    bad = await client.call_tool("start_run", {"question": "q", "repo_url": "file:///etc", "repo_ref": "v1"})
    assert bad.is_error and "only http:// and https://" in bad.content[0].text  # type: ignore[union-attr]
    assert site.requests == [] and oracle.requests() == []
