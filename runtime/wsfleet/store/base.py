"""What every table adapter shares: transient faults told apart from lost races,
(un)marshalling, expression placeholders, and :class:`_Table`, whose conditional
update returns the old item when its condition fails."""

from __future__ import annotations

import random
import re
import time
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, Sequence

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from .. import schema

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
        # A write to an item that a transaction holds at that moment (a renewal while the
        # router's STOP transaction posts to the same session's inbox).
        "TransactionConflictException",
        "LimitExceededException",
        "RequestThrottled",
        # S3 (the messages bucket): SlowDown is a 503, RequestTimeout a 400.
        "SlowDown",
        "RequestTimeout",
    }
)

# Cancellation reasons of a transaction that say nothing about ownership: retry it.
TRANSIENT_CANCEL_CODES = frozenset(
    {"None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"}
)


class TransientError(Exception):
    """A request failed in a way that says nothing about ownership; retry it."""


class TransactionCancelled(TransientError):
    """A transaction was cancelled for reasons that say nothing about its conditions (a
    conflict with another transaction on one of its items, throttling): it may go again."""


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


BATCH_GET_TRIES = 8  # requests of one BatchGetItem with keys left unprocessed: ~4 s of pauses at most


def retry_pause_s(attempt: int) -> float:
    """The pause before a store's own retry inside one call (the table's unprocessed
    items, the stream's refused records): jittered, doubling from 25-50 ms, at most 2 s."""
    return random.uniform(0.5, 1.0) * min(2.0, 0.05 * 2**attempt)


def now_ms() -> int:
    return int(time.time() * 1000)


