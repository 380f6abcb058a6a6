"""Durable SQLite store for runs, events and sessions."""

from fleet_rlm.store.db import SCHEMA_VERSION, StoreError
from fleet_rlm.store.store import ACTIVE_STATUSES, STATUSES, RunRecord, SessionRecord, Store

__all__ = [
    "ACTIVE_STATUSES",
    "SCHEMA_VERSION",
    "STATUSES",
    "RunRecord",
    "SessionRecord",
    "Store",
    "StoreError",
]
