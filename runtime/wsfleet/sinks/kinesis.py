"""The messages stream (``SINK=kinesis``): one record per frame, PutRecords batches.

A :class:`~.sink.Sink`. Each frame becomes one record (:func:`wsfleet.records.encode`),
partition key = connection id, so one connection's records stay in one shard, in the
order they were acknowledged. Invariants it keeps, whatever the stream answers:

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

import threading
import time
from typing import Any, Callable, Mapping, Sequence

from botocore.exceptions import BotoCoreError, ClientError

from .. import metrics_names as names
from .. import records, schema
from ..stream import Frame
from ..store.base import TransientError, is_transient, retry_pause_s, unwrap_refusal
from .objects import StoredObject, needs_object
from .sink import InvalidItem

# Rounds of one request's records (the refused ones sent again) before TransientError.
MAX_ROUNDS = 8
# Per-record and whole-request refusals that mean the shard or the key is at its limit.
THROUGHPUT_CODES = frozenset({"ProvisionedThroughputExceededException", "KMSThrottlingException"})

Count = Callable[[str, int], None]


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
    ) -> None:
        self._client = client
        self._target = {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}
        self._count = count
        self._count_lock = threading.Lock()
        self._sleep = sleep
        self._rounds = max_rounds
        self.stream = stream

    def put_many(
        self,
        entries: Sequence[tuple[str, int, Frame]],
        *,
        worker_id: str,
        objects: Mapping[tuple[str, int], StoredObject] | None = None,
    ) -> None:
        """One record per (connection_id, fence_token, frame), in the entries' order, in
        requests of at most 500 records and 5 MiB; returns once all are acknowledged (see
        the module docstring)."""
        recs = [self._record(c, fence, f, worker_id, objects) for c, fence, f in entries]
        request: list[_Rec] = []
        size = 0
        for rec in recs:
            n = len(rec.entry["Data"]) + len(rec.entry["PartitionKey"].encode("utf-8"))
            if request and (len(request) >= records.MAX_PUT_RECORDS or size + n > records.MAX_PUT_BYTES):
                self._put(request)
                request, size = [], 0
            request.append(rec)
            size += n
        if request:
            self._put(request)

    def stored_end(self, connection_id: str, checkpoint: int) -> int:
        """The checkpoint: a stream's tail is not read (no request)."""
        return checkpoint

    def _record(
        self, connection_id: str, fence_token: int, frame: Frame, worker_id: str, objects: Mapping[tuple[str, int], StoredObject] | None
    ) -> _Rec:
        if not 1 <= len(connection_id) <= records.MAX_PARTITION_KEY_CHARS:
            raise InvalidItem(f"{connection_id[:300]!r} seq {frame.seq}: a partition key has 1 to 256 characters")
        ref = None
        if needs_object(frame):
            stored = (objects or {}).get((connection_id, frame.seq))
            if stored is None:  # a bug of the caller's: never a record that points at nothing
                raise ValueError(f"{connection_id} seq {frame.seq}: large data sent before its object was stored")
            ref = (stored.ref, stored.size, stored.sha256)
        try:
            data = records.encode(connection_id, fence_token, worker_id, frame, data_ref=ref)
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
            raise InvalidItem(f"{connection_id} seq {frame.seq}: {type(exc).__name__}: {exc}") from exc
        size = len(data) + len(connection_id.encode("utf-8", "replace"))
        if size > records.MAX_RECORD_BYTES:
            raise InvalidItem(f"{connection_id} seq {frame.seq}: a record of {size} bytes is over Kinesis' 1 MiB")
        return _Rec(connection_id, {"Data": data, "PartitionKey": connection_id})

    def _put(self, request: list[_Rec]) -> None:
        """One request's records, until every one is acknowledged, or until ``max_rounds``
        rounds in a row acknowledged nothing more. A round that made progress does not
        count: under steady per-record refusals a deep connection's suffix shrinks only
        by the records before its first refusal, each round (the send deadline bounds
        the whole)."""
        pending = request
        attempt = 0  # rounds in a row with no progress
        while attempt < self._rounds:
            try:
                resp = self._client.put_records(Records=[r.entry for r in pending], **self._target)
            except (ClientError, BotoCoreError) as exc:
                if refused := unwrap_refusal(exc):
                    raise refused from None  # past its deadline: a retry here would be refused too
                if _code(exc) == "ValidationException":  # a record Kinesis will not take (we check first)
                    raise InvalidItem(str(exc)) from exc
                if not is_transient(exc) and _code(exc) != "KMSThrottlingException":
                    raise  # AccessDenied, ResourceNotFound, a bug: the writer's supervisor backs off
                if _code(exc) in THROUGHPUT_CODES:
                    self._add(names.RECORDS_THROTTLED, len(pending))
                # Nothing or everything may have been applied (a lost answer): all again.
                self._sleep(retry_pause_s(attempt))
                attempt += 1
                continue
            answers = resp.get("Records") or []
            if len(answers) != len(pending):
                raise TransientError(f"PutRecords answered {len(answers)} results for {len(pending)} records")
            again, throttled = _again(pending, answers)
            if not again:
                return
            self._add(names.RECORDS_RESENT, len(again))
            if throttled:
                self._add(names.RECORDS_THROTTLED, throttled)
            attempt = 0 if len(again) < len(pending) else attempt + 1
            pending = again
            self._sleep(retry_pause_s(attempt))
        raise TransientError(f"{len(pending)} records still refused by the stream after {self._rounds} rounds")

    def _add(self, name: str, n: int) -> None:
        if self._count is not None and n:
            with self._count_lock:
                self._count(name, n)


def _again(pending: list[_Rec], answers: list[dict]) -> tuple[list[_Rec], int]:
    """The records to send again after a partial failure: from each connection's first
    refused record on, every one of that connection (acknowledged or not), in order; and
    how many were refused for throughput."""
    refused_from: set[str] = set()
    again: list[_Rec] = []
    throttled = 0
    for rec, answer in zip(pending, answers, strict=True):
        code = answer.get("ErrorCode")
        if code:
            refused_from.add(rec.connection_id)
            throttled += code in THROUGHPUT_CODES
        if rec.connection_id in refused_from:
            again.append(rec)
    return again, throttled


def _code(exc: BaseException) -> str:
    return exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""

