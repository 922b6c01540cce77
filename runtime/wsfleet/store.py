"""DynamoDB adapter: every read and conditional write of the three tables, and nothing else.

Each write says in its docstring what it is conditional on. A lost race comes back as
a value (a ``NotAcquired``, a ``RenewFailure``, an ``EndFailure``, a router outcome); a
transient fault (throttling, timeout, 5xx, connection error) is raised as
:class:`TransientError`, so that no caller can mistake one for the other. The calls are
synchronous boto3: the worker runs them in threads (see ``wsfleet.aws``), the Lambda
router calls them directly.
"""

from __future__ import annotations

import enum
import random
import re
import time
from decimal import Decimal
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from . import schema
from .stream import Frame, contiguous_end
from .leases import (
    AcquireFailure,
    EndFailure,
    RenewFailure,
    acquire_already_landed,
    classify_acquire_failure,
    classify_end_failure,
    classify_renew_failure,
    release_already_landed,
)

_ser = TypeSerializer()
_de = TypeDeserializer()

# Error codes that mean "try again", never "you lost".
TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "TransactionInProgressException",
        "LimitExceededException",
        "RequestThrottled",
    }
)

MAX_BATCH = 25  # BatchWriteItem limit
# Checkpoints per TransactWriteItems (DynamoDB takes up to 100). 25 keeps one
# transaction's hold on the embedded emulator's DynamoDB lock to about that of a batch.
MAX_TRANSACTION = 25
# Cancellation reasons of a transaction that say nothing about ownership: retry it.
TRANSIENT_CANCEL_CODES = frozenset(
    {"None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"}
)


class TransientError(Exception):
    """A request failed in a way that says nothing about ownership; retry it."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return err.get("Code") in TRANSIENT_CODES or status >= 500
    return isinstance(exc, BotoCoreError)  # timeouts, connection errors, ...


def unwrap_refusal(exc: BaseException) -> TransientError | None:
    """Our own refusal raised inside botocore's HTTP send (the send deadline's socket
    check, :mod:`wsfleet.aws`), which botocore wraps in an HTTPClientError."""
    cause = getattr(exc, "kwargs", {}).get("error")
    return cause if isinstance(cause, TransientError) else None


def _condition_failed(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _old_item(exc: ClientError) -> dict | None:
    item = exc.response.get("Item")
    return unmarshal(item) if item else None


def marshal(values: Mapping[str, Any]) -> dict:
    return {k: _ser.serialize(v) for k, v in values.items()}


def unmarshal(item: Mapping[str, Any]) -> dict:
    out = {}
    for k, v in item.items():
        value = _de.deserialize(v)
        # Numbers come back as Decimal; every number we store is an integer.
        out[k] = int(value) if isinstance(value, Decimal) else value
    return out


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class CheckpointEntry:
    """One connection's checkpoint, as :meth:`ConnectionsStore.checkpoint_many` writes it."""

    connection_id: str
    session_id: str
    fence_token: int
    last_seq: int


@dataclass(frozen=True)
class Acquired:
    item: dict  # the connection item after the acquisition

    @property
    def checkpoint_is_end(self) -> bool:
        """The previous owner (the fence just before ours) released it after flushing
        everything: its checkpoint is where the stored messages end, so there is nothing
        past it to read. False after a crash, a takeover or a free of an ENDED session's
        connection, where a last batch may lie past the checkpoint."""
        released_by = self.item.get(schema.CHECKPOINT_IS_END)
        return released_by is not None and int(released_by) == int(self.item[schema.FENCE_TOKEN]) - 1


@dataclass(frozen=True)
class NotAcquired:
    reason: AcquireFailure
    lease_session: str = ""  # the session it is attached to, when HELD


@dataclass(frozen=True)
class Owned:
    """A row of the by_owner index: what a session holds, as the index last saw it."""

    connection_id: str
    desired_state: str


class StartOutcome(enum.Enum):
    CREATED = "created"  # new connection: 202
    RESTARTED = "restarted"  # was STOPPED, now STARTED again: 202
    UNCHANGED = "unchanged"  # already STARTED with this ws_url: 200
    CONFLICT = "conflict"  # already STARTED with another ws_url: 409


class StopOutcome(enum.Enum):
    STOPPED = "stopped"  # 202
    ALREADY_STOPPED = "already_stopped"  # 200
    NOT_FOUND = "not_found"  # 404


@dataclass(frozen=True)
class Stopped:
    outcome: StopOutcome
    lease_session: str = ""  # the session to tell, when STOPPED while owned
    fence_token: int = 0  # the ownership it was stopped under


