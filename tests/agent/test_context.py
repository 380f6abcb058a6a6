"""Pulling context in: web pages and repositories, checked on the host afterwards.

Loopback servers stand in for the web (no test leaves the machine), so each test allows 127.0.0.1 or
localhost explicitly (by the setting's older name, agent_allowed_hosts, which is still read), and the
refusals are what happens without that. The fetch policy's own tests (every IPv6 form of a private
address) are tests/core/test_fetch_policy.py: runs and the agent share it."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from fleet_rlm.agent import AgentHost
from fleet_rlm.agent.fetch import FetchRefused, fetch_text
from fleet_rlm.agent.repo import add_repo
from fleet_rlm.config import Settings, load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.volume_operations import VolumeOperations
from fleet_rlm.volumes import LocalVolumes
from tests.support.agent_lm import AgentLM, Call, Policy, Say

pytestmark = pytest.mark.anyio
PAGE = (
    b"<html><head><title>t</title><script>alert('x')</script></head><body><h1>Kestrels</h1>"
    b"<p>Kestrels hover while hunting.</p></body></html>"
)


@contextmanager
def serve(folder: Path, redirect_to: str | None = None) -> Iterator[int]:
    """A static file server on 127.0.0.1 (``/away`` redirects to ``redirect_to``); yields its port."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            if self.path == "/away" and redirect_to:
                self.send_response(302)
                self.send_header("Location", redirect_to)
                self.end_headers()
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "page.html").write_bytes(PAGE)
    with serve(tmp_path / "site") as port:
        yield port


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/page.html",
        "http://localhost:{port}/page.html",
        "http://[::1]:{port}/page.html",
        "http://169.254.169.254/latest/meta-data",
        "http://10.1.2.3/",
        "file:///etc/passwd",
        "ftp://example.org/x",
    ],
)
async def test_private_and_odd_addresses_are_refused(agent_env: dict[str, str], site: int, url: str) -> None:
    with pytest.raises(FetchRefused):
        await fetch_text(url.format(port=site), load_settings())


async def test_allowed_host_is_fetched_as_text_and_a_redirect_is_checked_again(
    agent_env: dict[str, str], site: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEET_AGENT_ALLOWED_HOSTS", "localhost")
    text, final = await fetch_text(f"http://localhost:{site}/page.html", load_settings())
    assert "Kestrels hover while hunting." in text and "alert" not in text and final.endswith("/page.html")
    # Allowed by name; a redirect to the same server by address is a new hop, checked again.
    redirecting = serve(tmp_path / "site", redirect_to=f"http://127.0.0.1:{site}/page.html")
    with redirecting as port, pytest.raises(FetchRefused, match="not a public address"):
        await fetch_text(f"http://localhost:{port}/away", load_settings())


async def test_agent_fetches_a_page_into_buffers_after_approval(
    engine: Engine, agent_lm: AgentLM, site: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.settings.agent_allowed_hosts = "127.0.0.1"
    agent_lm.add(
        Policy(
            "read the kestrel page",
            [
                Call("add_context_from_url", {"url": f"http://127.0.0.1:{site}/page.html", "name": "kestrels"}),
                Say(lambda r: f"Done: {r.result}"),
            ],
        )
    )
    host = AgentHost.of(engine)
    conv = await host.create_conversation()
    paused = await host.chat(conv.id, "read the kestrel page")
    assert paused.pending[0].tool == "add_context_from_url" and "network access" in paused.pending[0].summary
    _, feed = await host.answer(paused.pending[0].id, True, actor="test")
    done = await feed.outcome()
    assert "vol:workspace/buffers/kestrels.txt" in done.reply
    saved = engine.settings.volumes_root / "workspace" / "buffers" / "kestrels.txt"
    assert "Kestrels hover while hunting." in saved.read_text()


def git(*args: str, cwd: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd),
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def repo_site(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A repository with a link pointing out of it and a submodule, served over dumb HTTP."""
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("TOPSECRET host file")
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "README.md").write_text("# Kestrel tracker\n")
    (work / "src").mkdir()
    (work / "src" / "main.py").write_text("print('kestrel')\n")
    (work / "escape").symlink_to(secret)
    (work / ".gitmodules").write_text('[submodule "vendor"]\n\tpath = vendor\n\turl = http://127.0.0.1:9/vendor.git\n')
    git("add", "-A", cwd=work)
    git("update-index", "--add", "--cacheinfo", "160000,1111111111111111111111111111111111111111,vendor", cwd=work)
    git("commit", "-q", "-m", "init", cwd=work)
    site = tmp_path / "served"
    site.mkdir()
    git("clone", "-q", "--bare", str(work), str(site / "tracker.git"), cwd=tmp_path)
    git("update-server-info", cwd=site / "tracker.git")
    with serve(site) as port:
        yield port, secret


def volume_operations(settings: Settings) -> VolumeOperations:
    return VolumeOperations(lambda: LocalVolumes.from_settings(settings))


async def test_repo_is_cloned_without_links_or_submodules(
    agent_env: dict[str, str], repo_site: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, secret = repo_site
    url = f"http://127.0.0.1:{port}/tracker.git"
    with pytest.raises(FetchRefused):  # loopback, unless allowed
        await add_repo(url, None, load_settings(), volume_operations(load_settings()), "ws", "buffers/t")
    monkeypatch.setenv("FLEET_AGENT_ALLOWED_HOSTS", "127.0.0.0/8")
    settings = load_settings()
    copied = await add_repo(url, "main", settings, volume_operations(settings), "ws", "buffers/tracker")
    root = settings.volumes_root / "ws" / "buffers" / "tracker"
    assert (root / "src" / "main.py").read_text() == "print('kestrel')\n" and copied.files >= 3
    files = [p for p in root.rglob("*") if p.is_file() or p.is_symlink()]
    assert not any(p.is_symlink() for p in files)
    assert all("TOPSECRET" not in p.read_text(errors="replace") for p in files)  # the link was never followed
    assert not any(root.joinpath("vendor").rglob("*"))  # the submodule was not fetched
    assert secret.read_text() == "TOPSECRET host file"
    assert not any(settings.work_root.glob("agent-clone-*"))  # the scratch clone is gone


async def test_repo_past_the_size_limit_is_refused(
    agent_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "big"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "blob.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "big", cwd=work)
    site = tmp_path / "served"
    site.mkdir()
    git("clone", "-q", "--bare", str(work), str(site / "big.git"), cwd=tmp_path)
    git("update-server-info", cwd=site / "big.git")
    monkeypatch.setenv("FLEET_AGENT_ALLOWED_HOSTS", "127.0.0.1")
    monkeypatch.setenv("FLEET_AGENT_FETCH_MAX_MB", "1")
    settings = load_settings()
    with serve(site) as port, pytest.raises(FetchRefused, match="larger than"):
        await add_repo(
            f"http://127.0.0.1:{port}/big.git",
            None,
            settings,
            volume_operations(settings),
            "ws",
            "buffers/big",
        )
    assert not (settings.volumes_root / "ws" / "buffers" / "big").exists()
