"""The messages table (``SINK=dynamodb``): one item per (connection, seq), and the reads
of it (a new owner's stored end, the read API's pages)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from botocore.exceptions import BotoCoreError, ClientError

from .. import schema
from ..checkpoint import StoredEnd, Tally
from ..stream import Frame, contiguous_end
from ..store.base import TransientError, _Table, is_transient, marshal, retry_pause_s, unmarshal, unwrap_refusal
from .objects import StoredObject, needs_object
from .sink import InvalidItem

MAX_BATCH = 25  # BatchWriteItem limit

# The key conditions of its queries (``#p`` the connection's partition key, ``#s`` the seq;
# it has no conditional writes: a replay rewrites the same key).
PARTITION = "#p = :p"  # every item of a connection (or, in the markers index, its markers)
PARTITION_AFTER = "#p = :p AND #s > :after"  # a connection's items past ``:after``
MAX_MARKERS_COUNTED = 10_000  # GET's skipped count stops here (a bounded read)


class MessagesStore(_Table):
    """The messages table: one item per (connection, seq). A :class:`~.sink.Sink`."""

    names = (schema.SINK_DYNAMODB,)
    max_batch = MAX_BATCH
    reads_tail = True

    def __init__(self, client: Any, table_name: str, *, ttl_days: int = 0, sleep: Callable[[float], None] = time.sleep):
        super().__init__(client, table_name)
        self._ttl_s = ttl_days * 86400
        self._sleep = sleep

    def put(self, connection_id: str, frames: Sequence[Frame], *, fence_token: int, worker_id: str) -> None:
        """Store one connection's frames (see :meth:`put_many`)."""
        self.put_many([(connection_id, fence_token, f) for f in frames], worker_id=worker_id)

    def put_many(self, entries: Sequence[tuple[str, int, Frame]], *, worker_id: str,
                 objects: Mapping[tuple[str, int], StoredObject] | None = None) -> None:
        """Store (connection_id, fence_token, frame) entries of any connections, keyed by
        seq (a replay rewrites the same key, never adds a row), 25 per BatchWriteItem; a
        frame with no data is stored as a skip marker: its reason, ``data_bytes`` where
        known, and ``skip_to`` for a range; a binary feed's item has ``data_format`` binary. Data too large for an item must already be in
        its object (``objects``, by (connection_id, seq): see :mod:`.objects`); its item
        holds the object's ref, size and SHA-256 instead.

        BatchWriteItem is not conditional: the caller must check its deadline first.
        Unprocessed items are retried with jittered backoff; a batch that still does not
        go through raises :class:`TransientError` and the caller retries it whole. Items
        the table or the client refuses raise :class:`InvalidItem`."""
        for start in range(0, len(entries), MAX_BATCH):
            requests = []
            for connection_id, fence_token, f in entries[start : start + MAX_BATCH]:
                item = {
                    schema.MSG_PK: schema.connection_pk(connection_id),
                    schema.MSG_SK: f.seq,
                    schema.MSG_FENCE_TOKEN: fence_token,
                    schema.MSG_WORKER_ID: worker_id,
                    schema.RECEIVED_AT_MS: f.received_at_ms,
                }
                if needs_object(f):
                    stored = (objects or {}).get((connection_id, f.seq))
                    if stored is None:  # a bug of the caller's: never an item that points at nothing
                        raise ValueError(f"{connection_id} seq {f.seq}: large data stored before its object")
                    item[schema.DATA_REF] = stored.ref
                    item[schema.DATA_BYTES] = stored.size
                    item[schema.DATA_SHA256] = stored.sha256
                elif f.data_json is not None:
                    item[schema.MESSAGE_DATA] = f.data_json
                else:
                    item[schema.SKIPPED] = f.reason
                    if f.data_bytes is not None:
                        item[schema.DATA_BYTES] = f.data_bytes
                    if f.skip_to is not None:
                        item[schema.SKIP_TO] = f.skip_to
                if f.binary and f.data_json is not None:  # (a marker has no data to say the format of)
                    item[schema.DATA_FORMAT] = schema.DATA_FORMAT_BINARY
                if self._ttl_s:
                    item[schema.MESSAGE_TTL_ATTRIBUTE] = f.received_at_ms // 1000 + self._ttl_s
                try:
                    requests.append({"PutRequest": {"Item": marshal(item)}})
                except (TypeError, ValueError, ArithmeticError) as exc:  # decimal's signals are ArithmeticErrors
                    raise InvalidItem(f"{connection_id} seq {f.seq}: {type(exc).__name__}: {exc}") from exc
            self._write(requests)

    def _write(self, requests: list) -> None:
        for attempt in range(8):
            try:
                resp = self._ddb.batch_write_item(RequestItems={self._table: requests})
            except (ClientError, BotoCoreError) as exc:
                if refused := unwrap_refusal(exc):
                    raise refused from None  # past its deadline: a retry here would be refused too
                if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "ValidationException":
                    raise InvalidItem(str(exc)) from exc
                if not is_transient(exc):
                    raise
                resp = {"UnprocessedItems": {self._table: requests}}
            requests = resp.get("UnprocessedItems", {}).get(self._table, [])
            if not requests:
                return
            self._sleep(retry_pause_s(attempt))
        raise TransientError(f"{len(requests)} messages still unprocessed after retries")

    def stored_end(self, connection_id: str, checkpoint: int) -> StoredEnd:
        """The end of what is stored gap-free from ``checkpoint``: the highest seq s such
        that every seq in (checkpoint, s] has a row or lies in a range marker's
        (seq..skip_to). A new owner resumes after it, so a dead owner's writes past its
        last checkpoint are neither lost nor stored twice, a last batch that was only
        partly written (UnprocessedItems) is replayed from its first hole, and a skipped
        range is never asked for again. Strongly consistent; reads keys and ``skip_to``
        page by page, and stops at the first hole. It returns what those items add to the
        connection's counts too (:class:`~wsfleet.checkpoint.StoredEnd`): the owner that
        stored them died before a checkpoint counted them. (Reading the items whole costs
        no more read units than their keys: a Query is billed by the items' size.)

        A checkpoint is never inside a range (the writer reports a range's end as stored,
        and owners resume after it), so the ranges that matter start past it."""
        end, pieces = checkpoint, []
        pages = self._query_pages(
            KeyConditionExpression=PARTITION_AFTER,
            ExpressionAttributeNames={
                "#p": schema.MSG_PK, "#s": schema.MSG_SK, "#t": schema.SKIP_TO, "#d": schema.MESSAGE_DATA,
                "#b": schema.DATA_BYTES, "#k": schema.SKIPPED, "#r": schema.RECEIVED_AT_MS,
            },
            ExpressionAttributeValues=marshal({":p": schema.connection_pk(connection_id), ":after": checkpoint}),
            ProjectionExpression="#s, #t, #d, #b, #k, #r",
            ConsistentRead=True,
            Limit=500,
        )
        for resp in pages:
            items = [unmarshal(raw) for raw in resp.get("Items", [])]
            end, complete = contiguous_end(end, map(_span, items))
            pieces += [(last, _counts(item)) for item in items if (last := _span(item)[1]) <= end]
            if not complete:
                break
        return StoredEnd(end, tuple(p for p in pieces if p[1]))

    def read_all(self, connection_id: str) -> list[dict]:
        """Every stored message of a connection in seq order (tests, demo reports)."""
        out: list[dict] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": PARTITION,
            "ExpressionAttributeNames": {"#p": schema.MSG_PK},
            "ExpressionAttributeValues": marshal({":p": schema.connection_pk(connection_id)}),
        }
        while True:
            resp = self._ddb.query(**kwargs)
            out.extend(unmarshal(i) for i in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def read_after(self, connection_id: str, after_seq: int, *, batch: int) -> Iterator[dict]:
        """A connection's items with seq > ``after_seq``, ascending, read lazily: one
        Query of at most ``batch`` items at a time, the next only when the caller asks
        for more, so a reader that stops early (a full page) pays for one Query.
        Strongly consistent: a reader following the stream sees every item whose write
        was acknowledged, not an older state of the partition. Only the attributes a
        reader is shown are read (not the fence or the worker)."""
        names = {
            "#p": schema.MSG_PK,
            "#s": schema.MSG_SK,
            "#d": schema.MESSAGE_DATA,
            "#r": schema.DATA_REF,
            "#b": schema.DATA_BYTES,
            "#h": schema.DATA_SHA256,
            "#k": schema.SKIPPED,
            "#t": schema.SKIP_TO,
            "#e": schema.MESSAGE_TTL_ATTRIBUTE,
            "#f": schema.DATA_FORMAT,
        }
        pages = self._query_pages(
            KeyConditionExpression=PARTITION_AFTER,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=marshal({":p": schema.connection_pk(connection_id), ":after": after_seq}),
            ProjectionExpression="#s, #d, #r, #b, #h, #k, #t, #e, #f",
            ConsistentRead=True,
            Limit=batch,
        )
        for resp in pages:
            yield from (unmarshal(i) for i in resp.get("Items", []))

    def count_markers(self, connection_id: str, *, most: int = MAX_MARKERS_COUNTED) -> int:
        """How many skip markers a connection has, up to ``most`` (counting stops there: a
        GET reads a bounded number of index pages however many markers there are): a COUNT
        Query of its partition of the sparse markers index (only markers are in it), so no
        message is read. Eventually consistent, as every GSI read is."""
        counted = 0
        for resp in self._query_pages(
            IndexName=schema.MARKERS_INDEX,
            KeyConditionExpression=PARTITION,
            ExpressionAttributeNames={"#p": schema.MSG_PK},
            ExpressionAttributeValues=marshal({":p": schema.connection_pk(connection_id)}),
            Select="COUNT",
            Limit=most,  # each page counts at most this many
        ):
            counted += int(resp.get("Count", 0))
            if counted >= most:
                return most
        return counted


def _counts(item: Mapping[str, Any]) -> Tally:
    """What a stored item adds to its connection's counts (as :func:`wsfleet.worker.batches.tally`
    counts a frame the writer stored): a frame with data, its size; a skip marker, nothing."""
    if schema.SKIPPED in item:
        return Tally()
    size = item.get(schema.DATA_BYTES)
    if size is None:
        size = len(str(item.get(schema.MESSAGE_DATA, "")).encode("utf-8"))
    return Tally(1, int(size), int(item.get(schema.RECEIVED_AT_MS, 0)))


def _span(item: Mapping[str, Any]) -> tuple[int, int]:
    """(seq, last seq it stands for) of a stored item: a range marker's skip_to, or its seq."""
    seq = int(item[schema.MSG_SK])
    return seq, max(seq, int(item.get(schema.SKIP_TO, seq)))
