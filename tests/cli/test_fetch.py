"""`fleet-rlm run --context URL` and `--repo URL@REF` as subprocesses, against a web site and a smart-HTTP
git server on 127.0.0.1 that the test allows explicitly (FLEET_FETCH_ALLOWED_HOSTS); without it, the
same URLs are refused before a run exists."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli import cli
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.web_site import REPORT, Site, page_and_repo

PAGE = b"<html><body><h1>Kestrels</h1><script>x='SCRIPT-1'</script><p>Ringing code KR-17.</p></body></html>"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with page_and_repo(tmp_path, PAGE) as s:
        yield s


def test_run_over_a_page_and_a_repo_at_a_tag(fleet_env: dict[str, str], oracle: OracleLM, site: Site) -> None:
    oracle.add(Scenario("what codes", [REPORT]))
    env = {**fleet_env, "FLEET_FETCH_ALLOWED_HOSTS": "127.0.0.1"}
    page, repo = site.url("page.html"), site.url("repo.git")
    proc = cli("run", "what codes?", "--context", page, "--repo", f"{repo}@v1", "--trace-mode", "compact", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{page} | {repo}@v1/NOTES.md || KR-17 TAG-1"
    # What was fetched is said on stderr, with its size, before the context report.
    assert f"fetched {page} ({len(PAGE):,} bytes, HTTP 200, " in proc.stderr
    assert f"fetched {repo}@v1 (1 files, " in proc.stderr
    assert proc.stderr.index("fetched ") < proc.stderr.index("context: 2 source(s)")
    events = [json.loads(line) for line in cli("export", "last", env=env).stdout.splitlines()]
    assert [e["data"]["name"] for e in events if e["kind"] == "context.fetched"] == [page, f"{repo}@v1"]


@pytest.mark.parametrize("how", ["context", "repo"])
def test_a_private_address_is_refused_without_the_setting(fleet_env: dict[str, str], site: Site, how: str) -> None:
    url = site.url("page.html") if how == "context" else site.url("repo.git")
    proc = cli("run", "what codes?", f"--{how}", url + ("@v1" if how == "repo" else ""), env=fleet_env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        f"error: cannot fetch {url}: 127.0.0.1 is not a public address: fleet-rlm does not fetch from this "
        "machine or private networks (add the host to fetch_allowed_hosts to allow it)"
    ), proc.stderr
    assert site.requests == []
    assert json.loads(cli("runs", "--json", env=fleet_env).stdout) == []  # refused before a run existed


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--context", "ftp://example.org/x"], "only http:// and https://"),
        (["--context", "file:///etc/passwd"], "only http:// and https://"),
        (["--context", "https://user:pw@example.org/"], "user name or password"),
        (["--repo", "ftp://example.org/r.git"], "only http:// and https://"),
        (["--repo", "https://example.org/r.git@--upload-pack=x"], "not a branch or tag name"),
    ],
)
def test_malformed_urls_are_user_errors(fleet_env: dict[str, str], args: list[str], said: str) -> None:
    proc = cli("run", "q", *args, env=fleet_env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
