"""The messages stream (``SINK=kinesis``): one connection's frames of a call packed into
one Kinesis record, PutRecords batches.

A :class:`~.sink.Sink`. Each frame becomes one user record (:func:`wsfleet.records.encode`),
and the user records of one connection in one call are packed, in seq order, into
aggregates (:mod:`wsfleet.aggregation`, the Kinesis Producer Library's format, which KCL
and the Lambda deaggregation modules unpack) of at most ``max_aggregate_bytes``; a
connection with one frame in the call, or a frame too large to share a record, goes as
a plain record. Partition key = connection id, for the aggregate and for every record in
it, so one connection's records stay in one shard, in the order they were acknowledged.
Kinesis bills and limits per Kinesis record (each rounded up to a KB): at the rates
most feeds have, frames that arrive within one flush interval share one. Each user
record keeps its own seq and fence: a consumer sees after unpacking what it saw
before. Invariants it keeps, whatever the stream answers (a "record" below is a
Kinesis record, an aggregate or a plain one):

* a request holds at most 500 records and 5 MiB (data and partition keys), and the
  requests of one call go one after the other, each acknowledged whole before the next;
* every entry is encoded (and checked against the 1 MiB record limit) before anything
  is sent, so :class:`InvalidItem` for an entry never leaves half a call on the stream
  (a ValidationException from Kinesis itself is raised as InvalidItem too, as the table
  does: the writer splits the call to find the record; what went before it is sent
  again, in order);
* a record refused in a PutRecords answer is sent again together with every later
  record of the same connection in that request, in their order: per connection, the
  LAST delivery of every seq is in seq order (earlier deliveries are duplicates with
  the same fence, which the consumer rule absorbs). Counted in ``RecordsResent``;
  refusals for throughput are counted in ``RecordsThrottled`` and followed by a
  jittered backoff;
* it returns only once every record is acknowledged; after a bounded number of rounds
  in a row that acknowledged nothing more it raises :class:`TransientError` and the
  writer sends the whole call again (what was acknowledged is delivered twice, same
  fence, in order again). The cost of the order rule: under steady per-record
  refusals, a connection with many records in one request sends its acknowledged
  tail again each round (duplicates grow with its depth in the batch; the writer's
  fair share keeps that depth small when many connections are busy);
* PutRecords is not conditional: the caller checks its deadline as each request leaves
  (``aws.send_deadline``), whose refusal is raised as it is (unwrapped).

A stream's tail cannot be read cheaply, so :meth:`StreamSink.stored_end` returns the
checkpoint: a new owner after a crash delivers again what was sent since it, with a
higher fence (at least once; a clean release's checkpoint is exact, nothing again).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from .. import aggregation, records, schema
from ..stream import Frame
from .objects import StoredObject
from .record_puts import Count, LockedCount, Service, frame_record, put_until_acknowledged, requests
from .sink import InvalidItem

# Rounds of one request's records (the refused ones sent again) before TransientError.
MAX_ROUNDS = 8
# Per-record and whole-request refusals that mean the shard or the key is at its limit.
THROUGHPUT_CODES = frozenset({"ProvisionedThroughputExceededException", "KMSThrottlingException"})
KINESIS = Service("PutRecords", "stream", "ValidationException", THROUGHPUT_CODES)


class _Rec:
    __slots__ = ("connection_id", "entry")

    def __init__(self, connection_id: str, entry: dict) -> None:
        self.connection_id = connection_id
        self.entry = entry  # {"Data": bytes, "PartitionKey": str}, as PutRecords takes it


class StreamSink:
    """The messages stream: ``stream`` is its name or its ARN. ``count(name, n)`` adds to
    a counter; it is called from the pool threads that run :meth:`put_many`, under a
    lock of this sink's, so it must be safe against the event loop's own adds to other
    counters (``metrics.Counters.add`` is: one dict item per name)."""

    names = (schema.SINK_KINESIS,)
    max_batch = records.MAX_PUT_RECORDS
    reads_tail = False

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        count: Count | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_rounds: int = MAX_ROUNDS,
        max_aggregate_bytes: int | None = records.MAX_AGGREGATE_BYTES,
    ) -> None:
        if max_aggregate_bytes is not None and not 0 < max_aggregate_bytes <= records.MAX_RECORD_BYTES:
            raise ValueError(f"max_aggregate_bytes must be from 1 to {records.MAX_RECORD_BYTES}, got {max_aggregate_bytes}")
        self._max_aggregate = max_aggregate_bytes
        self._client = client
        self._target = {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}
        self._add = LockedCount(count)
        self._sleep = sleep
        self._rounds = max_rounds
        self.stream = stream

    def put_many(self, entries: Sequence[tuple[str, int, Frame]], *, worker_id: str,
                 objects: Mapping[tuple[str, int], StoredObject] | None = None) -> None:
        """One user record per (connection_id, fence_token, frame), each connection's
        packed in their order into its records (the connections in the order of their
        first entry), in requests of at most 500 records and 5 MiB; returns once all are
        acknowledged (see the module docstring)."""
        datas: dict[str, list[bytes]] = {}
        for c, fence, f in entries:
            datas.setdefault(c, []).append(self._data(c, fence, f, worker_id, objects))
        recs = (rec for c, mine in datas.items() for rec in self._records(c, mine))
        for request in requests(recs, _size, max_records=records.MAX_PUT_RECORDS, max_bytes=records.MAX_PUT_BYTES):
            self._put(request)

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        """The checkpoint: a stream's tail is not read (no request)."""
        return checkpoint

    def _records(self, connection_id: str, datas: list[bytes]) -> list[_Rec]:
        """One connection's user records, in order, as Kinesis records: consecutive ones
        packed while the aggregate stays within ``max_aggregate_bytes``; one alone plain."""
        out: list[_Rec] = []
        key = connection_id.encode("utf-8")
        base = aggregation.overhead_bytes(connection_id) + len(key)
        group: list[bytes] = []
        size = base

        def close() -> None:
            data = group[0] if len(group) == 1 else aggregation.pack(connection_id, group)
            out.append(_Rec(connection_id, {"Data": data, "PartitionKey": connection_id}))

        for data in datas:
            n = aggregation.entry_bytes(len(data))
            if group and (self._max_aggregate is None or size + n > self._max_aggregate):
                close()
                group, size = [], base
            group.append(data)
            size += n
        if group:
            close()
        return out

    def _data(
        self, connection_id: str, fence_token: int, frame: Frame, worker_id: str, objects: Mapping[tuple[str, int], StoredObject] | None
    ) -> bytes:
        """One frame's user record, checked against what Kinesis takes as a plain record."""
        if not 1 <= len(connection_id) <= records.MAX_PARTITION_KEY_CHARS:
            raise InvalidItem(f"{connection_id[:300]!r} seq {frame.seq}: a partition key has 1 to 256 characters")
        data = frame_record(connection_id, fence_token, worker_id, frame, objects)
        size = len(data) + len(connection_id.encode("utf-8", "replace"))
        if size > records.MAX_RECORD_BYTES:
            raise InvalidItem(f"{connection_id} seq {frame.seq}: a record of {size} bytes is over Kinesis' 1 MiB")
        return data

    def _put(self, request: list[_Rec]) -> None:
        """One request's records, until every one is acknowledged, or until ``max_rounds``
        rounds in a row acknowledged nothing more. A round that made progress does not
        count: under steady per-record refusals a deep connection's suffix shrinks only
        by the records before its first refusal, each round (the send deadline bounds
        the whole)."""
        put_until_acknowledged(KINESIS, request, self._send, _again, rounds=self._rounds, sleep=self._sleep, add=self._add)

    def _send(self, pending: list[_Rec]) -> Sequence[Mapping[str, Any]]:
        return self._client.put_records(Records=[r.entry for r in pending], **self._target).get("Records") or []


def _size(rec: _Rec) -> int:
    """What a record counts against a request's 5 MiB: its data and its partition key."""
    return len(rec.entry["Data"]) + len(rec.entry["PartitionKey"].encode("utf-8"))


def _again(pending: list[_Rec], answers: Sequence[Mapping[str, Any]]) -> list[_Rec]:
    """The records to send again after a partial failure: from each connection's first
    refused record on, every one of that connection (acknowledged or not), in order."""
    refused_from: set[str] = set()
    again: list[_Rec] = []
    for rec, answer in zip(pending, answers, strict=True):
        if answer.get("ErrorCode"):
            refused_from.add(rec.connection_id)
        if rec.connection_id in refused_from:
            again.append(rec)
    return again
