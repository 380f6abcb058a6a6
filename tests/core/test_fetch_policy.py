"""The one fetch policy (core/inputs/fetch.py) that runs, the agent and the web share: public addresses
only, in every way an address can be written, unless a setting allows a host; the checked address is
the one connected to. Moved here from the agent's tests when the policy moved below core."""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_rlm.config import load_settings
from fleet_rlm.core.inputs.fetch import FetchRefused, check_policy, check_url, fetch

pytestmark = pytest.mark.anyio


async def get(url: str) -> bytes:
    page = await fetch(url, load_settings(), max_mb=1, limit_setting="fetch_max_mb", accept="*/*")
    return page.body


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
    fleet_env: dict[str, str], address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FetchRefused, match="not a public address"):
        await check_url(f"http://[{address}]:9/page.html", load_settings())
    # The same address as a DNS answer for a name is checked the same way.
    resolve = socket.getaddrinfo

    def answer(host: object, *args: object, **kwargs: object) -> list:
        if host == "embedded.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, 9, 0, 0))]
        return resolve(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", answer)
    with pytest.raises(FetchRefused, match="not a public address"):
        await check_url("http://embedded.example:9/page.html", load_settings())


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE + OUTSIDE_GLOBAL_UNICAST)
async def test_a_loopback_server_gets_nothing_through_an_ipv6_form(
    fleet_env: dict[str, str], listener: tuple[int, list[str]], address: str
) -> None:
    port, seen = listener
    with pytest.raises(FetchRefused, match="not a public address"):
        await get(f"http://[{address}]:{port}/secret")
    assert seen == []


@pytest.mark.parametrize("setting", ["FLEET_FETCH_ALLOWED_HOSTS", "FLEET_AGENT_ALLOWED_HOSTS"])  # and its old name
@pytest.mark.parametrize("address", OUTSIDE_GLOBAL_UNICAST)
async def test_ipv6_outside_global_unicast_is_refused_unless_allowed(
    fleet_env: dict[str, str], address: str, setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FetchRefused, match="not a public address"):
        await check_url(f"http://[{address}]/", load_settings())
    monkeypatch.setenv(setting, f"{address}/128")
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
    fleet_env: dict[str, str], v4: ipaddress.IPv4Address, form: str
) -> None:
    address = ipaddress.IPv6Address(EMBED[form](int(v4)))
    with pytest.raises(FetchRefused, match="not a public address"):
        asyncio.run(check_url(f"http://[{address}]/", load_settings()))
    with pytest.raises(FetchRefused, match="not a public address"):  # admission's check, without DNS, too
        check_policy(f"http://[{address}]/", load_settings())


@pytest.mark.parametrize("address", EMBEDDED_PUBLIC)
async def test_ipv6_addresses_embedding_a_public_ipv4_pass(fleet_env: dict[str, str], address: str) -> None:
    target = await check_url(f"http://[{address}]/", load_settings())
    assert target.address == str(ipaddress.ip_address(address))


async def test_an_allowed_host_is_reached_at_the_checked_address(
    fleet_env: dict[str, str], listener: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, seen = listener
    with pytest.raises(FetchRefused, match="fetch_allowed_hosts"):
        await get(f"http://127.0.0.1:{port}/a")
    monkeypatch.setenv("FLEET_FETCH_ALLOWED_HOSTS", "127.0.0.1")
    assert await get(f"http://127.0.0.1:{port}/a") == b"reached"
    with pytest.raises(FetchRefused, match="not a public address"):  # allowed is one address, not loopback
        await get(f"http://[::1]:{port}/b")
    assert seen == ["/a"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost:8080/",
        "http://app.localhost/",
        "http://[::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/",
    ],
)
def test_the_policy_without_dns_refuses_what_a_url_says_outright(fleet_env: dict[str, str], url: str) -> None:
    """Admission's check: a host written as an address, or named localhost, needs no name lookup."""
    with pytest.raises(FetchRefused, match="not a public address"):
        check_policy(url, load_settings())


def test_the_policy_without_dns_lets_allowed_and_named_hosts_through(
    fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check_policy("https://example.org/page", load_settings())  # a name: resolved and checked when fetched
    check_policy("http://8.8.8.8/", load_settings())
    monkeypatch.setenv("FLEET_FETCH_ALLOWED_HOSTS", "localhost, 10.0.0.0/8")
    check_policy("http://localhost:8080/", load_settings())
    check_policy("http://10.2.3.4/", load_settings())
    with pytest.raises(FetchRefused):
        check_policy("http://192.168.1.1/", load_settings())
