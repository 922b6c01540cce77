"""DynamoDB adapter: every read and conditional write of the two tables, and nothing else.

Each write says in its docstring what it is conditional on. A lost race comes back as
a value (a ``NotAcquired``, a ``RenewFailure``, a router outcome); a transient
fault (throttling, timeout, 5xx, connection error) is raised as :class:`TransientError`,
so that no caller can mistake one for the other. The calls are synchronous boto3: the
worker runs them in threads (see ``wsfleet.aws``), the Lambda router calls them directly.
"""

from __future__ import annotations

import enum
import re
import time
from decimal import Decimal
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from . import schema
from .stream import Frame
from .leases import (
    AcquireFailure,
    Candidate,
    RenewFailure,
    acquire_already_landed,
    classify_acquire_failure,
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


class TransientError(Exception):
    """A request failed in a way that says nothing about ownership; retry it."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return err.get("Code") in TRANSIENT_CODES or status >= 500
    return isinstance(exc, BotoCoreError)  # timeouts, connection errors, ...


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
class Acquired:
    item: dict  # the connection item after the acquisition


@dataclass(frozen=True)
class NotAcquired:
    reason: AcquireFailure
    lease_expires_at_ms: int | None = None  # the lease as it was, when it is HELD


class StartOutcome(enum.Enum):
    CREATED = "created"  # new connection: 202
    RESTARTED = "restarted"  # was STOPPED, now STARTED again: 202
    UNCHANGED = "unchanged"  # already STARTED with this ws_url: 200
    CONFLICT = "conflict"  # already STARTED with another ws_url: 409


class StopOutcome(enum.Enum):
    STOPPED = "stopped"  # 202
    ALREADY_STOPPED = "already_stopped"  # 200
    NOT_FOUND = "not_found"  # 404


# Every attribute an expression names, by placeholder. DynamoDB refuses unused names,
# so each request carries only the placeholders its expressions use.
_PLACEHOLDERS = {
    "#pk": schema.PK,
    "#s": schema.DESIRED_STATE,
    "#w": schema.WS_URL,
    "#q": schema.LAST_SEQ,
    "#o": schema.LEASE_OWNER,
    "#e": schema.LEASE_EXPIRES_AT_MS,
    "#f": schema.FENCE_TOKEN,
    "#u": schema.UPDATED_AT_MS,
    "#g": schema.GSI_PK,
}


def _names(*expressions: str) -> dict[str, str]:
    used = set(re.findall(r"#[a-z]+", " ".join(expressions)))
    return {k: v for k, v in _PLACEHOLDERS.items() if k in used}


class ConnectionsStore:
    """The connections (lease) table."""

    def __init__(self, client: Any, table_name: str, *, state_shards: int, clock_ms: Callable[[], int] = now_ms):
        self._ddb = client
        self._table = table_name
        self._shards = state_shards
        self._now_ms = clock_ms

    def _call(self, op: str, **kwargs: Any) -> dict:
        try:
            return getattr(self._ddb, op)(TableName=self._table, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            if is_transient(exc):
                raise TransientError(f"{op}: {exc}") from exc
            raise

    def _conditional_update(
        self, connection_id: str, *, update: str, condition: str, values: Mapping[str, Any]
    ) -> tuple[dict | None, dict | None]:
        """(new item, None) on success, (None, old item or None) when the condition failed."""
        try:
            resp = self._call(
                "update_item",
                Key=marshal({schema.PK: schema.connection_pk(connection_id)}),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=_names(update, condition),
                ExpressionAttributeValues=marshal(values),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if _condition_failed(exc):
                return None, _old_item(exc)
            raise
        return unmarshal(resp["Attributes"]), None

    # --- reads -------------------------------------------------------------------------

    def get(self, connection_id: str, *, consistent: bool = True) -> dict | None:
        resp = self._call(
            "get_item", Key=marshal({schema.PK: schema.connection_pk(connection_id)}), ConsistentRead=consistent
        )
        return unmarshal(resp["Item"]) if "Item" in resp else None

    def _index_pages(self, shard: int, below_ms: int, **extra: Any) -> Iterator[dict]:
        """Query pages of one index shard: STARTED connections whose lease expires before
        ``below_ms`` (free leases have expiry 0), oldest first, fetched lazily."""
        kwargs: dict[str, Any] = {
            "IndexName": schema.GSI_NAME,
            "KeyConditionExpression": "#p = :p AND #e < :below",
            "ExpressionAttributeNames": {"#p": schema.GSI_PK, "#e": schema.GSI_SK},
            "ExpressionAttributeValues": marshal({":p": schema.gsi_partition(shard), ":below": below_ms}),
            **extra,
        }
        while True:
            resp = self._call("query", **kwargs)
            yield resp
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def suspects(self, shard: int, *, below_ms: int, limit: int = 100) -> Iterator[Candidate]:
        """STARTED connections of one index shard whose lease expires before ``below_ms``,
        oldest first, ``limit`` per request."""
        for page in self._index_pages(shard, below_ms, Limit=limit):
            for raw in page.get("Items", []):
                row = unmarshal(raw)
                yield Candidate(schema.connection_id_from_pk(row[schema.PK]), int(row[schema.GSI_SK]))

    def count_unowned(self, shard: int, *, now_ms: int) -> int:
        """How many STARTED connections of one index shard have no live lease (free, or
        expired by their owner's clock), counted without reading the items."""
        return sum(page.get("Count", 0) for page in self._index_pages(shard, now_ms, Select="COUNT"))

    # --- lease writes ------------------------------------------------------------------

    def acquire(
        self, connection_id: str, *, owner: str, lease_ms: int, max_clock_skew_ms: int
    ) -> Acquired | NotAcquired:
        """Take the lease.

        Conditional on: the item exists, desired_state is STARTED, and its lease is free
        or expired (``lease_expires_at_ms < now - max_clock_skew_ms``). Sets owner and
        expiry and increments ``fence_token``. Exactly one of any number of racing
        callers succeeds; the others get the reason they lost (and, when the lease is
        held, its expiry). A retry whose first attempt already landed (we own it now)
        counts as success.
        """
        now = self._now_ms()
        new, old = self._conditional_update(
            connection_id,
            update="SET #o = :me, #e = :exp, #u = :now ADD #f :one",
            condition="attribute_exists(#pk) AND #s = :started AND #e < :cutoff",
            values={
                ":me": owner,
                ":exp": now + lease_ms,
                ":now": now,
                ":one": 1,
                ":started": schema.STARTED,
                ":cutoff": now - max_clock_skew_ms,
            },
        )
        if new is not None:
            return Acquired(new)
        if acquire_already_landed(old, owner):
            return Acquired(old)
        expires = int(old[schema.LEASE_EXPIRES_AT_MS]) if old and schema.LEASE_EXPIRES_AT_MS in old else None
        return NotAcquired(classify_acquire_failure(old), expires)

    def renew(
        self, connection_id: str, *, owner: str, fence_token: int, lease_ms: int, last_seq: int
    ) -> dict | RenewFailure:
        """Extend the lease and store the checkpoint in the same write.

        Conditional on: ``lease_owner`` is us, ``fence_token`` is ours and desired_state
        is STARTED. On failure the old item tells why (lost / STOPPED / deleted), so STOP
        detection costs no extra read. Idempotent: a retry of a renewal that landed
        succeeds again.
        """
        now = self._now_ms()
        new, old = self._conditional_update(
            connection_id,
            update="SET #e = :exp, #u = :now, #q = :seq",
            condition="#o = :me AND #f = :fence AND #s = :started",
            values={
                ":me": owner,
                ":exp": now + lease_ms,
                ":now": now,
                ":fence": fence_token,
                ":started": schema.STARTED,
                ":seq": last_seq,
            },
        )
        if new is not None:
            return new
        return classify_renew_failure(old, owner, fence_token)

    def release(self, connection_id: str, *, owner: str, fence_token: int, last_seq: int) -> bool:
        """Give the lease up (owner "", expiry 0) with a final checkpoint.

        Conditional on: ``lease_owner`` is us and ``fence_token`` is ours. Returns False
        when the lease was no longer ours (nothing written). A retry whose first attempt
        landed returns True.
        """
        now = self._now_ms()
        new, old = self._conditional_update(
            connection_id,
            update="SET #o = :free, #e = :zero, #u = :now, #q = :seq",
            condition="#o = :me AND #f = :fence",
            values={":free": "", ":zero": 0, ":now": now, ":me": owner, ":fence": fence_token, ":seq": last_seq},
        )
        return new is not None or release_already_landed(old, owner, fence_token)

    # --- desired state (the router) -------------------------------------------------------

    def start(self, connection_id: str, ws_url: str) -> StartOutcome:
        """Record that the connection should run.

        A new connection is created with a conditional put (``attribute_not_exists``);
        a STOPPED one is flipped with an update conditional on ``desired_state =
        STOPPED``, keeping its checkpoint, fence and lease. A STARTED one is never
        written, so a repeated or concurrent START cannot reset a live lease. Losing a
        race to a concurrent writer re-reads the outcome from the item it lost to.
        """
        for _ in range(5):
            now = self._now_ms()
            item = {
                schema.PK: schema.connection_pk(connection_id),
                schema.DESIRED_STATE: schema.STARTED,
                schema.WS_URL: ws_url,
                schema.LAST_SEQ: 0,
                schema.LEASE_OWNER: "",
                schema.LEASE_EXPIRES_AT_MS: 0,
                schema.FENCE_TOKEN: 0,
                schema.UPDATED_AT_MS: now,
                schema.CREATED_AT_MS: now,
                schema.GSI_PK: schema.gsi_state(connection_id, self._shards),
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
            new, _ = self._conditional_update(
                connection_id,
                update="SET #s = :started, #w = :url, #g = :g, #u = :now",
                condition="#s = :stopped",
                values={
                    ":started": schema.STARTED,
                    ":stopped": schema.STOPPED,
                    ":url": ws_url,
                    ":g": schema.gsi_state(connection_id, self._shards),
                    ":now": now,
                },
            )
            if new is not None:
                return StartOutcome.RESTARTED
        raise TransientError(f"start of {connection_id!r} kept losing races; try again")

    def stop(self, connection_id: str) -> StopOutcome:
        """Record that the connection should stop; the owner sees it at its next renewal.

        Conditional on: the item exists and desired_state is STARTED. Removes the index
        key so the connection leaves the sparse orphan index. Writes nothing otherwise.
        """
        new, old = self._conditional_update(
            connection_id,
            update="SET #s = :stopped, #u = :now REMOVE #g",
            condition="attribute_exists(#pk) AND #s = :started",
            values={":stopped": schema.STOPPED, ":started": schema.STARTED, ":now": self._now_ms()},
        )
        if new is not None:
            return StopOutcome.STOPPED
        return StopOutcome.NOT_FOUND if old is None else StopOutcome.ALREADY_STOPPED


class MessagesStore:
    """The messages table: one item per (connection, seq)."""

    def __init__(self, client: Any, table_name: str, *, ttl_days: int = 0, sleep: Callable[[float], None] = time.sleep):
        self._ddb = client
        self._table = table_name
        self._ttl_s = ttl_days * 86400
        self._sleep = sleep

    def put(self, connection_id: str, frames: Sequence[Frame], *, fence_token: int, worker_id: str) -> None:
        """Store frames keyed by seq (a replay rewrites the same key, never adds a row).

        BatchWriteItem is not conditional: the caller must check its lease deadline
        first. Unprocessed items are retried with backoff; a batch that still does not
        go through raises :class:`TransientError` and the caller retries it whole.
        """
        pk = schema.connection_pk(connection_id)
        for start in range(0, len(frames), MAX_BATCH):
            requests = []
            for f in frames[start : start + MAX_BATCH]:
                item = {
                    schema.MSG_PK: pk,
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
                if not is_transient(exc):
                    raise
                resp = {"UnprocessedItems": {self._table: requests}}
            requests = resp.get("UnprocessedItems", {}).get(self._table, [])
            if not requests:
                return
            self._sleep(min(2.0, 0.05 * 2**attempt))
        raise TransientError(f"{len(requests)} messages still unprocessed after retries")

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
