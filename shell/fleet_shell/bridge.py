"""The JS bridge between the shell and its page: pywebview's ``run_js`` (Python -> page).

The page (webui/static/app.js) opened at ``/?desktop`` marks ``<html data-desktop="waiting">``;
the shell then runs a script that hands it this launch's token in a ``fleet-desktop-token``
event, and the page trades it for a browser session id (no cookie). The script checks the
page's origin itself, so a page of any other origin never receives the token. Nothing is exposed
the other way (no ``js_api``): a script in the window has nothing of the shell's to call.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

ENTRY_PATH = "/?desktop"
WAITING_JS = "document.documentElement.dataset.desktop === 'waiting'"
# Signed in and routed: the nav is shown and marks the current page (app.js start()).
READY_JS = (
    "!document.getElementById('nav').hidden && !!document.querySelector('#nav a[aria-current=\"page\"]')"
    " && !document.getElementById('boot')"
)


class Page(Protocol):
    """What the bridge needs of a pywebview window."""

    def run_js(self, script: str) -> Any: ...


def hand_over_script(token: str, origin: str) -> str:
    """The script that gives ``token`` to the page, only if the page is of ``origin``."""
    detail, expected = json.dumps(token), json.dumps(origin)
    return (
        f"(function () {{ if (location.origin !== {expected}) return false;"
        f" window.dispatchEvent(new CustomEvent('fleet-desktop-token', {{detail: {detail}}})); return true; }})()"
    )


def wait_for(page: Page, script: str, timeout: float, interval: float = 0.03) -> bool:
    """Poll ``script`` in the page until it is true; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if page.run_js(script) is True:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def hand_over(page: Page, token: str, origin: str, timeout: float = 5.0) -> bool:
    """Wait until the page asks for the token, then give it. True when the page took it.

    The page asks while it boots, before its load finishes, so a short wait suffices; a load that
    was no page load (a refused navigation) finds the page not asking."""
    if not wait_for(page, WAITING_JS, timeout):
        return False
    return page.run_js(hand_over_script(token, origin)) is True
