"""The delivery stream (``SINK=firehose``): frames as JSON lines through Amazon Data
Firehose into S3, where Athena reads them (the stacks' Glue table).

A :class:`~.sink.Sink`. Each frame becomes one line: the stream's record
(:func:`wsfleet.records.encode`, the same fields, large data by its ``data_ref`` as
there) plus ``connection_bucket`` (:func:`connection_bucket`, the partition the
delivery stream files it under), and a newline. A call's lines, each connection's
together in seq order, go into as few Firehose records as fit 1,000 KiB each: Firehose
bills ingestion per record, each rounded up to 5 KB, so the frames of every connection
of one flush share one record and its rounding (a Kinesis record holds one
connection's, its partition key; a delivery stream's record has no key). At 0.5 frames
a second a connection's flush holds one frame or none, which alone would be billed as
5 KB; a worker's flush of hundreds of connections is tens of KB, and the rounding costs
next to nothing. The delivery stream splits a record back into its lines (its record
de-aggregation, JSON) before it partitions them.

Invariants it keeps, whatever Firehose answers:

* a PutRecordBatch holds at most 500 records and 4 MiB, and a record at most 1,000 KiB
  (a line that does not fit one alone is :class:`InvalidItem`, found before anything
  is sent; data larger than an item's limit never reaches a line: it is in the
  messages bucket first, the line says where);
* a PutRecordBatch is answered per record (``FailedPutCount``, ``RequestResponses``):
  only the refused records are sent again, after a jittered backoff, never dropped.
  Order does not matter here: S3 holds no order, a reader sorts by seq. Counted in
  ``RecordsResent``, throughput refusals in ``RecordsThrottled``;
* a whole call that fails (throttled, a 5xx, a lost answer) is sent again whole:
  Firehose may have taken it all (its answer lost), so S3 may then hold those lines
  twice, with the same fence;
* it returns only once every record is acknowledged; after a bounded number of rounds
  in a row that acknowledged nothing more it raises :class:`TransientError` and the
  writer sends the whole call again (what was acknowledged is delivered again, same
  fence);
* PutRecordBatch is not conditional: the caller checks its deadline as each request
  leaves (``aws.send_deadline``), whose refusal is raised as it is (unwrapped).

Like a Kinesis stream, the delivery stream's tail cannot be read, so
:meth:`DeliverySink.stored_end` returns the checkpoint: a takeover after a crash
delivers the frames since it again, with a higher fence. The reader's rule is the
stream consumer's: keep the highest fence per (connection_id, seq) (docs/sinks.md has
the Athena query).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from .. import schema
from ..records import CONNECTION_BUCKET, connection_bucket
from ..records import FIREHOSE_MAX_PUT_BYTES as MAX_PUT_BYTES
from ..records import FIREHOSE_MAX_PUT_RECORDS as MAX_PUT_RECORDS
from ..records import FIREHOSE_MAX_RECORD_BYTES as MAX_RECORD_BYTES
from ..stream import Frame
from .objects import StoredObject
from .record_puts import Count, LockedCount, Service, frame_record, put_until_acknowledged, requests
from .sink import InvalidItem

# Rounds of one request's records (the refused ones sent again) before TransientError.
MAX_ROUNDS = 8
# Whole-call errors and per-record ErrorCodes that mean the stream is at its throughput.
THROUGHPUT_CODES = frozenset({"ServiceUnavailableException", "ThrottlingException", "LimitExceededException"})
FIREHOSE = Service("PutRecordBatch", "delivery stream", "InvalidArgumentException", THROUGHPUT_CODES)


class DeliverySink:
    """The delivery stream named ``delivery_stream``. ``count(name, n)`` adds to a
    counter, from the pool threads that run :meth:`put_many`, under a lock of this
    sink's (as :class:`~.kinesis.StreamSink` does)."""

    names = (schema.SINK_FIREHOSE,)
    max_batch = MAX_PUT_RECORDS  # frames per call: never more records than that
    reads_tail = False

    def __init__(
        self,
        client: Any,
        delivery_stream: str,
        *,
        count: Count | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_rounds: int = MAX_ROUNDS,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        if not 0 < max_record_bytes <= MAX_RECORD_BYTES:
            raise ValueError(f"max_record_bytes must be from 1 to {MAX_RECORD_BYTES}, got {max_record_bytes}")
        self._client = client
        self._add = LockedCount(count)
        self._sleep = sleep
        self._rounds = max_rounds
        self._max_record = max_record_bytes
        self.delivery_stream = delivery_stream

    def put_many(self, entries: Sequence[tuple[str, int, Frame]], *, worker_id: str,
                 objects: Mapping[tuple[str, int], StoredObject] | None = None) -> None:
        """One line per (connection_id, fence_token, frame), each connection's together in
        their order, packed into records, in requests of at most 500 records and 4 MiB;
        returns once all are acknowledged (see the module docstring)."""
        lines: dict[str, list[bytes]] = {}
        for c, fence, f in entries:
            lines.setdefault(c, []).append(self._line(c, fence, f, worker_id, objects))
        recs = self._records([line for mine in lines.values() for line in mine])
        for request in requests(recs, len, max_records=MAX_PUT_RECORDS, max_bytes=MAX_PUT_BYTES):
            self._put(request)

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        """The checkpoint: the delivery stream's tail is not read (no request)."""
        return checkpoint

    def _records(self, lines: list[bytes]) -> list[bytes]:
        """Lines, in order, as Firehose records of at most ``max_record_bytes`` each."""
        out: list[bytes] = []
        group: list[bytes] = []
        size = 0
        for line in lines:
            if group and size + len(line) > self._max_record:
                out.append(b"".join(group))
                group, size = [], 0
            group.append(line)
            size += len(line)
        if group:
            out.append(b"".join(group))
        return out

    def _line(
        self, connection_id: str, fence_token: int, frame: Frame, worker_id: str, objects: Mapping[tuple[str, int], StoredObject] | None
    ) -> bytes:
        """One frame's line: its record with its connection_bucket, and a newline."""
        record = frame_record(connection_id, fence_token, worker_id, frame, objects)
        try:
            bucket = connection_bucket(connection_id)
        except UnicodeEncodeError as exc:  # a lone surrogate, which the record's JSON escapes
            raise InvalidItem(f"{connection_id} seq {frame.seq}: {type(exc).__name__}: {exc}") from exc
        # records.encode always ends with the object's closing brace.
        line = record[:-1] + b',"%s":%d}\n' % (CONNECTION_BUCKET.encode(), bucket)
        if len(line) > self._max_record:
            raise InvalidItem(f"{connection_id} seq {frame.seq}: a line of {len(line)} bytes is over a Firehose record's {self._max_record}")
        return line

    def _put(self, request: list[bytes]) -> None:
        """One request's records until every one is acknowledged, or until ``max_rounds``
        rounds in a row acknowledged nothing more."""
        put_until_acknowledged(FIREHOSE, request, self._send, _refused, rounds=self._rounds, sleep=self._sleep, add=self._add)

    def _send(self, pending: list[bytes]) -> Sequence[Mapping[str, Any]]:
        resp = self._client.put_record_batch(DeliveryStreamName=self.delivery_stream, Records=[{"Data": d} for d in pending])
        return resp.get("RequestResponses") or []


def _refused(pending: list[bytes], answers: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The refused records alone: S3 holds no order, a reader sorts by seq."""
    return [d for d, a in zip(pending, answers, strict=True) if a.get("ErrorCode")]
