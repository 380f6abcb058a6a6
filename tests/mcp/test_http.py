"""Streamable HTTP under uvicorn: both eras, DNS-rebinding protection, bearer token, bind policy.

The token default (configured or generated, printed once), --no-auth, /health and the session
bound are tested against the real `fleet-mcp` process in tests/security/test_http_auth.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import httpx2
import pytest
from mcp.client.streamable_http import streamable_http_client

from fleet_rlm.http_auth import BindError, check_bind, is_loopback, resolve_token
from fleet_rlm.mcp.http import build_http_app
from fleet_rlm.mcp.server import build_server
from mcp import Client
from tests.mcp import EXPECTED_TOOLS
from tests.support.asgi_server import serve_asgi

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}  # fmt: skip
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@contextmanager
def serving(token: str | None = None) -> Iterator[str]:
    """Serve a fresh server on a free loopback port in a thread; yields the /mcp URL.

    ``token=None`` serves without authentication (what `--no-auth` does)."""
    with serve_asgi(lambda port: build_http_app(build_server(), host="127.0.0.1", port=port, token=token)) as base:
        yield f"{base}/mcp"


@pytest.mark.anyio
async def test_http_serves_both_eras(fleet_env: dict[str, str], era: str) -> None:
    with serving() as url:
        async with Client(url, mode=era) as client:
            assert client.protocol_version == ("2025-11-25" if era == "legacy" else "2026-07-28")
            names = [t.name for t in (await client.list_tools()).tools]
            assert "run" in names and "inspect_trace" in names
            # The engine opens inside uvicorn's loop on first use.
            listed = await client.call_tool("list_runs", {})
            assert listed.structured_content == {"runs": [], "offset": 0, "has_more": False}


def test_dns_rebinding_is_refused(fleet_env: dict[str, str]) -> None:
    with serving() as url:
        evil_host = httpx.post(url, json=INITIALIZE, headers={**HEADERS, "Host": "evil.example"}, timeout=10)
        assert evil_host.status_code == 421
        evil_origin = httpx.post(url, json=INITIALIZE, headers={**HEADERS, "Origin": "http://evil.example"}, timeout=10)
        assert evil_origin.status_code == 403
        ok = httpx.post(url, json=INITIALIZE, headers=HEADERS, timeout=10)
        assert ok.status_code == 200


@pytest.mark.anyio
async def test_bearer_token_required_when_configured(fleet_env: dict[str, str], era: str) -> None:
    token = "tok-7f3a9c-not-a-real-secret"
    with serving(token=token) as url:
        async with httpx.AsyncClient(timeout=10) as http:
            missing = await http.post(url, json=INITIALIZE, headers=HEADERS)
            assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
            wrong = await http.post(url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {token}x"})
            assert wrong.status_code == 401
            assert token not in wrong.text
        authed = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
        async with authed, Client(streamable_http_client(url, http_client=authed), mode=era) as client:
            assert [t.name for t in (await client.list_tools()).tools] == EXPECTED_TOOLS


def test_bind_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback(host), host
        check_bind(host, None, False)
    for host in ("0.0.0.0", "192.168.1.5", "example.com", "::"):
        assert not is_loopback(host), host
    with pytest.raises(BindError, match=r"--no-auth.*FLEET_MCP_TOKEN.*--allow-remote"):
        check_bind("0.0.0.0", None, False)
    with pytest.raises(BindError, match="allow-remote") as no_flag:
        check_bind("0.0.0.0", "tok", False)
    assert "authentication" not in str(no_flag.value).split("needs")[1]
    with pytest.raises(BindError, match="authentication"):
        check_bind("0.0.0.0", None, True)
    check_bind("0.0.0.0", "tok", True)
    with pytest.raises(BindError):
        build_http_app(build_server(), host="0.0.0.0", token=None, allow_remote=True)
    build_http_app(build_server(), host="0.0.0.0", token="tok", allow_remote=True)

    monkeypatch.setenv("FLEET_MCP_TOKEN", "from-env-token")
    configured = resolve_token()
    assert configured is not None and (configured.value, configured.generated) == ("from-env-token", False)
    assert resolve_token(given="given-token").value == "given-token"  # type: ignore[union-attr]
    assert resolve_token(no_auth=True) is None
    for blank in ("", "   "):  # a blank token is never accepted: one is generated instead
        monkeypatch.setenv("FLEET_MCP_TOKEN", blank)
        generated = resolve_token()
        assert generated is not None and generated.generated and len(generated.value) >= 32
        assert generated.value not in repr(generated)  # a stray log line of the object shows no secret
    assert resolve_token().value != resolve_token().value  # type: ignore[union-attr]  # per launch
