"""Storage adapter of the lease tables: every read and conditional write of the sessions
and connections tables, and nothing else (where frames go is :mod:`wsfleet.sinks`).

One module per table (:mod:`.sessions`, :mod:`.connections`), what they share in
:mod:`.base`. Each write says in its docstring what it is conditional on.
A lost race comes back as a value (a ``NotAcquired``, a ``RenewFailure``, an
``EndFailure``, a router outcome); a transient fault (throttling, timeout, 5xx,
connection error) is raised as :class:`TransientError`, so that no caller can mistake
one for the other. The calls are synchronous boto3: the worker runs them in threads
(see ``wsfleet.aws``), the Lambda router calls them directly.
"""

from .base import TRANSIENT_CODES, TransientError, is_transient, marshal, now_ms, unmarshal, unwrap_refusal
from .connection_reads import OWNER_PAGE_ITEMS, Owned
from .connections import MAX_TRANSACTION, Acquired, CheckpointEntry, ConnectionsStore, NotAcquired, Released
from .moves import Moved
from .desired import DeleteOutcome, Started, StartOutcome, Stopped, StopOutcome
from .sessions import SessionsStore

__all__ = [
    "MAX_TRANSACTION",
    "OWNER_PAGE_ITEMS",
    "TRANSIENT_CODES",
    "Acquired",
    "CheckpointEntry",
    "ConnectionsStore",
    "DeleteOutcome",
    "Moved",
    "NotAcquired",
    "Owned",
    "Released",
    "SessionsStore",
    "StartOutcome",
    "Started",
    "StopOutcome",
    "Stopped",
    "TransientError",
    "is_transient",
    "marshal",
    "now_ms",
    "unmarshal",
    "unwrap_refusal",
]
