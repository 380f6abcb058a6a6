"""Durable SQLite store: a thin ``Store`` with one repository per domain (``store/store.py``)."""

from fleet_rlm.store.db import SCHEMA_VERSION, StoreError
from fleet_rlm.store.records import Record, RecordSize
from fleet_rlm.store.runs import RunRecord
from fleet_rlm.store.sessions import SessionRecord
from fleet_rlm.store.store import Store
from fleet_rlm.store.uploads import Feedback, Upload
from fleet_rlm.types import ACTIVE_STATUSES, STATUSES

__all__ = [
    "ACTIVE_STATUSES",
    "SCHEMA_VERSION",
    "STATUSES",
    "Feedback",
    "Record",
    "RecordSize",
    "RunRecord",
    "SessionRecord",
    "Store",
    "StoreError",
    "Upload",
]
