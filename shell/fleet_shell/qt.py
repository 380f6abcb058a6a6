"""What only the Qt backend (Linux) can do, used when pywebview runs on Qt: the navigation guard,
downloads through a native save dialog, raising the window, a screenshot, and letting Python see
signals while Qt's loop runs. Other backends rely on pywebview's own behaviour (see docs/desktop.md).
"""

from __future__ import annotations

import threading
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def on_gui(window: Any, fn: Callable[[], T], timeout: float = 10.0) -> T | None:
    """Run ``fn`` on the Qt GUI thread and wait for its result (None on timeout)."""
    from qtpy.QtCore import QTimer

    done, box = threading.Event(), {}

    def call() -> None:
        try:
            box["result"] = fn()
        finally:
            done.set()

    QTimer.singleShot(0, window.native, call)
    done.wait(timeout)
    return box.get("result")


def guard_navigation(origin: str) -> None:
    """The window only ever shows ``origin``: a link elsewhere opens in the system browser.

    pywebview already sends new-window requests (``target=_blank``) to the browser; this covers the
    main frame too. Set on pywebview's page class before the window is created."""
    from qtpy.QtCore import QUrl
    from webview.platforms.qt import BrowserView

    page_class = BrowserView.WebPage
    allowed = QUrl(origin)

    def accept_navigation_request(self: Any, url: Any, kind: Any, is_main_frame: bool) -> bool:
        same = url.scheme() == allowed.scheme() and url.host() == allowed.host() and url.port() == allowed.port()
        if is_main_frame and not same:
            if url.scheme() in ("http", "https", "mailto"):
                webbrowser.open(url.toString())
            return False
        return bool(super(page_class, self).acceptNavigationRequest(url, kind, is_main_frame))

    page_class.acceptNavigationRequest = accept_navigation_request


def ask_save_path(parent: Any, suggested: Path) -> str | None:
    """The OS's save dialog (replaced in tests: a dialog needs a person)."""
    from qtpy.QtWidgets import QFileDialog

    path, _ = QFileDialog.getSaveFileName(parent, "Save", str(suggested))
    return path or None


def handle_downloads(window: Any, folder: Path) -> None:
    """Downloads (exports, volume files) ask where to save with a native dialog, named as the server says."""

    def connect() -> None:
        profile = window.native.webview.page().profile()

        def requested(download: Any) -> None:
            target = ask_save_path(window.native, folder / download.downloadFileName())
            if not target:
                download.cancel()
                return
            download.setDownloadDirectory(str(Path(target).parent))
            download.setDownloadFileName(Path(target).name)
            download.accept()

        profile.downloadRequested.connect(requested)

    on_gui(window, connect)


def raise_window(window: Any) -> None:
    def bring_up() -> None:
        native = window.native
        native.showNormal()
        native.raise_()
        native.activateWindow()

    on_gui(window, bring_up)


def keep_signals_flowing(window: Any) -> None:
    """Qt's loop holds the main thread in C++; a timer hands it back to Python now and then, so
    SIGINT/SIGTERM handlers run."""

    def start() -> None:
        from qtpy.QtCore import QTimer

        timer = QTimer(window.native)
        timer.timeout.connect(lambda: None)
        timer.start(200)

    on_gui(window, start)


def screenshot(window: Any, path: Path, timeout: float = 10.0) -> tuple[int, int] | None:
    """Save what the page shows as a PNG; (width, height), or None when no stable, non-blank frame came.

    A grab lags the page by a frame: two equal grabs in a row, with more than two colours, count."""
    previous: list[bytes | None] = [None]

    def grab() -> tuple[int, int] | None:
        image = window.native.webview.grab().toImage()
        raw = bytes(image.constBits())
        stable = raw == previous[0] and len(set(raw[::997])) > 2
        previous[0] = raw
        if stable and image.save(str(path), "PNG"):
            return image.width(), image.height()
        return None

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        size = on_gui(window, grab)
        if size:
            return size
        time.sleep(0.15)
    return None
