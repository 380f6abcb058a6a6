"""The published JSON Schema of events (``docs/events.schema.json``), built from ``fleet_rlm.types``.

Run ``python -m fleet_rlm.core.schema > docs/events.schema.json`` after changing a payload type;
a test fails while the published file and the types disagree.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from fleet_rlm.types import EVENT_VERSION, PAYLOADS, Event


def event_schema() -> dict[str, Any]:
    """The envelope, plus each kind's payload under ``$defs`` and a rule tying ``data`` to ``kind``."""
    schema = TypeAdapter(Event).json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = schema.pop("$defs", {})
    rules = []
    for kind, payload in PAYLOADS.items():
        sub = TypeAdapter(payload).json_schema(ref_template="#/$defs/{model}")
        defs.update(sub.pop("$defs", {}))
        defs[payload.__name__] = sub
        rules.append({
            "if": {"properties": {"kind": {"const": kind}}},
            "then": {"properties": {"data": {"$ref": f"#/$defs/{payload.__name__}"}}},
        })
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": f"fleet-rlm event, version {EVENT_VERSION}",
        "allOf": rules,
        "$defs": dict(sorted(defs.items())),
    }


if __name__ == "__main__":
    print(json.dumps(event_schema(), indent=2, sort_keys=False))
