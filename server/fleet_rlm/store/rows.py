"""How the store's tables encode values: compact JSON text on the way in, dicts on the way out.

Shared by every table module (``store.py``, ``optimize.py``, ``agent.py``) so a value is written and
read back the same way whichever table holds it.
"""

from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> str:
    """Compact JSON text for a ``*_json`` column."""
    # default=str: an odd object in event data should degrade, not crash a run.
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


def record(columns: tuple[str, ...], row: tuple[Any, ...]) -> dict[str, Any]:
    """A row as a dict; ``*_json`` columns decoded under their name without the suffix."""
    out: dict[str, Any] = {}
    for name, value in zip(columns, row, strict=True):
        if name.endswith("_json"):
            out[name[:-5]] = json.loads(value) if value else None
        else:
            out[name] = value
    return out
