"""The reference consumer's table: one item per connection holding its
:class:`~wsfleet.consumer.delivery.Delivered` state (``schema.consumer_table_spec``).

One writer per connection at a time is what the event source mapping gives (one
invocation per shard at a time, a connection's records in one shard); every write is
still conditional on the revision it read, so that a second writer is caught rather
than believed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from botocore.exceptions import ClientError

from .. import schema
from ..store.base import _Table, marshal, unmarshal
from .delivery import Delivered


def to_item(connection_id: str, state: Delivered, *, at_ms: int) -> dict[str, Any]:
    item: dict[str, Any] = {
        schema.CONSUMER_CONNECTION_ID: connection_id,
        schema.CONSUMER_FENCE: state.fence_token,
        schema.FENCE_SEEN_AT: state.fence_seen_at,
        schema.CONSUMER_REVISION: state.revision,
        schema.CONSUMER_UPDATED_AT_MS: at_ms,
    }
    if state.ranges:
        item[schema.DELIVERED_FROM], item[schema.DELIVERED_TO] = state.ranges[0]
    if len(state.ranges) > 1:
        item[schema.DELIVERED_ABOVE] = [list(r) for r in state.ranges[1:]]
    return item


def from_item(item: Mapping[str, Any]) -> Delivered:
    ranges: list[tuple[int, int]] = []
    if schema.DELIVERED_FROM in item:
        ranges.append((int(item[schema.DELIVERED_FROM]), int(item[schema.DELIVERED_TO])))
    ranges += [(int(a), int(b)) for a, b in item.get(schema.DELIVERED_ABOVE, [])]
    return Delivered(
        ranges=tuple(ranges),
        fence_token=int(item[schema.CONSUMER_FENCE]),
        fence_seen_at=int(item[schema.FENCE_SEEN_AT]),
        revision=int(item[schema.CONSUMER_REVISION]),
    )


class DeliveryStates(_Table):
    """Reads and conditional writes of the consumer's table. Transient faults (throttling,
    5xx, timeouts) raise :class:`TransientError`; a lost race is a value."""

    key_name = schema.CONSUMER_CONNECTION_ID

    def get(self, connection_id: str) -> Delivered:
        """The connection's state, read consistently (a fresh one if it has none yet)."""
        resp = self._call("get_item", Key=self._key(connection_id), ConsistentRead=True)
        return from_item(unmarshal(resp["Item"])) if "Item" in resp else Delivered()

    def put(self, connection_id: str, before: Delivered, after: Delivered) -> bool:
        """Store ``after`` with the revision after ``before``'s; conditional on the item
        still being at ``before.revision`` (absent, for revision 0). True when stored;
        False when the item moved on without this write (a lost race). A write whose
        answer was lost and whose retry then failed its condition is told apart by
        reading the item: finding exactly ``after`` there, it was this write."""
        stored = replace(after, revision=before.revision + 1)
        condition, values = (
            ("attribute_not_exists(#c)", {}) if before.revision == 0 else ("#r = :r", {":r": before.revision})
        )
        names = {"#c": schema.CONSUMER_CONNECTION_ID} if before.revision == 0 else {"#r": schema.CONSUMER_REVISION}
        item = to_item(connection_id, stored, at_ms=self._now_ms())
        try:
            self._call(
                "put_item",
                Item=marshal(item),
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                **({"ExpressionAttributeValues": marshal(values)} if values else {}),
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            return self.get(connection_id) == stored
        return True