# Every attribute an expression names, by placeholder. DynamoDB refuses unused names,
# so each request carries only the placeholders its expressions use.
_PLACEHOLDERS = {
    "#pk": schema.PK,
    "#s": schema.DESIRED_STATE,
    "#w": schema.WS_URL,
    "#q": schema.LAST_SEQ,
    "#ce": schema.CHECKPOINT_IS_END,
    "#rf": schema.RELEASED_FENCE,
    "#up": schema.UPSTREAM,
    "#le": schema.LAST_ERROR,
    "#sr": schema.SEQ_RESERVED,
    "#lt": schema.LAST_ERROR_AT_MS,
    "#lfa": schema.LAST_FRAME_AT_MS,
    "#nf": schema.FRAMES,
    "#nb": schema.BYTES,
    "#sk": schema.STRIKES,
    "#ss": schema.STRIKES_SINCE_MS,
    "#sf": schema.STRIKE_FENCE,
    "#qt": schema.QUARANTINED,
    "#ps": schema.SUSPECT,
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
    "#th": schema.END_TRACE,
    "#in": schema.STOP_INBOX,
    "#as": schema.ASSIGNED,
    "#r": schema.RING,
    "#dr": schema.DRAINING,
    "#drq": schema.DRAIN_REQUESTED,
    "#rc": schema.RING_CHANGES,
    "#fw": schema.FLEET_WORKERS,
    "#fc": schema.FLEET_CAPACITY,
    "#fb": schema.FLEET_BELOW_SHARE,
    "#fs": schema.FLEET_SUSPECTS,
    "#ft": schema.FLEET_AT_MS,
    "#fu": schema.FLEET_UNDER,
    "#fo": schema.FLEET_OVER,
    "#fx": schema.FLEET_CUT_REM,
    "#fi": schema.FLEET_CUT_ID,
    "#fl": schema.FLEET_LOADS,
    "#fd": schema.FLEET_DEAD,
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

    def _batch_get(self, keys: Sequence[str], **options: Any) -> list[dict]:
        """This table's items, by BatchGetItem, 100 keys per request (``options``: its
        per-table settings, ConsistentRead, ProjectionExpression...), unmarshalled; missing
        ones are left out. The keys must not repeat (BatchGetItem refuses that)."""
        return [item for start in range(0, len(keys), 100) for item in self._batch_get_one(keys[start : start + 100], **options)]

    def _batch_get_one(self, keys: Sequence[str], **options: Any) -> list[dict]:
        """One BatchGetItem of up to 100 keys, as :meth:`_batch_get`. Keys left unprocessed (throttling, or the 16 MB limit) are asked for
        again after a backoff (:func:`retry_pause_s`), up to ``BATCH_GET_TRIES`` requests
        in all; a transient fault, or keys still unprocessed after that, raise
        TransientError."""
        request = {self._table: {"Keys": [self._key(k) for k in keys], **options}}
        out: list[dict] = []
        for attempt in range(BATCH_GET_TRIES):
            if attempt:
                time.sleep(retry_pause_s(attempt))
            try:
                resp = self._ddb.batch_get_item(RequestItems=request)
            except (ClientError, BotoCoreError) as exc:
                if is_transient(exc):
                    raise TransientError(f"batch_get_item: {exc}") from exc
                raise
            out.extend(unmarshal(item) for item in resp.get("Responses", {}).get(self._table, []))
            left = resp.get("UnprocessedKeys", {}).get(self._table)
            if not left or not left.get("Keys"):
                return out
            request = {self._table: left}
        raise TransientError(f"batch_get_item: keys left unprocessed after {BATCH_GET_TRIES} requests")

    def _update(self, key: str, *, update: str, condition: str, values: Mapping[str, Any]) -> dict:
        """A conditional update of one item, as UpdateItem and a transaction's Update take it."""
        return {
            "Key": self._key(key),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": _names(update, condition),
            "ExpressionAttributeValues": marshal(values),
        }

    def _transact_update(
        self, key: str, *, update: str, condition: str, values: Mapping[str, Any], return_old: bool = False
    ) -> dict:
        """The same as one entry of a TransactWriteItems (which may span tables);
        ``return_old``: if its condition fails, its cancellation reason carries the old item."""
        params = self._update(key, update=update, condition=condition, values=values)
        if return_old:
            params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return {"Update": {"TableName": self._table, **params}}

    def _conditional_update(
        self, key: str, *, update: str, condition: str, values: Mapping[str, Any], returns: str = "ALL_NEW"
    ) -> tuple[dict | None, dict | None]:
        """(new item, None) on success, (None, old item or None) when the condition failed."""
        try:
            resp = self._call(
                "update_item",
                **self._update(key, update=update, condition=condition, values=values),
                ReturnValues=returns,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if _condition_failed(exc):
                return None, _old_item(exc)
            raise
        return unmarshal(resp.get("Attributes", {})), None

    def _transact(self, items: list[dict]) -> list[dict] | None:
        """One TransactWriteItems. None when it landed; when a condition failed, every
        entry's cancellation reason, in order (``Code`` "ConditionalCheckFailed", or
        "None" for an entry that was fine; ``Item``, unmarshalled, where the entry asked
        for the old item). Raises :class:`TransactionCancelled` when cancelled for other
        reasons (nothing was written; it may go again) and :class:`TransientError` on a
        transient fault. botocore gives every call a ClientRequestToken, so that its own
        retries of a transaction that landed succeed again on DynamoDB (moto ignores the
        token: there such a retry fails its conditions, as a later call would)."""
        try:
            self._ddb.transact_write_items(TransactItems=items)
        except (ClientError, BotoCoreError) as exc:
            if is_transient(exc):
                raise TransientError(f"transact_write_items: {exc}") from exc
            if not isinstance(exc, ClientError) or exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = [
                {**r, "Code": r.get("Code", "None"), **({"Item": unmarshal(r["Item"])} if r.get("Item") else {})}
                for r in exc.response.get("CancellationReasons", [])
            ]
            if len(reasons) != len(items):
                raise TransactionCancelled(f"transact_write_items: {len(reasons)} reasons for {len(items)} entries") from exc
            codes = {r["Code"] for r in reasons}
            if "ConditionalCheckFailed" in codes:
                return reasons
            if codes - TRANSIENT_CANCEL_CODES:  # ValidationError and the like: a bug, not a fault to wait out
                raise
            raise TransactionCancelled(f"transact_write_items cancelled: {', '.join(sorted(codes - {'None'}))}") from exc
        return None

    def _query_pages(self, **kwargs: Any) -> Iterator[dict]:
        while True:
            resp = self._call("query", **kwargs)
            yield resp
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