# Every attribute an expression names, by placeholder. DynamoDB refuses unused names,
# so each request carries only the placeholders its expressions use.
_PLACEHOLDERS = {
    "#pk": schema.PK,
    "#s": schema.DESIRED_STATE,
    "#w": schema.WS_URL,
    "#q": schema.LAST_SEQ,
    "#ce": schema.CHECKPOINT_IS_END,
    "#o": schema.LEASE_OWNER,
    "#l": schema.LEASE_SESSION,
    "#f": schema.FENCE_TOKEN,
    "#k": schema.OWNER_KEY,
    "#u": schema.UPDATED_AT_MS,
    "#sid": schema.SESSION_ID,
    "#st": schema.SESSION_STATE,
    "#e": schema.EXPIRES_AT_MS,
    "#hb": schema.HEARTBEAT_AT_MS,
    "#a": schema.ACTIVE,
    "#m": schema.MAX_CONNECTIONS,
    "#by": schema.ENDED_BY,
    "#ttl": schema.SESSION_TTL,
    "#in": schema.STOP_INBOX,
    "#r": schema.RING,
    "#dr": schema.DRAINING,
    "#rc": schema.RING_CHANGES,
    "#fw": schema.FLEET_WORKERS,
    "#fc": schema.FLEET_CAPACITY,
    "#fb": schema.FLEET_BELOW_SHARE,
    "#fs": schema.FLEET_SUSPECTS,
    "#ft": schema.FLEET_AT_MS,
    "#fu": schema.FLEET_UNDER,
    "#fo": schema.FLEET_OVER,
}


def _names(*expressions: str) -> dict[str, str]:
    used = set(re.findall(r"#[a-z]+", " ".join(expressions)))
    return {k: v for k, v in _PLACEHOLDERS.items() if k in used}


