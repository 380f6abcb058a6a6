"""What a browser holds after signing in to `fleet web`, checked in a real chromium (Playwright).

Browsers send cookies for 127.0.0.1 to every port, so any other local web app the user opens would
receive a cookie credential. The page on another port here is served by a second listener that
records every request; whatever it received is replayed against the API, as that app could. After
signing out, everything the browser held is replayed too: none of it may work any more."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.http_server import LoopbackServer, QuietHandler
from tests.web.conftest import WebServer, fleet_web
from tests.web.test_browser import chromium, open_page

pytestmark = pytest.mark.slow

OTHER_PAGE = b"<!doctype html><meta charset=utf-8><title>another local app</title><p>Another app."
# Headers that describe the connection, not the sender; everything else is replayed as received.
NOT_REPLAYED = {"host", "connection", "content-length", "origin", "referer"}


class _OtherApp(QuietHandler):
    """Another local web app on its own port: serves a page and records the headers of every request."""

    received: ClassVar[list[dict[str, str]]]

    def do_GET(self) -> None:
        self.received.append(dict(self.headers.items()))
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(OTHER_PAGE)))
        self.end_headers()
        self.wfile.write(OTHER_PAGE)


@pytest.fixture
def web(fleet_env: dict[str, str], tmp_path: Path) -> Iterator[WebServer]:
    with fleet_web(tmp_path, {**os.environ, **fleet_env}) as server:
        yield server


@pytest.fixture
def browser(web: WebServer) -> Iterator[Browser]:
    with chromium() as b:
        yield b


@dataclass(frozen=True)
class Held:
    """A value the browser keeps for the fleet page; ``cookie``: sent as a cookie (``name=value``)."""

    value: str
    cookie: bool

    def headers(self) -> dict[str, str]:
        """The headers that present it, as a program replaying it would send them."""
        return {"Cookie": self.value} if self.cookie else {"Authorization": f"Bearer {self.value}"}


def _held(page: Page) -> list[Held]:
    """Everything the browser keeps for the fleet page: its cookies, the tab's sessionStorage and the
    origin's localStorage."""
    cookies = [Held(f"{c['name']}={c['value']}", cookie=True) for c in page.context.cookies()]
    stored = page.evaluate("() => [...Object.values(sessionStorage), ...Object.values(localStorage)]")
    return cookies + [Held(value, cookie=False) for value in stored]


def _answers(base: str, presented: list[dict[str, str]]) -> list[int]:
    """The API's status for each set of headers, sent as another program would (no browser)."""
    with httpx.Client(base_url=base, timeout=30) as client:
        return [client.get("/api/runs", headers=headers).status_code for headers in presented]


def test_another_port_gets_nothing_usable_and_signing_out_revokes(browser: Browser, web: WebServer,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    recorder = type("Recorder", (_OtherApp,), {"received": []})
    with open_page(browser, web, tmp_path) as ui, LoopbackServer(recorder) as other:
        page = ui.page
        ui.login()
        held = _held(page)
        working = [h for h, status in zip(held, _answers(web.base, [h.headers() for h in held]), strict=True)
                   if status == 200]  # fmt: skip
        assert working, f"the signed-in page should hold a working credential: {held}"
        assert web.token not in repr(held), "the browser must never keep the launch token itself"

        # The user opens another local web app in the same browser.
        other_page = page.context.new_page()
        other_page.goto(other.base_url.removesuffix("/v1") + "/")
        expect(other_page.get_by_text("Another app.")).to_be_visible()
        assert recorder.received, "the other app's listener saw no request"
        replayed = [{k: v for k, v in r.items() if k.lower() not in NOT_REPLAYED} for r in recorder.received]
        assert set(_answers(web.base, replayed)) == {401}, f"another port received a usable credential: {replayed}"
        assert not [h for h in working if h.value in repr(recorder.received)], "the credential reached another port"

        # Its page tries to drive the API (a request that would create a volume): refused.
        other_page.evaluate(
            """async (api) => {
                await fetch(api + "/api/volumes", {method: "POST", mode: "no-cors", credentials: "include",
                    headers: {"Content-Type": "text/plain"}, body: JSON.stringify({name: "planted"})});
            }""",
            web.base,
        )
        with web.api() as api:
            assert "planted" not in [v["name"] for v in api.get("/api/volumes").json()["volumes"]]
        other_page.close()

        # Signing out: everything the browser held no longer works, and it holds nothing that does.
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        assert set(_answers(web.base, [h.headers() for h in held])) == {401}, "what the browser held still works"
        assert 200 not in _answers(web.base, [h.headers() for h in _held(page)])
        page.reload()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert [e for e in ui.errors if "401" not in e] == [], "\n".join(ui.errors)
