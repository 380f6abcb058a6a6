"""The desktop window: the web app's page in pywebview, with its native touches.

Title and icon, the size remembered in ``FLEET_HOME/desktop.json`` (0600), links to other sites
in the system browser, downloads through a save dialog, a second launch raising it, and closing
that asks first when runs of this window are in progress, then cancels them cleanly.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_shell import bridge
from fleet_shell.server import LocalServer

log = logging.getLogger(__name__)
TITLE = "fleet-rlm"
ICON = Path(__file__).resolve().parent / "icon.png"
GEOMETRY_NAME = "desktop.json"
DEFAULT_SIZE = (1280, 860)
MIN_SIZE = (640, 480)
MAX_SIDE = 16384


def load_size(home: Path) -> tuple[int, int]:
    """The window size saved at the last close, within sane bounds; the default otherwise."""
    try:
        saved = json.loads((home / GEOMETRY_NAME).read_text())
        width, height = int(saved["width"]), int(saved["height"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_SIZE
    return (min(max(width, MIN_SIZE[0]), MAX_SIDE), min(max(height, MIN_SIZE[1]), MAX_SIDE))


def save_size(home: Path, size: tuple[int, int]) -> None:
    path = home / GEOMETRY_NAME
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"width": size[0], "height": size[1]}, out)
    tmp.replace(path)


def confirm_close(window: Any, count: int) -> bool:
    """Ask before closing over running work (replaced in tests: a dialog needs a person)."""
    runs = "1 run is" if count == 1 else f"{count} runs are"
    message = f"{runs} still in progress. Closing the window cancels {'it' if count == 1 else 'them'}. Close anyway?"
    return bool(window.create_confirmation_dialog("Close fleet-rlm?", message))


class DesktopWindow:
    """One pywebview window on ``server``, which it starts; ``start()`` runs the GUI loop on the main thread."""

    def __init__(self, server: LocalServer, home: Path, *, gui: str | None) -> None:
        import webview

        self.server, self.home, self.gui = server, home, gui
        self.size = load_size(home)
        self._closing_approved = False
        self.qt = gui == "qt"
        if self.qt:
            from fleet_shell import qt

            # Loads the Qt binding before the server's thread starts importing the web app:
            # shiboken's start-up walks sys.modules and aborts the process if another thread
            # imports meanwhile ("dictionary changed size during iteration").
            qt.guard_navigation(server.url)
        server.start()
        self.window = webview.create_window(
            TITLE,
            server.url + bridge.ENTRY_PATH,
            width=self.size[0],
            height=self.size[1],
            min_size=MIN_SIZE,
            text_select=True,
            background_color="#FFFFFF",
        )
        self.window.events.loaded += self._on_loaded
        self.window.events.resized += self._on_resized
        self.window.events.closing += self._on_closing
        self.window.events.shown += self._on_shown

    # -- events (pywebview calls them on its threads) ------------------------------------------

    def _on_shown(self) -> None:
        if self.qt:
            from fleet_shell import qt

            qt.handle_downloads(self.window, Path.home() / "Downloads")
            qt.keep_signals_flowing(self.window)

    def _on_loaded(self) -> None:
        # Every page load (a reload too) asks for the token again. A refused navigation also ends
        # in "loaded", with the page still signed in: nothing to hand over then.
        if self.window.run_js(bridge.READY_JS) is True:
            return
        if not bridge.hand_over(self.window, self.server.token, self.server.url):
            log.warning("the page did not ask for the launch token (is it the fleet-rlm UI?)")

    def _on_resized(self, width: int, height: int) -> None:
        self.size = (width, height)

    def _on_closing(self) -> bool:
        """False keeps the window open; runs in progress are asked about on another thread."""
        if not self._closing_approved:
            active = self.server.active_runs()
            if active:
                threading.Thread(target=self._ask_then_close, args=(len(active),), daemon=True).start()
                return False
        save_size(self.home, self.size)
        return True

    def _ask_then_close(self, count: int) -> None:
        if confirm_close(self.window, count):
            self.close(cancel_runs=True)

    # -- control ---------------------------------------------------------------------------------

    def close(self, *, cancel_runs: bool) -> None:
        """Close without asking; ``cancel_runs`` stops this window's runs first (recorded as cancelled)."""
        if cancel_runs:
            stopped = self.server.cancel_runs()
            if stopped:
                log.info("cancelled %d run(s) on closing", stopped)
        self._closing_approved = True
        self.window.destroy()

    def focus(self) -> None:
        """Bring the window to the front (a second launch asked)."""
        self.window.restore()
        self.window.show()
        if self.qt:
            from fleet_shell import qt

            qt.raise_window(self.window)

    def start(self, worker: Callable[[], None] | None = None) -> None:
        """The GUI loop (main thread) until the window closes; ``worker`` runs beside it."""
        import webview

        webview.settings["OPEN_EXTERNAL_LINKS_IN_BROWSER"] = True
        webview.settings["ALLOW_DOWNLOADS"] = not self.qt  # Qt: our handler (qt.handle_downloads)
        webview.start(worker, gui=self.gui, icon=str(ICON), private_mode=True)
