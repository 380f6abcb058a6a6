"""``fleet desktop --self-test [--screenshot PATH]``: open the window, wait for the UI, check the JS
bridge and the server, optionally save a screenshot, close. One line per check on stdout; the
first failure is the error line (exit 1). For CI and for anyone diagnosing an install.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from fleet_shell import bridge
from fleet_shell.window import DesktopWindow

READY_SECONDS = 60.0


class SelfTestFailed(Exception):
    """A check failed; the message says which and what to try."""


@dataclass
class SelfTest:
    desktop: DesktopWindow
    screenshot: Path | None
    out: TextIO
    started: float = field(default_factory=time.perf_counter)
    failure: str | None = None

    def say(self, line: str) -> None:
        print(f"self-test: {line} ({time.perf_counter() - self.started:.2f} s)", file=self.out, flush=True)

    def run(self) -> None:
        """The worker beside the GUI loop: every check, then close the window either way."""
        try:
            self._checks()
        except SelfTestFailed as exc:
            self.failure = str(exc)
        except Exception as exc:  # a bug or a broken backend: still close, still report
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.desktop.close(cancel_runs=True)

    def _checks(self) -> None:
        server, window = self.desktop.server, self.desktop.window
        server.wait_started()
        if not server.healthy():
            raise SelfTestFailed(f"{server.url}/health did not answer 200")
        self.say(f"server {server.url} answers /health")
        if not window.events.loaded.wait(READY_SECONDS):
            raise SelfTestFailed("the window did not load the page: run with PYWEBVIEW_LOG=debug to see why")
        self.say("window loaded the page")
        if not bridge.wait_for(window, bridge.READY_JS, READY_SECONDS):
            shown = window.run_js("document.body ? document.body.innerText.slice(0, 200) : ''")
            raise SelfTestFailed(f"the UI did not sign in with the bridge's token; it shows: {shown!r}")
        self.say("UI rendered and signed in through the JS bridge (token handed over, session id held)")
        status, _ = server.request("GET", "/api/runs?limit=1")
        if status != 200:
            raise SelfTestFailed(f"the server's API answered {status} with the launch token")
        self.say("runtime ready: the API answers with the launch token")
        if self.screenshot is not None:
            self._screenshot(self.screenshot)

    def _screenshot(self, path: Path) -> None:
        if not self.desktop.qt:
            raise SelfTestFailed("--screenshot needs the Qt backend (PYWEBVIEW_GUI=qt); run without it")
        from fleet_shell import qt

        path.parent.mkdir(parents=True, exist_ok=True)
        size = qt.screenshot(self.desktop.window, path)
        if size is None:
            raise SelfTestFailed("no stable, non-blank frame to save: the page may not be painting")
        self.say(f"screenshot {path} ({size[0]}x{size[1]})")
