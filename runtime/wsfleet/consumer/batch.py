"""The reference consumer's Lambda: one Kinesis event (a batch of one shard's records, in
shard order) in, each (connection, seq) delivered downstream once, out.

For each connection of the batch, in stream order (:mod:`.delivery` decides):

1. read its delivery state (:mod:`.state`, a consistent read);
2. write what is new as ONE S3 object of JSON lines (the records' fields as decoded,
   a ``data_ref`` passed through), ``<prefix><connection_id>/<revision>.jsonl``,
   ``revision`` being the state's as read;
3. then store the state after it, conditional on that revision.

Invariant: an object is downstream once the state that names its revision is stored.
A crash, a timeout or a failed write between 2 and 3 leaves the state as it was, so the
retry decides the same deliveries from the same state and writes them under the same
key: the object is rewritten, not added. A state write whose answer was lost is found
stored on the retry (:meth:`.state.DeliveryStates.put`), or the next batch finds those
seqs delivered: nothing is written twice either way.

An aggregated Kinesis record (:mod:`wsfleet.aggregation`: the worker packs one
connection's frames of a flush into one) is unpacked first, as KCL would: each of its
user records is a record here, with the Kinesis record's sequence number (a retry from
it delivers the whole aggregate again, which the delivery state absorbs).

A record that is not a wsfleet record (not base64, an aggregate that does not parse,
not a record, a connection id that is not one or not its partition key, data that
cannot be written back as JSON) is logged and counted, never a batch failure: a failure would block the shard on it until
the stream's retention dropped it. A connection whose S3 or DynamoDB requests fail is a
failure: the answer is a partial batch response naming the first failed record's
sequence number, and Lambda sends the shard again from there (what was delivered
after it is then dropped as delivered). The event source mapping must have
``ReportBatchItemFailures``.

Logs are JSON lines (:mod:`wsfleet.logs`) without frame data: one ``batch`` line per
invocation with the counts (and the same counts as CloudWatch embedded metrics), one
line per bad record, failure and hole given up.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import boto3
from botocore.config import Config

from .. import aggregation, metrics, metrics_names, records
from ..config import ConsumerConfig
from ..settings_spec import ConfigError
from ..logs import JsonLogger, route_stdlib_logging
from ..stream import MAX_SEQ
from ..validation import Invalid, check_connection_id
from .delivery import DELIVERED, REPLAYED, RESENT, STALE, decide, state_changed
from .state import DeliveryStates

# Connections delivered at once: each is a read, an object and a write, mostly waiting.
THREADS = 16
CONTENT_TYPE = "application/x-ndjson"
# Standard retries ride out throttling and 5xx; a delivery that still fails is retried by
# Lambda from the failed record. S3 may take a while for a large object.
DYNAMODB_CONFIG = Config(retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=2, read_timeout=5)
S3_CONFIG = Config(retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=2, read_timeout=30)
DETAIL_CHARS = 200  # of a bad record's reason or a failure's message in a log line
# A connection's delivery is not started with less of the invocation left than this: it
# is answered as failed instead, so that a batch too large for one invocation keeps what
# it delivered and goes on from there, rather than timing out whole again and again.
MIN_REMAINING_MS = 15_000
BAD = "bad"
ABANDONED = "abandoned"  # seqs of holes given up (counted in the batch line, not per record)


def object_key(prefix: str, connection_id: str, revision: int) -> str:
    """The object of one delivery: named by the state revision it was decided from, so
    a retry from the same state rewrites the same object; keys list in delivery order."""
    return f"{prefix}{connection_id}/{revision:020d}.jsonl"


@dataclass(frozen=True)
class Incoming:
    """A record of the batch that is a wsfleet record: its place in the batch, its
    sequence number, the record, and its JSON line as it will be delivered."""

    index: int
    sequence_number: str
    record: records.Record
    line: bytes


class NotARecord(ValueError):
    """A batch entry that is not a wsfleet record; the message is one sentence."""


def fields(record: records.Record) -> dict[str, Any]:
    """The record's fields as the contract names them (what a delivered line holds)."""
    out: dict[str, Any] = {
        records.CONNECTION_ID: record.connection_id,
        records.SEQ: record.seq,
        records.FENCE_TOKEN: record.fence_token,
        records.WORKER_ID: record.worker_id,
        records.RECEIVED_AT_MS: record.received_at_ms,
    }
    return {**out, **record.delivered()}


