"""``fleet desktop``: the command (``fleet_rlm.cli.main`` parses its arguments and calls ``cmd_desktop``).

Checks the extra is installed (one ``error:`` line with the fix otherwise), claims FLEET_HOME (a
second launch raises the running window and exits), starts the server and the window, and on
closing stops both: runs of this window are cancelled and recorded as such.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fleet_rlm.errors import Unavailable, UserError
from fleet_shell import deps


def choose_gui(self_test: bool) -> str | None:
    """The pywebview backend, with the environment Qt needs. Linux: Qt through PySide6 (the one the
    extra installs and CI tests) unless PYWEBVIEW_GUI says otherwise; elsewhere the native one."""
    chosen = os.environ.get("PYWEBVIEW_GUI", "").lower() or None
    if not sys.platform.startswith("linux") and chosen is None:
        return None
    chosen = chosen or "qt"
    if chosen == "qt":
        os.environ.setdefault("QT_API", "pyside6")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Chromium refuses to run as root with its sandbox; the window only shows our own page.
            os.environ.setdefault("QTWEBENGINE_DISABLE_SANDBOX", "1")
        headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if headless and not os.environ.get("QT_QPA_PLATFORM"):
            if not self_test:
                raise Unavailable(
                    "no display to open a window on (DISPLAY and WAYLAND_DISPLAY are unset): run it in a desktop "
                    "session, or check the install headless with `fleet desktop --self-test`"
                )
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
    return chosen


def run(self_test: bool, screenshot: Path | None, out: Any = None) -> int:
    """The window until it closes. A self-test runs beside any open window (it does not claim FLEET_HOME)."""
    from fleet_rlm.config import default_home
    from fleet_shell.instance import Instance, focus_running

    deps.require()
    gui = choose_gui(self_test)
    home = default_home()
    instance = Instance(home)
    if not self_test and not instance.acquire():
        if focus_running(home):
            print("fleet desktop: already running; its window was brought to the front", file=sys.stderr)
            return 0
        raise Unavailable(f"another fleet desktop holds {home / 'desktop.lock'} but did not answer: close it and retry")
    from fleet_shell.server import LocalServer
    from fleet_shell.window import DesktopWindow

    server = LocalServer()
    try:
        desktop = DesktopWindow(server, home, gui=gui)
        print(f"fleet desktop: serving {server.url} (its token is handed to the window only)", file=sys.stderr)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: desktop.close(cancel_runs=True))
        if not self_test:

            def focus() -> None:
                print("fleet desktop: a second launch asked for this window: bringing it to the front",
                      file=sys.stderr, flush=True)  # fmt: skip
                desktop.focus()

            instance.listen(focus)
            desktop.start()
            return 0
        from fleet_shell.selftest import SelfTest

        test = SelfTest(desktop, screenshot, out or sys.stdout)
        desktop.start(test.run)
        if test.failure:
            raise Unavailable(f"self-test failed: {test.failure}")
        print("self-test: passed", file=out or sys.stdout, flush=True)
        return 0
    finally:
        server.stop()
        instance.release()


def cmd_desktop(args: argparse.Namespace) -> int:
    """The ``fleet desktop`` command."""
    if args.install or args.uninstall:
        if args.self_test or args.screenshot:
            raise UserError("--install and --uninstall take no other option: fleet desktop --install")
        from fleet_shell.launcher import cmd_install

        return cmd_install(remove=args.uninstall)
    if args.screenshot and not args.self_test:
        raise UserError("--screenshot goes with --self-test: fleet desktop --self-test --screenshot shot.png")
    return run(args.self_test, Path(args.screenshot) if args.screenshot else None)
