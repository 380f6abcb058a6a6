"""The one fetch policy: what runs, the agent and the web may fetch, without reaching this machine or its network.

Every hop (the first URL and each redirect) is checked the same way: http or https only; the host name
is resolved once and every address it resolves to must be public (not loopback, private, link-local,
shared, multicast or reserved; an IPv6 address that is an IPv4 one written as IPv6, as mapped, translated,
compatible and NAT64 addresses are, is judged by that IPv4 address alone, one that carries IPv4 ones, as
6to4 and Teredo addresses do, by those too; any other IPv6 address must be global unicast, in 2000::/3)
unless ``fetch_allowed_hosts`` (or its older name ``agent_allowed_hosts``) names the host or a network
holding the address; the connection then goes to the address that was checked (the name travels in the
Host header and in TLS SNI, so certificates are still verified against it), so a second DNS answer cannot
point the request at our own servers. Bodies stop at the caller's size limit.

``check_policy`` is the part that needs no DNS (the form, and a host written as an address or named
localhost): admission refuses those before a run exists; ``check_url`` resolves and is the last word,
at each hop of the fetch itself. Git is held to the same checks (``core.inputs.repo``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from fleet_rlm.errors import Unavailable, UserError
from fleet_rlm.types import check_fetch_url

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

MAX_REDIRECTS = 5
TIMEOUT = 30.0
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT (RFC 2765): is_global is true for it
# IPv6 forms that are an IPv4 address written as IPv6: the IPv4 address is where a packet ends up.
IPV4_AS_IPV6 = (IPV4_MAPPED, IPV4_TRANSLATED, IPV4_COMPATIBLE, NAT64)
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")  # every public IPv6 address; ipaddress calls more global
ALLOW_SETTING = "fetch_allowed_hosts"


class FetchRefused(UserError):
    """The policy refuses this fetch (an address that is not public, a scheme, a size); the message says why."""


class FetchFailed(Unavailable):
    """The fetch was allowed but did not work (no connection, a timeout, an HTTP error); the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (``address``) and what to ask for."""

    url: str
    scheme: str
    host: str
    port: int
    address: str


@dataclass(frozen=True)
class Fetched:
    """A fetched body and how it came: the URL it finally came from, its status and type, and the time."""

    url: str
    status: int
    content_type: str  # the media type alone, lower case ("text/html"); "" when the server gave none
    encoding: str | None
    body: bytes
    seconds: float


def allowed(settings: Settings) -> tuple[set[str], list[Network]]:
    """The host names and networks the settings let through although not public."""
    names: set[str] = set()
    networks: list[Network] = []
    given = f"{settings.fetch_allowed_hosts or ''},{settings.agent_allowed_hosts or ''}"
    for item in given.split(","):
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


def _not_public(host: str, address: Address | None) -> FetchRefused:
    what = f"'{host}' resolves to {address}, which is" if address is not None and str(address) != host else f"{host} is"
    return FetchRefused(
        f"{what} not a public address: fleet-rlm does not fetch from this machine or private networks "
        f"(add the host to {ALLOW_SETTING} to allow it)"
    )


def _split(url: str, schemes: tuple[str, ...]) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL of one of ``schemes``, with no user name or password; FetchRefused otherwise."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise FetchRefused(f"'{url}': only {' and '.join(schemes)} URLs can be fetched")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise FetchRefused(f"'{url}' has a port that is not a number from 0 to 65535") from None
    host = (parts.hostname or "").lower()
    if not host or parts.username is not None or parts.password is not None:
        raise FetchRefused(f"'{url}' has no host, or carries a user name or password: give a plain URL")
    return scheme, host, port


def check_policy(url: str, settings: Settings) -> None:
    """What can be refused without resolving a name: the URL's form (``fleet_rlm.types.check_fetch_url``),
    and a host that is an address, or named localhost, that is not public and not allowed."""
    check_fetch_url(url)
    _scheme, host, _port = _split(url, ("http", "https"))
    names, networks = allowed(settings)
    if host in names:
        return
    try:
        address: Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None:
        if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: always this machine
            raise _not_public(host, None)
        return
    if not _public(address) and not any(address in net for net in networks):
        raise _not_public(host, address)


async def check_url(url: str, settings: Settings, *, schemes: tuple[str, ...] = ("http", "https")) -> Target:
    """Resolve and check one URL; FetchRefused names what is wrong and how to allow it if it is ours."""
    scheme, host, port = _split(url, schemes)
    names, networks = allowed(settings)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchRefused(f"cannot resolve '{host}': {exc.strerror or exc}") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    for address in addresses:
        if _public(address) or host in names or any(address in net for net in networks):
            continue
        raise _not_public(host, address)
    if not addresses:
        raise FetchRefused(f"'{host}' resolves to no address")
    return Target(url=url, scheme=scheme, host=host, port=port, address=str(addresses[0]))


async def fetch(url: str, settings: Settings, *, max_mb: int, limit_setting: str, accept: str) -> Fetched:
    """GET ``url`` under the policy, every redirect checked as a new hop; the body up to ``max_mb``
    (named ``limit_setting`` in the refusal). FetchRefused: the policy; FetchFailed: the network or the server."""
    import httpx

    limit = max_mb * 1024 * 1024
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            target = await check_url(url, settings)
            parts = urlsplit(target.url)
            literal = f"[{target.address}]" if ":" in target.address else target.address
            pinned = parts._replace(netloc=f"{literal}:{target.port}").geturl()
            headers = {"Host": parts.netloc.rpartition("@")[2], "Accept": accept, "User-Agent": "fleet-rlm"}
            extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
            request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise FetchFailed(f"'{target.url}' could not be reached: {_network_reason(exc)}") from None
            try:
                if response.is_redirect and response.headers.get("location"):
                    url = urljoin(target.url, response.headers["location"])
                    continue
                if response.status_code >= 400:
                    raise FetchFailed(f"'{target.url}' answered HTTP {response.status_code}")
                body = bytearray()
                try:
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            raise FetchRefused(f"'{target.url}' is larger than {max_mb} MB ({limit_setting})")
                except httpx.HTTPError as exc:
                    raise FetchFailed(f"'{target.url}' broke off: {_network_reason(exc)}") from None
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                return Fetched(
                    url=target.url,
                    status=response.status_code,
                    content_type=kind,
                    encoding=response.charset_encoding,
                    body=bytes(body),
                    seconds=round(time.monotonic() - started, 3),
                )
            finally:
                await response.aclose()
    raise FetchRefused(f"'{url}' redirects more than {MAX_REDIRECTS} times")


def _network_reason(exc: Exception) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {TIMEOUT:.0f} s"
    cause = exc.__cause__ or exc.__context__
    while cause is not None:  # the OS's words ("connection refused"), not httpx's
        if isinstance(cause, OSError) and cause.errno:  # asyncio's strerror adds the address: the OS's alone
            return os.strerror(cause.errno).lower()
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__


def is_html(content_type: str) -> bool:
    return content_type in ("text/html", "application/xhtml+xml")


def is_text(content_type: str) -> bool:
    return content_type.startswith("text/") or content_type in ("application/json", "application/xml", "")


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