class _Table:
    """One table: calls with transient faults told apart, and conditional updates that
    return the old item when their condition fails."""

    key_name = ""

    def __init__(self, client: Any, table_name: str, *, clock_ms: Callable[[], int] = now_ms):
        self._ddb = client
        self._table = table_name
        self._now_ms = clock_ms

    def _call(self, op: str, **kwargs: Any) -> dict:
        try:
            return getattr(self._ddb, op)(TableName=self._table, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            if is_transient(exc):
                raise TransientError(f"{op}: {exc}") from exc
            raise

    def _key(self, key: str) -> dict:
        return marshal({self.key_name: key})

    def _conditional_update(
        self, key: str, *, update: str, condition: str, values: Mapping[str, Any], returns: str = "ALL_NEW"
    ) -> tuple[dict | None, dict | None]:
        """(new item, None) on success, (None, old item or None) when the condition failed."""
        try:
            resp = self._call(
                "update_item",
                Key=self._key(key),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=_names(update, condition),
                ExpressionAttributeValues=marshal(values),
                ReturnValues=returns,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if _condition_failed(exc):
                return None, _old_item(exc)
            raise
        return unmarshal(resp.get("Attributes", {})), None

    def _query_pages(self, **kwargs: Any) -> Iterator[dict]:
        while True:
            resp = self._call("query", **kwargs)
            yield resp
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


class SessionsStore(_Table):
    """The worker sessions table: one item per worker run, renewed every heartbeat.

    The verbs of an etcd lease: :meth:`open` (grant), :meth:`renew` (keep-alive),
    :meth:`end_own` and :meth:`end_expired` (revoke), :meth:`get` (time-to-live).
    """

    key_name = schema.SESSION_ID

    def open(self, session_id: str, *, worker_id: str, lease_ms: int, max_connections: int) -> dict:
        """Create a LIVE session in the watch ring.

        Conditional on: no item with this id (ids are unique per run; a retry of a put
        that landed finds its own item and returns it)."""
        now = self._now_ms()
        item = {
            schema.SESSION_ID: session_id,
            schema.SESSION_WORKER_ID: worker_id,
            schema.SESSION_STATE: schema.LIVE,
            schema.EXPIRES_AT_MS: now + lease_ms,
            schema.HEARTBEAT_AT_MS: now,
            schema.STARTED_AT_MS: now,
            schema.ACTIVE: 0,
            schema.MAX_CONNECTIONS: max_connections,
            schema.RING: schema.RING_VALUE,
        }
        try:
            self._call(
                "put_item",
                Item=marshal(item),
                ConditionExpression="attribute_not_exists(#sid)",
                ExpressionAttributeNames=_names("#sid"),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not _condition_failed(exc):
                raise
            old = _old_item(exc)
            if old is None or old.get(schema.SESSION_WORKER_ID) != worker_id:
                raise
            return old
        return item

    def renew(
        self,
        session_id: str,
        *,
        lease_ms: int,
        active: int,
        max_connections: int,
        stops_done: Iterable[str] = (),
        draining: bool = False,
    ) -> dict | RenewFailure:
        """Extend the session, report its load, and take the STOPs posted to it.

        Conditional on: the session is LIVE and its expiry not past the new one (a slow,
        superseded renewal never moves it back). Returns the item as renewed (its ``stops``
        are the STOPs not yet handled); on failure, why (ENDED / gone). Idempotent: a
        retry of a renewal that landed succeeds again. ``stops_done`` are removed from
        the inbox in the same write."""
        now = self._now_ms()
        done = sorted(set(stops_done))
        update = "SET #e = :exp, #hb = :now, #a = :active, #m = :max, #dr = :draining"
        values: dict[str, Any] = {
            ":exp": now + lease_ms,
            ":now": now,
            ":active": active,
            ":max": max_connections,
            ":live": schema.LIVE,
            ":draining": draining,
        }
        if done:
            update += " DELETE #in :done"
            values[":done"] = set(done)
        new, old = self._conditional_update(session_id, update=update, condition="#st = :live AND #e <= :exp", values=values)
        if new is None and old is not None and old.get(schema.SESSION_STATE) == schema.LIVE:
            # A later renewal of ours landed first (this one was slow): never move the
            # expiry back, and this says nothing about ownership.
            raise TransientError("renew: a later renewal already landed")
        return new if new is not None else classify_renew_failure(old)

    def end_expired(self, session_id: str, *, ended_by: str, max_clock_skew_ms: int) -> dict | EndFailure:
        """End another worker's dead session, so that it can never be renewed again and
        its connections may be taken. It stays in the watch ring until drained.

        Conditional on: LIVE and ``expires_at_ms`` more than ``max_clock_skew_ms`` in the
        past by our clock. Exactly one of any number of racing callers succeeds; the
        others learn whether it was renewed after all or ended by someone else."""
        now = self._now_ms()
        new, old = self._conditional_update(
            session_id,
            update="SET #st = :ended, #by = :me, #ttl = :ttl",
            condition="#st = :live AND #e < :cutoff",
            values={
                ":ended": schema.ENDED,
                ":live": schema.LIVE,
                ":me": ended_by,
                ":ttl": now // 1000 + schema.ENDED_SESSION_TTL_S,
                ":cutoff": now - max_clock_skew_ms,
            },
        )
        return new if new is not None else classify_end_failure(old)

    def end_own(self, session_id: str, *, worker_id: str, drained: bool) -> bool:
        """End our own session: at a clean exit, or after our deadline passed. When
        ``drained`` (we released everything) it also leaves the watch ring; otherwise it
        stays there so that watchers take what is left at once.

        Conditional on: LIVE. Returns False if it was ENDED already (or is gone)."""
        now = self._now_ms()
        new, old = self._conditional_update(
            session_id,
            update="SET #st = :ended, #by = :me, #ttl = :ttl" + (" REMOVE #r" if drained else ""),
            condition="#st = :live",
            values={
                ":ended": schema.ENDED,
                ":live": schema.LIVE,
                ":me": worker_id,
                ":ttl": now // 1000 + schema.ENDED_SESSION_TTL_S,
            },
        )
        return new is not None

    def leave_ring(self, session_id: str) -> bool:
        """Take a drained session out of the watch ring.

        Conditional on: ENDED (a LIVE session is never dropped from watching)."""
        new, _ = self._conditional_update(
            session_id, update="REMOVE #r", condition="#st = :ended", values={":ended": schema.ENDED}, returns="NONE"
        )
        return new is not None

    def post_stop(self, session_id: str, connection_id: str, fence_token: int) -> bool:
        """Post a STOP to the owning session's inbox, for the ownership ``fence_token``
        (see :func:`schema.stop_entry`); its worker takes it with its next renewal.
        Conditional on: LIVE (an ENDED session's connections are taken by others, whose
        acquire sees the STOP itself)."""
        new, _ = self._conditional_update(
            session_id,
            update="ADD #in :c",
            condition="#st = :live",
            values={":c": {schema.stop_entry(connection_id, fence_token)}, ":live": schema.LIVE},
            returns="NONE",
        )
        return new is not None

    def get(self, session_id: str, *, consistent: bool = True) -> dict | None:
        resp = self._call("get_item", Key=self._key(session_id), ConsistentRead=consistent)
        return unmarshal(resp["Item"]) if "Item" in resp else None

    def get_many(self, session_ids: Sequence[str]) -> list[dict]:
        """Eventually consistent BatchGetItem of sessions (the watched ones, the fleet
        summary, or all of them for the summary), 100 per request; missing ones are left
        out. Unprocessed keys raise TransientError."""
        projection = "#sid, #st, #e, #a, #m, #hb, #dr, #fw, #fc, #fb, #fs, #ft, #fu, #fo"
        out: list[dict] = []
        ids = list(dict.fromkeys(session_ids))
        for start in range(0, len(ids), 100):
            try:
                resp = self._ddb.batch_get_item(
                    RequestItems={
                        self._table: {
                            "Keys": [self._key(s) for s in ids[start : start + 100]],
                            "ProjectionExpression": projection,
                            "ExpressionAttributeNames": _names(projection),
                        }
                    }
                )
            except (ClientError, BotoCoreError) as exc:
                if is_transient(exc):
                    raise TransientError(f"batch_get_item: {exc}") from exc
                raise
            if resp.get("UnprocessedKeys", {}).get(self._table):
                raise TransientError("batch_get_item: keys left unprocessed")
            out.extend(unmarshal(i) for i in resp.get("Responses", {}).get(self._table, []))
        return out

    def ring(self) -> list[str]:
        """Every session id in the watch ring, sorted (the summary's one full read)."""
        return [
            unmarshal(raw)[schema.SESSION_ID]
            for page in self._query_pages(
                IndexName=schema.RING_INDEX,
                KeyConditionExpression="#r = :r",
                ExpressionAttributeNames=_names("#r"),
                ExpressionAttributeValues=marshal({":r": schema.RING_VALUE}),
            )
            for raw in page.get("Items", [])
        ]

    def ring_before(self, session_id: str, *, limit: int) -> list[str]:
        """Up to ``limit`` session ids before ``session_id`` in the watch ring (nearest
        first, wrapping to the end): the sessions that watch it."""
        return self._ring_neighbours(session_id, limit=limit, forward=False)

    def announce(self, session_id: str) -> bool:
        """Tell a watching session that its successors changed (its next renewal returns
        the bumped ``ring_changes``). Conditional on: LIVE."""
        new, _ = self._conditional_update(
            session_id, update="ADD #rc :one", condition="#st = :live", values={":one": 1, ":live": schema.LIVE}, returns="NONE"
        )
        return new is not None

    def put_summary(self, summary: Mapping[str, Any]) -> None:
        """Write the fleet summary item (unconditional: the newest summary wins, and two
        summarizers for a moment write the same figures)."""
        self._call("put_item", Item=marshal({schema.SESSION_ID: schema.FLEET_SUMMARY_ID, **summary}))

    def ring_after(self, session_id: str, *, limit: int) -> list[str]:
        """Up to ``limit`` session ids after ``session_id`` in the watch ring (sorted,
        wrapping to the start), not counting it: at most two small index queries."""
        return self._ring_neighbours(session_id, limit=limit, forward=True)

    def _ring_neighbours(self, session_id: str, *, limit: int, forward: bool) -> list[str]:
        """The nearest ``limit`` ids on one side of ``session_id``, going round the ring:
        one query from it in that direction, and one from the far end if that ran out."""
        found: list[str] = []
        beyond = "#r = :r AND #sid > :me" if forward else "#r = :r AND #sid < :me"
        for condition, start in ((beyond, session_id), ("#r = :r", None)):
            values = {":r": schema.RING_VALUE, **({":me": start} if start is not None else {})}
            resp = self._call(
                "query",
                IndexName=schema.RING_INDEX,
                KeyConditionExpression=condition,
                ExpressionAttributeNames=_names(condition),
                ExpressionAttributeValues=marshal(values),
                ScanIndexForward=forward,
                Limit=limit + 1,
            )
            for raw in resp.get("Items", []):
                sid = unmarshal(raw)[schema.SESSION_ID]
                if sid != session_id and sid not in found:
                    found.append(sid)
            if len(found) >= limit:
                break
        return found[:limit]

# Items per page when a session's connections are listed (the audit every 30 s, a
# drain). DynamoDB would answer a whole worker's holding (1,000 rows of about 100 bytes)
# in one request; the embedded emulator takes about 0.45 s to serialise such a page,
# inside the lock every DynamoDB request waits for, and every frame stored meanwhile
# waits with it. Pages of 100 hold it about 50 ms each, for 9 more requests per audit.
OWNER_PAGE_ITEMS = 100


class ConnectionsStore(_Table):
    """The connections table: desired state, checkpoint, and which session owns it."""

    key_name = schema.PK

    def __init__(self, client: Any, table_name: str, *, state_shards: int, clock_ms: Callable[[], int] = now_ms):
        super().__init__(client, table_name, clock_ms=clock_ms)
        self._shards = state_shards

    def _key(self, key: str) -> dict:
        return marshal({schema.PK: schema.connection_pk(key)})

    # --- reads -------------------------------------------------------------------------

    def get(self, connection_id: str, *, consistent: bool = True) -> dict | None:
        resp = self._call("get_item", Key=self._key(connection_id), ConsistentRead=consistent)
        return unmarshal(resp["Item"]) if "Item" in resp else None

    def _owner_pages(self, owner_key: str, *, projection: str = "", **extra: Any) -> Iterator[dict]:
        if projection:
            extra.update(Select="SPECIFIC_ATTRIBUTES", ProjectionExpression=projection)
        return self._query_pages(
            IndexName=schema.OWNER_INDEX,
            KeyConditionExpression="#k = :k",
            ExpressionAttributeNames=_names("#k", projection),
            ExpressionAttributeValues=marshal({":k": owner_key}),
            **extra,
        )

    def owned_by(self, session_id: str) -> list[Owned]:
        """Every connection attached to a session, as the by_owner index has it, in
        pages of :data:`OWNER_PAGE_ITEMS`."""
        return [
            Owned(schema.connection_id_from_pk(row[schema.PK]), row.get(schema.DESIRED_STATE, ""))
            for page in self._owner_pages(schema.owner_key_session(session_id), Limit=OWNER_PAGE_ITEMS)
            for row in map(unmarshal, page.get("Items", []))
        ]

    def free(self, shard: int, *, limit: int = 100) -> Iterator[str]:
        """STARTED connections nobody owns, of one index shard, ``limit`` per request."""
        for page in self._owner_pages(schema.free_partition(shard), Limit=limit):
            for raw in page.get("Items", []):
                yield schema.connection_id_from_pk(unmarshal(raw)[schema.PK])

    def free_ids(self, shard: int) -> set[str]:
        """Every STARTED connection of one shard nobody owns, keys only: what the
        UnownedConnections count compares between two of its samples."""
        pages = self._owner_pages(schema.free_partition(shard), projection="#pk")
        return {schema.connection_id_from_pk(unmarshal(raw)[schema.PK]) for page in pages for raw in page.get("Items", [])}

    def count_free(self, shard: int) -> int:
        """How many STARTED connections of one shard nobody owns, without reading them."""
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.free_partition(shard), Select="COUNT"))

    def count_owned_by(self, session_id: str) -> int:
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.owner_key_session(session_id), Select="COUNT"))

    # --- ownership writes --------------------------------------------------------------

    def acquire(
        self, connection_id: str, *, session_id: str, worker_id: str, expected_session: str = ""
    ) -> Acquired | NotAcquired:
        """Attach the connection to our session.

        Conditional on: the item exists, desired_state is STARTED, and ``lease_session``
        is ``expected_session``: "" (free) or an ENDED session whose connections we are
        taking. Session ids are never reused and an ENDED session is never renewed, so
        this pins the exact ownership epoch that was read, as a fence read would.
        Increments ``fence_token`` and moves ``owner_key`` to our session. Exactly one
        of any number of racing callers succeeds; a retry whose first attempt landed
        counts as success."""
        new, old = self._conditional_update(
            connection_id,
            update="SET #o = :me, #l = :session, #k = :key, #u = :now ADD #f :one",
            condition="attribute_exists(#pk) AND #s = :started AND #l = :expected",
            values={
                ":me": worker_id,
                ":session": session_id,
                ":key": schema.owner_key_session(session_id),
                ":now": self._now_ms(),
                ":one": 1,
                ":started": schema.STARTED,
                ":expected": expected_session,
            },
        )
        if new is not None:
            return Acquired(new)
        if acquire_already_landed(old, session_id):
            return Acquired(old)
        return NotAcquired(classify_acquire_failure(old), (old or {}).get(schema.LEASE_SESSION, ""))

    def _detach(
        self,
        connection_id: str,
        *,
        condition: str,
        values: Mapping[str, Any],
        last_seq: int | None,
        expect_stopped: bool = False,
    ) -> dict | None:
        """Make the connection free (``owner_key`` FREE#shard if STARTED, removed if
        STOPPED), under ``condition``. The index key depends on the desired state, which
        a concurrent START or STOP may flip: the write names the state it expects, and
        is tried once more with the other one (a failed conditional write is billed, so
        the likelier state goes first). Returns the old item when the condition failed
        for another reason (None when it landed)."""
        old: dict | None = None
        first, other = (schema.STOPPED, schema.STARTED) if expect_stopped else (schema.STARTED, schema.STOPPED)
        for state in (first, other, first):
            update = "SET #o = :empty, #l = :empty, #u = :now"
            state_values: dict[str, Any] = {":empty": "", ":now": self._now_ms(), ":state": state}
            if last_seq is not None:
                # A release: everything was flushed first, so last_seq is where the stored
                # messages end, as of this ownership (fence) -- see checkpoint_is_end().
                update += ", #q = :seq, #ce = :fence"
                state_values[":seq"] = last_seq
            if state == schema.STARTED:
                update += ", #k = :free"
                state_values[":free"] = schema.owner_key_free(connection_id, self._shards)
            else:
                update += " REMOVE #k"
            new, old = self._conditional_update(
                connection_id,
                update=update,
                condition=f"{condition} AND #s = :state",
                values={**values, **state_values},
                returns="NONE",
            )
            if new is not None:
                return None
            if old is None or old.get(schema.DESIRED_STATE) == state:
                return old or {}
        return old or {}

    def release(
        self, connection_id: str, *, session_id: str, fence_token: int, last_seq: int, stopped: bool = False
    ) -> bool:
        """Give the connection up with a final checkpoint.

        Conditional on: ``lease_session`` is ours and ``fence_token`` is ours. Returns
        False when it was no longer ours (nothing written); a retry whose first attempt
        landed returns True. ``stopped``: released for a STOP, so the STOPPED form of
        the write goes first."""
        old = self._detach(
            connection_id,
            condition="#l = :session AND #f = :fence",
            values={":session": session_id, ":fence": fence_token},
            last_seq=last_seq,
            expect_stopped=stopped,
        )
        return old is None or release_already_landed(old, fence_token)

    def free_orphan(self, connection_id: str, *, dead_session: str) -> bool:
        """Free a connection of an ENDED session without taking it (its checkpoint stays
        as the dead owner left it; whoever takes it finds the stored end past it).

        Conditional on: ``lease_session`` is the dead session."""
        return self._detach(connection_id, condition="#l = :dead", values={":dead": dead_session}, last_seq=None) is None

    def checkpoint(self, connection_id: str, *, session_id: str, fence_token: int, last_seq: int) -> bool:
        """Store ``last_seq`` while holding the connection (no index key moves): a
        :meth:`checkpoint_many` of one. Conditional on: ``lease_session`` and
        ``fence_token`` are ours. Returns False if the connection is no longer ours."""
        return self.checkpoint_many([CheckpointEntry(connection_id, session_id, fence_token, last_seq)]) == [True]

    def checkpoint_many(self, entries: Sequence[CheckpointEntry]) -> list[bool | None]:
        """Store several checkpoints in one TransactWriteItems (at most
        :data:`MAX_TRANSACTION` of them), each an Update conditional on its connection's
        session and fence (``lease_session`` and ``fence_token``), no index key moving.

        A transaction is all or nothing. Per entry, in order: True when written, False
        when its condition failed (the connection is no longer ours), None when it was not
        written only because another entry failed (write it again without that one).
        Raises :class:`TransientError` when the transaction was cancelled for reasons that
        say nothing about ownership (a conflict with another write to one of the items,
        throttling): the whole group may go again. A retry of a transaction that landed
        writes the same values again under conditions that still hold."""
        if not 0 < len(entries) <= MAX_TRANSACTION:
            raise ValueError(f"a checkpoint transaction holds 1 to {MAX_TRANSACTION} entries, not {len(entries)}")
        update, condition = "SET #q = :seq, #u = :now", "#l = :session AND #f = :fence"
        now = self._now_ms()
        items = [
            {
                "Update": {
                    "TableName": self._table,
                    "Key": self._key(e.connection_id),
                    "UpdateExpression": update,
                    "ConditionExpression": condition,
                    "ExpressionAttributeNames": _names(update, condition),
                    "ExpressionAttributeValues": marshal(
                        {":seq": e.last_seq, ":now": now, ":session": e.session_id, ":fence": e.fence_token}
                    ),
                }
            }
            for e in entries
        ]
        try:
            self._ddb.transact_write_items(TransactItems=items)
        except (ClientError, BotoCoreError) as exc:
            if is_transient(exc):
                raise TransientError(f"transact_write_items: {exc}") from exc
            if not isinstance(exc, ClientError) or exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            codes = [r.get("Code", "None") for r in exc.response.get("CancellationReasons", [])]
            if len(codes) != len(entries):
                raise TransientError(f"transact_write_items: {len(codes)} reasons for {len(entries)} entries") from exc
            if "ConditionalCheckFailed" not in codes:
                unknown = set(codes) - TRANSIENT_CANCEL_CODES
                if unknown:  # ValidationError and the like: a bug, not a fault to wait out
                    raise
                raise TransientError(f"transact_write_items cancelled: {', '.join(sorted(set(codes) - {'None'}))}") from exc
            return [False if c == "ConditionalCheckFailed" else None for c in codes]
        return [True] * len(entries)

    # --- desired state (the router) -------------------------------------------------------

    def start(self, connection_id: str, ws_url: str) -> StartOutcome:
        """Record that the connection should run.

        A new connection is created free (``owner_key`` FREE#shard) with a conditional
        put (``attribute_not_exists``). A STOPPED one is flipped with an update
        conditional on ``desired_state = STOPPED`` and on the session it is attached to
        (if free, it goes back into FREE#shard; if a session still holds it, it stays
        attached), keeping its checkpoint and fence. A STARTED one is never written, so
        a repeated or concurrent START cannot disturb its owner. Losing a race re-reads
        the outcome from the item it lost to."""
        for _ in range(5):
            now = self._now_ms()
            item = {
                schema.PK: schema.connection_pk(connection_id),
                schema.DESIRED_STATE: schema.STARTED,
                schema.WS_URL: ws_url,
                schema.LAST_SEQ: 0,
                schema.LEASE_OWNER: "",
                schema.LEASE_SESSION: "",
                schema.FENCE_TOKEN: 0,
                schema.OWNER_KEY: schema.owner_key_free(connection_id, self._shards),
                schema.UPDATED_AT_MS: now,
                schema.CREATED_AT_MS: now,
            }
            try:
                self._call(
                    "put_item",
                    Item=marshal(item),
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames=_names("#pk"),
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return StartOutcome.CREATED
            except ClientError as exc:
                if not _condition_failed(exc):
                    raise
                old = _old_item(exc)
            if old is None:
                continue  # deleted between our write and its failure: try again
            if old.get(schema.DESIRED_STATE) == schema.STARTED:
                return StartOutcome.UNCHANGED if old.get(schema.WS_URL) == ws_url else StartOutcome.CONFLICT
            session = old.get(schema.LEASE_SESSION, "")
            update = "SET #s = :started, #w = :url, #u = :now" + (", #k = :free" if not session else "")
            new, _ = self._conditional_update(
                connection_id,
                update=update,
                condition="#s = :stopped AND #l = :session",
                values={
                    ":started": schema.STARTED,
                    ":stopped": schema.STOPPED,
                    ":url": ws_url,
                    ":session": session,
                    ":now": now,
                    **({":free": schema.owner_key_free(connection_id, self._shards)} if not session else {}),
                },
                returns="NONE",
            )
            if new is not None:
                return StartOutcome.RESTARTED
        raise TransientError(f"start of {connection_id!r} kept losing races; try again")

    def stop(self, connection_id: str) -> Stopped:
        """Record that the connection should stop.

        Conditional on: the item exists, desired_state is STARTED, and the session and
        fence it is attached to (read in the same loop). A free one also leaves the sparse index; an
        owned one stays attached until its owner (told through its session's inbox, see
        :meth:`SessionsStore.post_stop`) closes and releases it. Writes nothing otherwise."""
        for _ in range(5):
            item = self.get(connection_id)
            if item is None:
                return Stopped(StopOutcome.NOT_FOUND)
            if item.get(schema.DESIRED_STATE) != schema.STARTED:
                return Stopped(StopOutcome.ALREADY_STOPPED)
            session = item.get(schema.LEASE_SESSION, "")
            fence = int(item.get(schema.FENCE_TOKEN, 0))
            new, old = self._conditional_update(
                connection_id,
                update="SET #s = :stopped, #u = :now" + (" REMOVE #k" if not session else ""),
                condition="attribute_exists(#pk) AND #s = :started AND #l = :session AND #f = :fence",
                values={
                    ":stopped": schema.STOPPED,
                    ":started": schema.STARTED,
                    ":now": self._now_ms(),
                    ":session": session,
                    ":fence": fence,
                },
                returns="NONE",
            )
            if new is not None:
                return Stopped(StopOutcome.STOPPED, session, fence)
        raise TransientError(f"stop of {connection_id!r} kept losing races; try again")


class MessagesStore:
    """The messages table: one item per (connection, seq)."""

    def __init__(self, client: Any, table_name: str, *, ttl_days: int = 0, sleep: Callable[[float], None] = time.sleep):
        self._ddb = client
        self._table = table_name
        self._ttl_s = ttl_days * 86400
        self._sleep = sleep

    def put(self, connection_id: str, frames: Sequence[Frame], *, fence_token: int, worker_id: str) -> None:
        """Store one connection's frames (see :meth:`put_many`)."""
        self.put_many([(connection_id, fence_token, f) for f in frames], worker_id=worker_id)

    def put_many(self, entries: Sequence[tuple[str, int, Frame]], *, worker_id: str) -> None:
        """Store (connection_id, fence_token, frame) entries of any connections, keyed by
        seq (a replay rewrites the same key, never adds a row), 25 per BatchWriteItem.

        BatchWriteItem is not conditional: the caller must check its deadline first.
        Unprocessed items are retried with jittered backoff; a batch that still does not
        go through raises :class:`TransientError` and the caller retries it whole."""
        for start in range(0, len(entries), MAX_BATCH):
            requests = []
            for connection_id, fence_token, f in entries[start : start + MAX_BATCH]:
                item = {
                    schema.MSG_PK: schema.connection_pk(connection_id),
                    schema.MSG_SK: f.seq,
                    schema.MESSAGE_DATA: f.data_json,
                    schema.MSG_FENCE_TOKEN: fence_token,
                    schema.MSG_WORKER_ID: worker_id,
                    schema.RECEIVED_AT_MS: f.received_at_ms,
                }
                if self._ttl_s:
                    item[schema.MESSAGE_TTL_ATTRIBUTE] = f.received_at_ms // 1000 + self._ttl_s
                requests.append({"PutRequest": {"Item": marshal(item)}})
            self._write(requests)

    def _write(self, requests: list) -> None:
        for attempt in range(8):
            try:
                resp = self._ddb.batch_write_item(RequestItems={self._table: requests})
            except (ClientError, BotoCoreError) as exc:
                if refused := unwrap_refusal(exc):
                    raise refused from None  # past its deadline: a retry here would be refused too
                if not is_transient(exc):
                    raise
                resp = {"UnprocessedItems": {self._table: requests}}
            requests = resp.get("UnprocessedItems", {}).get(self._table, [])
            if not requests:
                return
            self._sleep(random.uniform(0.5, 1.0) * min(2.0, 0.05 * 2**attempt))
        raise TransientError(f"{len(requests)} messages still unprocessed after retries")

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        """The end of what is stored gap-free from ``checkpoint``: the highest seq s such
        that every seq in (checkpoint, s] has a row. A new owner resumes after it, so a
        dead owner's writes past its last checkpoint are neither lost nor stored twice,
        and a last batch that was only partly written (UnprocessedItems) is replayed from
        its first hole. Strongly consistent; reads keys only, page by page, and stops at
        the first hole."""
        end = checkpoint
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#p = :p AND #s > :c",
            "ExpressionAttributeNames": {"#p": schema.MSG_PK, "#s": schema.MSG_SK},
            "ExpressionAttributeValues": marshal({":p": schema.connection_pk(connection_id), ":c": checkpoint}),
            "ProjectionExpression": "#s",
            "ConsistentRead": True,
            "Limit": 500,
        }
        while True:
            try:
                resp = self._ddb.query(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                if is_transient(exc):
                    raise TransientError(f"query: {exc}") from exc
                raise
            end, complete = contiguous_end(end, (int(unmarshal(i)[schema.MSG_SK]) for i in resp.get("Items", [])))
            if not complete or "LastEvaluatedKey" not in resp:
                return end
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def read_all(self, connection_id: str) -> list[dict]:
        """Every stored message of a connection in seq order (tests, demo reports)."""
        out: list[dict] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": schema.MSG_PK},
            "ExpressionAttributeValues": marshal({":p": schema.connection_pk(connection_id)}),
        }
        while True:
            resp = self._ddb.query(**kwargs)
            out.extend(unmarshal(i) for i in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
