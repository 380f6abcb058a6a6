"""Durable SQLite store: a thin ``Store`` with one repository per domain (``store/store.py``)."""

from fleet_rlm.store.agent import (
    Approval,
    Attachment,
    AuditEntry,
    ChatMessage,
    Checkpoint,
    Conversation,
    LinkedRun,
    Turn,
)
from fleet_rlm.store.db import SCHEMA_VERSION, StoreError
from fleet_rlm.store.optimize import (
    Activation,
    CachedEval,
    Dataset,
    DatasetRow,
    JudgedRun,
    Optimization,
    ProgramVersion,
)
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
    "Activation",
    "Approval",
    "Attachment",
    "AuditEntry",
    "CachedEval",
    "ChatMessage",
    "Checkpoint",
    "Conversation",
    "Dataset",
    "DatasetRow",
    "Feedback",
    "JudgedRun",
    "LinkedRun",
    "Optimization",
    "ProgramVersion",
    "Record",
    "RecordSize",
    "RunRecord",
    "SessionRecord",
    "Store",
    "StoreError",
    "Turn",
    "Upload",
]
