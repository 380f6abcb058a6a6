"""Are the optional desktop dependencies installed? Checked before anything heavy is imported."""

from __future__ import annotations

import importlib.util
import sys

from fleet_rlm.errors import UserError

INSTALL_HINT = (
    "install the desktop extra: in a checkout, `uv run --extra desktop fleet desktop`, or "
    "`uv tool install \"fleet-rlm[desktop] @ file://$PWD\"` for the commands on your PATH (docs/desktop.md; "
    "the name fleet-rlm on PyPI is another project)"
)


class MissingDesktopDeps(UserError):
    """The ``desktop`` extra is not installed."""


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def missing() -> list[str]:
    """Modules of the extra that cannot be imported here (Qt only matters on Linux)."""
    wanted = ["webview"]
    if sys.platform.startswith("linux"):
        wanted += ["qtpy", "PySide6.QtWebEngineWidgets"]
    return [name for name in wanted if not _present(name)]


def require() -> None:
    """Raise ``MissingDesktopDeps`` (exit 2, one line with the fix) when the extra is absent."""
    absent = missing()
    if absent:
        raise MissingDesktopDeps(f"fleet desktop needs {', '.join(absent)}: {INSTALL_HINT}")
