"""Storage adapter: every read and conditional write of the three tables, the messages
bucket's objects, and nothing else.

One module per table (:mod:`.sessions`, :mod:`.connections`, :mod:`.messages`), what
they share in :mod:`.base`; large data's objects in :mod:`.objects`. Each write says in
its docstring what it is conditional on.
A lost race comes back as a value (a ``NotAcquired``, a ``RenewFailure``, an
``EndFailure``, a router outcome); a transient fault (throttling, timeout, 5xx,
connection error) is raised as :class:`TransientError`, so that no caller can mistake
one for the other. The calls are synchronous boto3: the worker runs them in threads
(see ``wsfleet.aws``), the Lambda router calls them directly.
"""

from .base import TRANSIENT_CODES, TransientError, is_transient, marshal, now_ms, unmarshal, unwrap_refusal
from .connections import (
    MAX_TRANSACTION,
    OWNER_PAGE_ITEMS,
    Acquired,
    CheckpointEntry,
    ConnectionsStore,
    NotAcquired,
    Owned,
    Released,
)
from .desired import Started, StartOutcome, Stopped, StopOutcome
from .messages import MAX_BATCH, InvalidItem, MessagesStore
from .objects import CorruptObject, ObjectsStore, StoredObject, data_size, needs_object
from .sessions import SessionsStore
from .kinesis import StreamSink
from .sink import BothSinks, Sink

__all__ = [
    "MAX_BATCH",
    "MAX_TRANSACTION",
    "OWNER_PAGE_ITEMS",
    "TRANSIENT_CODES",
    "Acquired",
    "BothSinks",
    "CheckpointEntry",
    "ConnectionsStore",
    "CorruptObject",
    "InvalidItem",
    "MessagesStore",
    "NotAcquired",
    "ObjectsStore",
    "Owned",
    "Released",
    "SessionsStore",
    "Sink",
    "StartOutcome",
    "Started",
    "StopOutcome",
    "Stopped",
    "StoredObject",
    "StreamSink",
    "TransientError",
    "data_size",
    "is_transient",
    "marshal",
    "needs_object",
    "now_ms",
    "unmarshal",
    "unwrap_refusal",
]