def line_of(record: records.Record) -> bytes:
    """A record's delivered JSON line; ValueError, RecursionError or UnicodeEncodeError
    for data that cannot be written as UTF-8 JSON."""
    return json.dumps(fields(record), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8") + b"\n"


def trimmed_line(record: records.Record, first: int, last: int) -> bytes:
    """The line of the part first..last of a marker whose other seqs were delivered already."""
    return line_of(dataclasses.replace(record, seq=first, skip_to=last if last != first else None))


def parse_entry(index: int, entry: Any) -> list[Incoming | NotARecord]:
    """One entry of the event's ``Records``: its user records (one, unless it is an
    aggregate), each an :class:`Incoming` or, if it is not a wsfleet record this
    consumer can deliver, a :class:`NotARecord` saying why."""
    kinesis = entry.get("kinesis") if isinstance(entry, Mapping) else None
    if not isinstance(kinesis, Mapping):
        return [NotARecord("the entry has no kinesis object")]
    sequence_number, key, data = kinesis.get("sequenceNumber"), kinesis.get("partitionKey"), kinesis.get("data")
    if not isinstance(sequence_number, str) or not isinstance(data, str):
        return [NotARecord("the entry has no sequenceNumber or data")]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return [NotARecord("its data is not base64")]
    try:
        inner = aggregation.user_records(raw, key)
    except aggregation.BadAggregate as exc:
        return [NotARecord(f"an aggregate that does not parse: {exc}")]
    out: list[Incoming | NotARecord] = []
    for user in inner:
        try:
            if user.partition_key != key:
                raise NotARecord("an aggregate's record under another partition key than the aggregate's")
            out.append(_incoming(index, sequence_number, key, user.data))
        except NotARecord as exc:
            out.append(exc)
    return out


def _incoming(index: int, sequence_number: str, key: Any, raw: bytes) -> Incoming:
    try:
        record = records.decode(raw)
    except records.BadRecord as exc:
        raise NotARecord(str(exc)) from None
    try:
        check_connection_id(record.connection_id)
    except Invalid as exc:
        raise NotARecord(exc.message) from None
    if record.connection_id != key:
        raise NotARecord("its connection_id is not its partition key")
    if not (0 <= record.seq <= record.end <= MAX_SEQ) or record.fence_token < 0:
        raise NotARecord("its seq, skip_to or fence_token is out of range")
    try:
        line = line_of(record)
    except (ValueError, RecursionError, UnicodeEncodeError):  # NaN, nesting, a lone surrogate
        raise NotARecord("its data cannot be written as UTF-8 JSON") from None
    return Incoming(index, sequence_number, record, line)


@dataclass
class Delivery:
    """How one connection's records went: counts by outcome; the failure, if it failed."""

    connection_id: str
    first: Incoming
    counts: Counter[str]
    error: str | None = None


class Consumer:
    def __init__(self, config: ConsumerConfig, ddb: Any, s3: Any, *, logger: JsonLogger | None = None) -> None:
        self._config = config
        self._states = DeliveryStates(ddb, config.table_name)
        self._s3 = s3
        self._log = logger or JsonLogger(component="consumer")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, ddb: Any = None, s3: Any = None, logger: JsonLogger | None = None
    ) -> "Consumer":
        """Configuration from the environment; clients given here win over building them."""
        config = ConsumerConfig.from_env(env)
        session = boto3.session.Session()
        ddb = ddb or session.client("dynamodb", region_name=config.region, endpoint_url=config.endpoint_url, config=DYNAMODB_CONFIG)
        s3 = s3 or session.client("s3", region_name=config.region, endpoint_url=config.endpoint_url, config=S3_CONFIG)
        return cls(config, ddb, s3, logger=logger)

    def handle(self, event: Any, context: Any = None) -> dict:
        """One Kinesis event in, the partial batch response out. Never raises: what
        nothing else caught fails the whole batch (logged), so nothing is skipped."""
        try:
            return self._handle(event, context)
        except Exception as exc:
            self._log.error("batch_failed", detail=f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS], traceback=traceback.format_exc())
            return _all_failed(event)

    def _handle(self, event: Any, context: Any) -> dict:
        started = time.monotonic()
        entries = event.get("Records") if isinstance(event, Mapping) else None
        if not isinstance(entries, list):
            self._log.error("event_invalid", detail="the event has no Records list")
            return {"batchItemFailures": []}
        counts: Counter[str] = Counter()
        groups: dict[str, list[Incoming]] = {}
        user_records = 0
        for index, entry in enumerate(entries):
            for incoming in parse_entry(index, entry):
                user_records += 1
                if isinstance(incoming, NotARecord):
                    counts[BAD] += 1
                    self._log.warning("bad_record", **_where(entry), detail=str(incoming)[:DETAIL_CHARS])
                    continue
                groups.setdefault(incoming.record.connection_id, []).append(incoming)
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        deliveries = self._deliver_all(groups, remaining if callable(remaining) else None)
        failed = [d for d in deliveries if d.error is not None]
        for d in deliveries:
            counts.update(d.counts)
        first_failure = min((d.first for d in failed), key=lambda i: i.index, default=None)
        self._log.info(
            "batch",
            request_id=getattr(context, "aws_request_id", None),
            records=len(entries),
            user_records=user_records,
            connections=len(groups),
            delivered=counts[DELIVERED],
            replayed=counts[REPLAYED],
            resent=counts[RESENT],
            stale=counts[STALE],
            bad_records=counts[BAD],
            seqs_abandoned=counts[ABANDONED],
            failed_connections=len(failed),
            retry_from=first_failure.sequence_number if first_failure else None,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
            **embedded_metrics(
                counts,
                failed=len(failed),
                namespace=self._config.metrics_namespace,
                service_name=self._config.service_name,
            ),
        )
        if first_failure is None:
            return {"batchItemFailures": []}
        return {"batchItemFailures": [{"itemIdentifier": first_failure.sequence_number}]}

    def _deliver_all(self, groups: Mapping[str, list[Incoming]], remaining_ms: Callable[[], int] | None) -> list[Delivery]:
        def one(item: tuple[str, list[Incoming]]) -> Delivery:
            if remaining_ms is not None and remaining_ms() < MIN_REMAINING_MS:
                return Delivery(item[0], item[1][0], Counter(), error="not started: the invocation is nearly out of time")
            return self._deliver(*item)

        if len(groups) <= 1:
            return [one(item) for item in groups.items()]
        with ThreadPoolExecutor(max_workers=min(THREADS, len(groups)), thread_name_prefix="deliver") as pool:
            return list(pool.map(one, groups.items()))

    def _deliver(self, connection_id: str, batch: list[Incoming]) -> Delivery:
        """One connection's records of the batch: read, object, then state. Never raises:
        a failure is the Delivery's ``error`` (and the shard goes again from its first
        record)."""
        done = Delivery(connection_id, batch[0], Counter())
        try:
            before = self._states.get(connection_id)
            decision = decide(before, ((i.record, i.line) for i in batch), trim=trimmed_line)
            if decision.deliver:
                self._s3.put_object(
                    Bucket=self._config.bucket_name,
                    Key=object_key(self._config.prefix, connection_id, before.revision),
                    Body=b"".join(decision.deliver),
                    ContentType=CONTENT_TYPE,
                )
            if state_changed(before, decision.state) and not self._states.put(connection_id, before, decision.state):
                done.error = "state_conflict: its delivery state moved on meanwhile (another consumer of the shard?)"
                self._log.error("state_conflict", connection_id=connection_id, revision=before.revision)
                return done
            # Only once the state giving them up is stored: a retry would give them up again.
            for first, last in decision.abandoned:
                self._log.warning("gap_abandoned", connection_id=connection_id, from_seq=first, to_seq=last)
            done.counts = decision.counts + Counter({ABANDONED: sum(b - a + 1 for a, b in decision.abandoned)})
        except Exception as exc:  # S3, DynamoDB or a bug: this connection goes again
            done.error = f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS]
            aws = type(exc).__module__.startswith(("botocore", "wsfleet.store"))
            self._log.error(
                "delivery_failed",
                connection_id=connection_id,
                sequence_number=batch[0].sequence_number,
                detail=done.error,
                **({} if aws else {"traceback": traceback.format_exc()}),
            )
        return done


