"""The sample input (``examples/incident/``, see examples/README.md): the context a first run can use
before the user has files of their own. A wheel carries it inside the package (``fleet_rlm/examples``),
a source checkout at its root."""

from __future__ import annotations

from pathlib import Path

from fleet_rlm.config import Settings

_PACKAGE = Path(__file__).resolve().parents[1]
_INSTALLED, _CHECKOUT = _PACKAGE / "examples" / "incident", _PACKAGE.parents[1] / "examples" / "incident"
SAMPLE = _INSTALLED if _INSTALLED.is_dir() else _CHECKOUT
SAMPLE_QUESTION = "Which service failed first, and why?"


def sample_path(settings: Settings) -> Path | None:
    """The sample's folder when this installation has it and runs may read it (FLEET_CONTEXT_ROOTS)."""
    if not SAMPLE.is_dir():
        return None
    roots = settings.allowed_context_roots
    if roots is not None and not any(SAMPLE.is_relative_to(root) for root in roots):
        return None
    return SAMPLE
