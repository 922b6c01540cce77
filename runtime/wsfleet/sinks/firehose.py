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

import threading
import time
from typing import Any, Callable, Mapping, Sequence

from botocore.exceptions import BotoCoreError, ClientError

from .. import records, schema
from .. import metrics_names as names
from ..store.base import TransientError, is_transient, retry_pause_s, unwrap_refusal
from ..stream import Frame
from .objects import StoredObject, needs_object
from .sink import InvalidItem

# Firehose's limits and the line's partition (declared with the stream's record, where
# the plan and the stacks read them too).
MAX_RECORD_BYTES = records.FIREHOSE_MAX_RECORD_BYTES
MAX_PUT_RECORDS = records.FIREHOSE_MAX_PUT_RECORDS
MAX_PUT_BYTES = records.FIREHOSE_MAX_PUT_BYTES
CONNECTION_BUCKETS = records.CONNECTION_BUCKETS
CONNECTION_BUCKET = records.CONNECTION_BUCKET
connection_bucket = records.connection_bucket
# Rounds of one request's records (the refused ones sent again) before TransientError.
MAX_ROUNDS = 8
# Whole-call errors and per-record ErrorCodes that mean the stream is at its throughput.
THROUGHPUT_CODES = frozenset({"ServiceUnavailableException", "ThrottlingException", "LimitExceededException"})

Count = Callable[[str, int], None]



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
        self._count = count
        self._count_lock = threading.Lock()
        self._sleep = sleep
        self._rounds = max_rounds
        self._max_record = max_record_bytes
        self.delivery_stream = delivery_stream

    def put_many(
        self,
        entries: Sequence[tuple[str, int, Frame]],
        *,
        worker_id: str,
        objects: Mapping[tuple[str, int], StoredObject] | None = None,
    ) -> None:
        """One line per (connection_id, fence_token, frame), each connection's together in
        their order, packed into records, in requests of at most 500 records and 4 MiB;
        returns once all are acknowledged (see the module docstring)."""
        lines: dict[str, list[bytes]] = {}
        for c, fence, f in entries:
            lines.setdefault(c, []).append(self._line(c, fence, f, worker_id, objects))
        request: list[bytes] = []
        size = 0
        for data in self._records([line for mine in lines.values() for line in mine]):
            if request and (len(request) >= MAX_PUT_RECORDS or size + len(data) > MAX_PUT_BYTES):
                self._put(request)
                request, size = [], 0
            request.append(data)
            size += len(data)
        if request:
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
        ref = None
        if needs_object(frame):
            stored = (objects or {}).get((connection_id, frame.seq))
            if stored is None:  # a bug of the caller's: never a line that points at nothing
                raise ValueError(f"{connection_id} seq {frame.seq}: large data sent before its object was stored")
            ref = (stored.ref, stored.size, stored.sha256)
        try:
            record = records.encode(connection_id, fence_token, worker_id, frame, data_ref=ref)
            bucket = connection_bucket(connection_id)
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
            raise InvalidItem(f"{connection_id} seq {frame.seq}: {type(exc).__name__}: {exc}") from exc
        # records.encode always ends with the object's closing brace.
        line = record[:-1] + b',"%s":%d}\n' % (CONNECTION_BUCKET.encode(), bucket)
        if len(line) > self._max_record:
            raise InvalidItem(f"{connection_id} seq {frame.seq}: a line of {len(line)} bytes is over a Firehose record's {self._max_record}")
        return line

    def _put(self, request: list[bytes]) -> None:
        """One request's records until every one is acknowledged, or until ``max_rounds``
        rounds in a row acknowledged nothing more."""
        pending = request
        attempt = 0  # rounds in a row with no progress
        while attempt < self._rounds:
            try:
                resp = self._client.put_record_batch(
                    DeliveryStreamName=self.delivery_stream, Records=[{"Data": d} for d in pending]
                )
            except (ClientError, BotoCoreError) as exc:
                if refused := unwrap_refusal(exc):
                    raise refused from None  # past its deadline: a retry here would be refused too
                code = _code(exc)
                if code == "InvalidArgumentException":  # a record Firehose will not take (we check first)
                    raise InvalidItem(str(exc)) from exc
                if not is_transient(exc) and code not in THROUGHPUT_CODES:
                    raise  # AccessDenied, ResourceNotFound, a bug: the writer's supervisor backs off
                if code in THROUGHPUT_CODES:
                    self._add(names.RECORDS_THROTTLED, len(pending))
                # Nothing or everything may have been applied (a lost answer): all again.
                self._sleep(retry_pause_s(attempt))
                attempt += 1
                continue
            answers = resp.get("RequestResponses") or []
            if len(answers) != len(pending):
                raise TransientError(f"PutRecordBatch answered {len(answers)} results for {len(pending)} records")
            again = [d for d, a in zip(pending, answers, strict=True) if a.get("ErrorCode")]
            if not again:
                return
            self._add(names.RECORDS_RESENT, len(again))
            self._add(names.RECORDS_THROTTLED, sum(a.get("ErrorCode") in THROUGHPUT_CODES for a in answers))
            attempt = 0 if len(again) < len(pending) else attempt + 1
            pending = again
            self._sleep(retry_pause_s(attempt))
        raise TransientError(f"{len(pending)} records still refused by the delivery stream after {self._rounds} rounds")

    def _add(self, name: str, n: int) -> None:
        if self._count is not None and n:
            with self._count_lock:
                self._count(name, n)


def _code(exc: BaseException) -> str:
    return exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
