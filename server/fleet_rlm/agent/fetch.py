"""Fetching a web page as text for the agent, without letting it reach this machine or its network.

Every hop (the first URL and each redirect) is checked the same way: http or https only; the host name
is resolved once and every address it resolves to must be public (not loopback, private, link-local,
shared, multicast or reserved; an IPv6 address that is an IPv4 one written as IPv6, as mapped, translated,
compatible and NAT64 addresses are, is judged by that IPv4 address alone, one that carries IPv4 ones, as
6to4 and Teredo addresses do, by those too; any other IPv6 address must be global unicast, in 2000::/3)
unless ``agent_allowed_hosts`` names the
host or a network holding the address; the connection then goes to the address that was checked (the
name travels in the Host header and in TLS SNI, so certificates are still verified against it), so a
second DNS answer cannot point the request at our own servers. Bodies stop at ``agent_fetch_max_mb``.
HTML becomes plain text.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from fleet_rlm.errors import UserError

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

MAX_REDIRECTS = 5
TIMEOUT = 30.0
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT (RFC 2765): is_global is true for it
# IPv6 forms that are an IPv4 address written as IPv6: the IPv4 address is where a packet ends up.
IPV4_AS_IPV6 = (IPV4_MAPPED, IPV4_TRANSLATED, IPV4_COMPATIBLE, NAT64)
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")  # every public IPv6 address; ipaddress calls more global


class FetchRefused(UserError):
    """The agent may not fetch this (an address that is not public, a scheme, a size); the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (``address``) and what to ask for."""

    url: str
    scheme: str
    host: str
    port: int
    address: str


def allowed(settings: Settings) -> tuple[set[str], list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    """The host names and networks ``agent_allowed_hosts`` lets through although not public."""
    names: set[str] = set()
    networks = []
    for item in (settings.agent_allowed_hosts or "").split(","):
        item = item.strip().lower()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            names.add(item)
    return names, networks


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a global IPv6 address carries (6to4, Teredo server and client): a packet to it
    may be delivered to them, so each must be public too."""
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    return []


def _public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in form for form in IPV4_AS_IPV6):  # only the IPv4 address it is counts
            return _public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address not in GLOBAL_UNICAST or not all(_public(ipv4) for ipv4 in _embedded_ipv4(address)):
            # Outside 2000::/3: RFC 8215's local-use NAT64 prefix 64:ff9b:1::/48 too (translated inside one
            # network only, the IPv4 address at one of several places in it), so it never passes.
            return False
    return address.is_global and not address.is_multicast


async def check_url(url: str, settings: Settings, *, schemes: tuple[str, ...] = ("http", "https")) -> Target:
    """Resolve and check one URL; FetchRefused names what is wrong and how to allow it if it is ours."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise FetchRefused(f"'{url}': only {' and '.join(schemes)} URLs can be fetched")
    host = (parts.hostname or "").lower()
    if not host or parts.username or parts.password:
        raise FetchRefused(f"'{url}' has no host, or carries a user name or password: give a plain URL")
    port = parts.port or (443 if scheme == "https" else 80)
    names, networks = allowed(settings)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchRefused(f"cannot resolve '{host}': {exc.strerror or exc}") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))
    for address in addresses:
        if _public(address) or host in names or any(address in net for net in networks):
            continue
        raise FetchRefused(
            f"'{host}' resolves to {address}, which is not a public address: the agent does not fetch from "
            "this machine or private networks (add the host to agent_allowed_hosts to allow it)"
        )
    if not addresses:
        raise FetchRefused(f"'{host}' resolves to no address")
    return Target(url=url, scheme=scheme, host=host, port=port, address=str(addresses[0]))


async def fetch_text(url: str, settings: Settings) -> tuple[str, str]:
    """The page at ``url`` as text, and the URL it finally came from (after redirects)."""
    import httpx

    limit = settings.agent_fetch_max_mb * 1024 * 1024
    async with httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            target = await check_url(url, settings)
            parts = urlsplit(target.url)
            literal = f"[{target.address}]" if ":" in target.address else target.address
            pinned = parts._replace(netloc=f"{literal}:{target.port}").geturl()
            headers = {
                "Host": parts.netloc.rpartition("@")[2],
                "Accept": "text/html, text/plain;q=0.9, */*;q=0.1",
                "User-Agent": "fleet-rlm-agent",
            }
            extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
            request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
            response = await client.send(request, stream=True)
            try:
                if response.is_redirect and response.headers.get("location"):
                    url = urljoin(target.url, response.headers["location"])
                    continue
                if response.status_code >= 400:
                    raise FetchRefused(f"'{target.url}' answered HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise FetchRefused(
                            f"'{target.url}' is larger than {settings.agent_fetch_max_mb} MB (agent_fetch_max_mb)"
                        )
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                text = bytes(body).decode(response.encoding or "utf-8", errors="replace")
            finally:
                await response.aclose()
            if kind in ("text/html", "application/xhtml+xml"):
                return html_to_text(text), target.url
            if kind.startswith("text/") or kind in ("application/json", "application/xml", ""):
                return text, target.url
            raise FetchRefused(f"'{target.url}' is {kind}, not text: the agent only pulls in text pages")
    raise FetchRefused(f"'{url}' redirects more than {MAX_REDIRECTS} times")


class _Text(HTMLParser):
    SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head"})
    BLOCK = frozenset(
        {
            "p",
            "div",
            "br",
            "li",
            "tr",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "pre",
            "section",
            "article",
            "header",
            "footer",
            "table",
            "ul",
            "ol",
            "blockquote",
            "title",
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML page, one block per line (scripts and styles dropped)."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in "".join(parser.parts).splitlines())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"
