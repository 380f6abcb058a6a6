"""What every repository of the store shares: the ``Database`` it reads and writes through, and how
values are encoded (compact JSON text on the way in, dicts on the way out).

Shared by every repository module (``runs.py``, ``sessions.py``, ``uploads.py``, ``records.py``,
``optimize.py``, ``agent.py``) so a value is written and read back the same way whichever table holds it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleet_rlm.store.writer import Writer


class Database(Protocol):
    """What a repository needs of its ``Store``: reads on the read connection, writes on the writer thread."""

    @property
    def writer(self) -> Writer: ...

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...


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


def table_columns(row_type: Any, *, json: tuple[str, ...] = (), computed: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A table's columns, from the dataclass of its rows in field order: a field named in ``json`` is
    stored as ``NAME_json`` (JSON text); ``computed`` fields are worked out by a query, not stored."""
    return tuple(f"{f.name}_json" if f.name in json else f.name for f in fields(row_type) if f.name not in computed)


def row_values(row: Any, columns: tuple[str, ...]) -> list[Any]:
    """A dataclass row's values for ``columns``, the ``*_json`` ones encoded (``dumps``)."""
    return [dumps(getattr(row, c[:-5])) if c.endswith("_json") else getattr(row, c) for c in columns]
