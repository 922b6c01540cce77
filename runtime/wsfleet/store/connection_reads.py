"""The connections table's reads: an item, many items, the by_owner index (what a session
holds, the FREE# partitions), and the sweep's scan. A part of
:class:`~wsfleet.store.ConnectionsStore`, kept apart (as :mod:`.desired` is) so that the
table's ownership writes stay one room."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from botocore.exceptions import ClientError

from .. import schema
from . import conditions as cond
from .base import _names, marshal, unmarshal


@dataclass(frozen=True)
class Owned:
    """A row of the by_owner index: what a session holds, as the index last saw it."""

    connection_id: str
    desired_state: str


# Items per page when a session's connections are listed (the audit every 30 s, a
# drain). DynamoDB would answer a whole worker's holding (1,000 rows of about 100 bytes)
# in one request; the embedded emulator takes about 0.45 s to serialise such a page,
# inside the lock every DynamoDB request waits for, and every frame stored meanwhile
# waits with it. Pages of 100 hold it about 50 ms each, for 9 more requests per audit.
OWNER_PAGE_ITEMS = 100


class ConnectionReads:
    """``ConnectionsStore``'s reads (it supplies the table helpers below)."""

    _batch_get: Any
    _call: Any
    _key: Any
    _query_pages: Any

    def get(self, connection_id: str, *, consistent: bool = True) -> dict | None:
        resp = self._call("get_item", Key=self._key(connection_id), ConsistentRead=consistent)
        return unmarshal(resp["Item"]) if "Item" in resp else None

    def _owner_pages(self, owner_key: str, *, projection: str = "", **extra: Any) -> Iterator[dict]:
        if projection:
            extra.update(Select="SPECIFIC_ATTRIBUTES", ProjectionExpression=projection)
        return self._query_pages(
            IndexName=schema.OWNER_INDEX,
            KeyConditionExpression=cond.OWNER_PARTITION,
            ExpressionAttributeNames=_names(cond.OWNER_PARTITION, projection),
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

    def _owner_ids(self, owner_key: str, **extra: Any) -> Iterator[str]:
        """The connection ids of one by_owner partition, page by page (``extra``: as
        :meth:`_owner_pages` takes it)."""
        for page in self._owner_pages(owner_key, **extra):
            for raw in page.get("Items", []):
                yield schema.connection_id_from_pk(unmarshal(raw)[schema.PK])

    def free(self, shard: int, *, limit: int = 100, start_after: str = "") -> Iterator[str]:
        """STARTED connections nobody owns, of one index shard, ``limit`` per request:
        from just after the connection ``start_after`` (a random point, so that scanners
        do not all race for the same first entries; it need not be in the partition) to
        the partition's end, then from its start round to the first one already given.
        "" reads from the start."""
        partition = schema.free_partition(shard)
        seen: set[str] = set()
        if start_after:
            start = marshal({schema.PK: schema.connection_pk(start_after), schema.OWNER_KEY: partition})
            try:
                for cid in self._owner_ids(partition, Limit=limit, ExclusiveStartKey=start):
                    seen.add(cid)
                    yield cid
            except ClientError as exc:
                # A start key the table refuses ("The provided starting key is invalid"):
                # the scan reads from the start, as it did before it had a random point.
                if exc.response.get("Error", {}).get("Code") != "ValidationException":
                    raise
        for cid in self._owner_ids(partition, Limit=limit):
            if cid in seen:
                return  # round to where this scan began
            yield cid

    def free_ids(self, shard: int) -> set[str]:
        """Every STARTED connection of one shard nobody owns, keys only: what the
        UnownedConnections count compares between two of its samples."""
        return set(self._owner_ids(schema.free_partition(shard), projection="#pk"))

    def count_free(self, shard: int) -> int:
        """How many STARTED connections of one shard nobody owns, without reading them."""
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.free_partition(shard), Select="COUNT"))

    def count_owned_by(self, session_id: str) -> int:
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.owner_key_session(session_id), Select="COUNT"))

    def sweep_page(
        self, start: Mapping | None, *, limit: int, segment: int = 0, segments: int = 1
    ) -> tuple[list[dict], dict | None]:
        """One page of a Scan of every connection, as the reachability sweep reads it:
        (items with their key, desired state, session, owner key, fence, release mark
        and update time; the key to start the next page from, or None after the last).
        ``segment`` of ``segments``: the part of the table this page is of (a parallel
        Scan; each segment pages on its own). Eventually consistent: a caller acts only
        on what a consistent read confirms."""
        if not 0 <= segment < segments:
            raise ValueError(f"segment {segment} is not one of {segments} segments")
        projection = "#pk, #s, #l, #k, #f, #rf, #u"
        kwargs: dict[str, Any] = {
            "ProjectionExpression": projection,
            "ExpressionAttributeNames": _names(projection),
            "Limit": limit,
        }
        if segments > 1:
            kwargs.update(Segment=segment, TotalSegments=segments)
        if start:
            kwargs["ExclusiveStartKey"] = dict(start)
        resp = self._call("scan", **kwargs)
        return [unmarshal(i) for i in resp.get("Items", [])], resp.get("LastEvaluatedKey")

    def get_many(self, connection_ids: Sequence[str]) -> dict[str, dict | None]:
        """Strongly consistent BatchGetItem of whole connection items, 100 per request;
        None for one that does not exist."""
        found = {
            schema.connection_id_from_pk(item[schema.PK]): item
            for item in self._batch_get(connection_ids, ConsistentRead=True)
        }
        return {c: found.get(c) for c in connection_ids}
