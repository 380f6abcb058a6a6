"""The sample input of a source checkout (``examples/incident/``, see examples/README.md): the context a
first run can use before the user has files of their own. A wheel does not ship it."""

from __future__ import annotations

from pathlib import Path

from fleet_rlm.config import Settings

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "incident"
SAMPLE_QUESTION = "Which service failed first, and why?"


def sample_path(settings: Settings) -> Path | None:
    """The sample's folder when this installation has it and runs may read it (FLEET_CONTEXT_ROOTS)."""
    if not SAMPLE.is_dir():
        return None
    roots = settings.allowed_context_roots
    if roots is not None and not any(SAMPLE.is_relative_to(root) for root in roots):
        return None
    return SAMPLE
