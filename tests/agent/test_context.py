"""Pulling context in: web pages and repositories, checked on the host afterwards.

Loopback servers stand in for the web (no test leaves the machine), so each test allows 127.0.0.1 or
localhost explicitly, and the refusals are what happens without that."""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_rlm.agent import AgentHost
from fleet_rlm.agent.fetch import FetchRefused, check_url, fetch_text
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


# IPv6 addresses that carry an IPv4 address the network delivers to: loopback, the cloud metadata
# address and a private one, in every standard embedding.
EMBEDDED_PRIVATE = [
    "::127.0.0.1",  # IPv4-compatible (deprecated, still parsed)
    "::ffff:169.254.169.254",  # IPv4-mapped
    "64:ff9b::7f00:1",  # NAT64 well-known prefix
    "64:ff9b:1::a01:203",  # NAT64 local-use prefix (10.1.2.3)
    "64:ff9b:1::808:808",  # local-use: never public, whatever it carries
    "2002:a9fe:a9fe::1",  # 6to4 (169.254.169.254)
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo (client 127.0.0.1)
    "::ffff:0:7f00:1",  # IPv4-translated (SIIT, ::ffff:0:0/96): is_global is true for it
    "::ffff:0:a9fe:a9fe",  # IPv4-translated (169.254.169.254)
]
EMBEDDED_PUBLIC = ["::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", "::ffff:0:808:808"]
# IPv6 addresses outside global unicast (2000::/3) that ipaddress calls global: reserved or deprecated
# space (site-local fec0::/10, ::/8 beyond the IPv4 forms), which no public server answers from.
OUTSIDE_GLOBAL_UNICAST = ["fec0::1", "4000::1", "e000::1", "::1:0:0:1"]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
async def test_ipv6_addresses_embedding_a_private_ipv4_are_refused(
    agent_env: dict[str, str], site: int, address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FetchRefused, match="not a public address"):
        await fetch_text(f"http://[{address}]:{site}/page.html", load_settings())
    # The same address as a DNS answer for a name is checked the same way.
    resolve = socket.getaddrinfo

    def answer(host: object, *args: object, **kwargs: object) -> list:
        if host == "embedded.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, site, 0, 0))]
        return resolve(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", answer)
    with pytest.raises(FetchRefused, match="not a public address"):
        await check_url(f"http://embedded.example:{site}/page.html", load_settings())


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    """A loopback server on 127.0.0.1 and ::1 (one port) that records every request; yields (port, requests)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"reached")

    class V6(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # mapped addresses reach it too
            super().server_bind()

    server = V6(("::", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE + OUTSIDE_GLOBAL_UNICAST)
async def test_a_loopback_server_gets_nothing_through_an_ipv6_form(
    agent_env: dict[str, str], listener: tuple[int, list[str]], address: str
) -> None:
    port, seen = listener
    with pytest.raises(FetchRefused, match="not a public address"):
        await fetch_text(f"http://[{address}]:{port}/secret", load_settings())
    assert seen == []


@pytest.mark.parametrize("address", OUTSIDE_GLOBAL_UNICAST)
async def test_ipv6_outside_global_unicast_is_refused_unless_allowed(
    agent_env: dict[str, str], address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FetchRefused, match="not a public address"):
        await check_url(f"http://[{address}]/", load_settings())
    monkeypatch.setenv("FLEET_AGENT_ALLOWED_HOSTS", f"{address}/128")
    assert (await check_url(f"http://[{address}]/", load_settings())).address == address


NOT_PUBLIC_V4 = st.one_of(
    *(
        st.ip_addresses(network=net)
        for net in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                    "100.64.0.0/10", "0.0.0.0/8", "198.18.0.0/15", "240.0.0.0/4")
    )
)  # fmt: skip
# Every way an IPv6 address carries an IPv4 one that the network may deliver to.
EMBED = {
    "mapped": lambda v4: (0xFFFF << 32) | v4,  # ::ffff:a.b.c.d
    "translated": lambda v4: (0xFFFF << 48) | v4,  # ::ffff:0:a.b.c.d
    "compatible": lambda v4: v4,  # ::a.b.c.d
    "nat64": lambda v4: (0x64FF9B << 96) | v4,  # 64:ff9b::a.b.c.d
    "nat64-local": lambda v4: (0x64FF9B0001 << 80) | v4,  # 64:ff9b:1::a.b.c.d
    "6to4": lambda v4: (0x2002 << 112) | (v4 << 80) | 1,  # 2002:AABB:CCDD::1
    "teredo-client": lambda v4: (0x20010000 << 96) | (0x08080808 << 64) | (v4 ^ 0xFFFFFFFF),
    "teredo-server": lambda v4: (0x20010000 << 96) | (v4 << 64) | 0x7EFFFFFF,
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(v4=NOT_PUBLIC_V4, form=st.sampled_from(sorted(EMBED)))
def test_every_ipv6_form_of_a_non_public_ipv4_is_refused(
    agent_env: dict[str, str], v4: ipaddress.IPv4Address, form: str
) -> None:
    address = ipaddress.IPv6Address(EMBED[form](int(v4)))
    with pytest.raises(FetchRefused, match="not a public address"):
        asyncio.run(check_url(f"http://[{address}]/", load_settings()))


@pytest.mark.parametrize("address", EMBEDDED_PUBLIC)
async def test_ipv6_addresses_embedding_a_public_ipv4_pass(agent_env: dict[str, str], address: str) -> None:
    target = await check_url(f"http://[{address}]/", load_settings())
    assert target.address == str(ipaddress.ip_address(address))


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