def _where(entry: Any) -> dict[str, Any]:
    """Where a bad entry is, for its log line (never its data)."""
    kinesis = entry.get("kinesis") if isinstance(entry, Mapping) else None
    kinesis = kinesis if isinstance(kinesis, Mapping) else {}
    event_id = entry.get("eventID") if isinstance(entry, Mapping) else None
    return {
        "shard": str(event_id).split(":", 1)[0][:DETAIL_CHARS] if event_id else None,
        "sequence_number": str(kinesis.get("sequenceNumber"))[:DETAIL_CHARS],
        "partition_key": str(kinesis.get("partitionKey"))[:DETAIL_CHARS],
    }


def embedded_metrics(
    counts: Mapping[str, int],
    *,
    failed: int,
    namespace: str = metrics_names.DEFAULT_NAMESPACE,
    service_name: str = metrics_names.CONSUMER_SERVICE_NAME,
) -> dict[str, Any]:
    """The batch line's CloudWatch embedded metric format fields: Lambda's log delivery
    turns them into metrics, with no PutMetricData request of ours."""
    values = {
        metrics_names.FRAMES_DELIVERED: counts.get(DELIVERED, 0),
        metrics_names.DUPLICATES_DROPPED: counts.get(REPLAYED, 0) + counts.get(RESENT, 0),
        metrics_names.STALE_RECORDS_DROPPED: counts.get(STALE, 0),
        metrics_names.BAD_RECORDS: counts.get(BAD, 0),
        metrics_names.DELIVERIES_FAILED: failed,
        metrics_names.SEQS_ABANDONED: counts.get(ABANDONED, 0),
    }
    service = [{"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": service_name}]
    data = [metrics.datum(name, service, value, "Count") for name, value in values.items()]
    return metrics.emf(namespace, data, timestamp_ms=int(time.time() * 1000), properties={})


# --- Lambda entry point ------------------------------------------------------------------

_consumer: Consumer | None = None
_log = JsonLogger(component="consumer")


def handler(event: Any, context: Any) -> dict:
    """Lambda entry point. The consumer is built on the first call of each execution
    environment and kept. A bad configuration (logged, naming the variable) or a failed
    start answers the whole batch as failed: the shard waits, nothing is skipped."""
    global _consumer
    if _consumer is None:
        try:
            route_stdlib_logging(component="consumer")
            _consumer = Consumer.from_env(logger=_log)
        except Exception as exc:
            if isinstance(exc, ConfigError):
                _log.error("config_invalid", detail=str(exc))
            else:
                _log.error("startup_failed", detail=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            return _all_failed(event)
    return _consumer.handle(event, context)


def _all_failed(event: Any) -> dict:
    entries = event.get("Records") if isinstance(event, Mapping) else None
    for entry in entries if isinstance(entries, list) else []:
        kinesis = entry.get("kinesis") if isinstance(entry, Mapping) else None
        if isinstance(kinesis, Mapping) and isinstance(kinesis.get("sequenceNumber"), str):
            return {"batchItemFailures": [{"itemIdentifier": kinesis["sequenceNumber"]}]}
    return {"batchItemFailures": []}
