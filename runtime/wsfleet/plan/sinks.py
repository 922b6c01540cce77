"""Where the frames go, priced side by side (issue 21): the messages table
(``SINK=dynamodb``), the Kinesis stream with its reference consumer (``SINK=kinesis``),
or both; and where each one's limits bind. Pure arithmetic, no AWS calls, like
:mod:`.fleet` (whose holding cost is the same under every sink and is added to each).

What a stored frame costs:

* **dynamodb**: one item per frame, its write units (1 per KB, rounded up) and its
  storage for MESSAGE_TTL_DAYS (item size plus DynamoDB's 100 bytes of overhead);
* **kinesis** (on-demand): each Kinesis record's size rounded up to the next KB, billed
  per GB ingested and again per GB retrieved by the one consumer; a connection's frames
  of one flush share one aggregated record (:func:`packing`: records and billed KB per
  message from the rate, FLUSH_INTERVAL_MS and the worker's frames per flush); the stream's hourly charge;
  retention beyond 24 h; the customer-managed KMS key and the KMS requests Kinesis makes
  for each credential that writes or reads (about one every five minutes each: every
  worker task, and every consumer environment, one per shard); the reference consumer:
  Lambda invocations and duration, one S3 object and one state-table write per
  connection in each batch (:class:`Consumer`);
* **both**: the two, with the checkpoints written once.

Every sink also writes each receiving connection's checkpoint (one write unit every
CHECKPOINT_SECONDS) to the connections table: that is in the holding-plus-messages
figures of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .. import aggregation, records, schema
from ..stream import Frame
from .corrections import corrected_ops
from .firehose import GZIP_RATIO, firehose_month
from .fleet import fleet
from .model import HOURS_PER_MONTH, PARTITION_WCU, TABLE_QUOTA, Measured, measured_shards
from .prices import DYNAMODB_STORAGE_GB_MONTH, KINESIS_PRICES, KMS_PRICES, LAMBDA_PRICES, S3_PRICES

DYNAMODB_ITEM_OVERHEAD_BYTES = 100  # what DynamoDB adds to each item's size for storage billing
GB = 1 << 30  # Kinesis bills data in GB of 2^30 bytes
KB = 1024

# --- Kinesis limits (the Kinesis Data Streams quotas page, December 2026) -----------------
SHARD_WRITE_BYTES = 1 << 20  # per shard per second, in both capacity modes
SHARD_WRITE_RECORDS = 1000
ON_DEMAND_DEFAULT_WRITE_BYTES = 4 << 20  # a new on-demand stream: 4 MB/s (and 4,000 records/s) of writes
# The most an on-demand stream scales to: 10 GB/s of writes in us-east-1, us-west-2 and
# eu-west-1; 200 MB/s in other Regions (raised on request).
ON_DEMAND_MAX_WRITE_BYTES = 10 << 30
ON_DEMAND_MAX_WRITE_BYTES_ELSEWHERE = 200 << 20
ON_DEMAND_MIN_SHARDS = 4  # what the default capacity amounts to
# Provisioned mode instead: the account's shard quota (20,000 in the same three Regions,
# 1,000 or 6,000 elsewhere), each shard 1 MB/s or 1,000 records/s.
PROVISIONED_SHARD_QUOTA = 20_000
KMS_CALL_PERIOD_S = 300  # Kinesis asks KMS for a data key about every 5 minutes per credential

MESSAGES_TABLE_BATCH = 25  # frames per writer call with the table among the sinks (BatchWriteItem's most)
# The frame the plan prices by default: a small JSON event.
DEFAULT_FRAME_BYTES = 256
CONNECTION_ID_CHARS = 36  # a UUID
WORKER_ID_CHARS = 32  # an ECS task id


@dataclass(frozen=True)
class Consumer:
    """The reference consumer (``wsfleet.consumer.handler``) as the plan prices it: one
    Lambda per shard (the event source mapping's default parallelisation), invoked when
    ``batch_size`` records are waiting or ``window_s`` after the first; each invocation
    writes its batch as one S3 object (``object_per_connection``: one per connection in
    the batch instead) and one conditional state-table write (one write unit: the item
    is small) per connection in its batch, and reads nothing. ``ms_per_invocation`` and
    ``memory_mb`` are assumptions, not measurements.

    The defaults are a batch of up to 10,000 records (the mapping's most) or 30 s: the
    per-connection state writes are what a batch costs, one per connection in it, so a
    batch must hold many frames of each connection for the consumer to stay cheaper than
    the table (at the mapping's own defaults, 100 records and no window, 1,000
    connections at 0.5 msg/s put about one state write per frame: the table's price
    again). A batch is also cut at Lambda's 6 MB invocation payload (:func:`batch_cap`)."""

    batch_size: int = 10_000
    window_s: float = 30.0
    object_per_connection: bool = False
    ms_per_invocation: float = 200.0
    memory_mb: int = 256


def record_bytes(data_bytes: int, *, connection_id_chars: int = CONNECTION_ID_CHARS, worker_id_chars: int = WORKER_ID_CHARS) -> int:
    """A record's size on the stream (its data plus its partition key, the connection id)
    for a frame of ``data_bytes`` of compact JSON: built by :func:`records.encode`, so
    that the envelope priced is the one the worker writes (large seq and timestamps)."""
    frame = Frame(seq=10**9, data_json='"' + "x" * max(0, data_bytes - 2) + '"', received_at_ms=1_800_000_000_000)
    raw = records.encode("c" * connection_id_chars, 10**6, "w" * worker_id_chars, frame)
    return len(raw) + connection_id_chars


@dataclass(frozen=True)
class Packing:
    """How a connection's frames go onto the stream: Kinesis records and billed KB per
    message, the mean record's size, and the flush period and frames per flush priced."""

    period_s: float
    frames_per_flush: float  # one connection's, on average (a Poisson mean)
    records_per_message: float
    billed_kb_per_message: float
    bytes_per_message: float  # data and partition keys, as Kinesis counts them

    @property
    def record_bytes(self) -> float:
        return self.bytes_per_message / self.records_per_message

    @property
    def billed_kb_per_record(self) -> float:
        return self.billed_kb_per_message / self.records_per_message


def packing(*, rate: float, flush_ms: float, per_worker: int, user_record_bytes: int,
            connection_id_chars: int = CONNECTION_ID_CHARS, batch: int = records.MAX_PUT_RECORDS,
            max_aggregate_bytes: int = records.MAX_AGGREGATE_BYTES) -> Packing:
    """Records and billed KB per message when each flush packs a connection's frames into
    one aggregate (:mod:`wsfleet.sinks.kinesis`). The writer flushes FLUSH_INTERVAL_MS
    after the oldest pending frame, or sooner once ``batch`` frames wait: with a worker's
    many connections, about every ``min(flush, batch / worker's frames per second)``.
    A connection's frames in one period are Poisson with mean rate x period; n of them
    make one record (plain when alone, aggregates of at most ``max_aggregate_bytes``
    otherwise), each billed in whole KB. ``user_record_bytes``: one frame's record,
    without its partition key. With few connections per worker a flush waits for its
    first frame, and packs more than this says."""
    key = connection_id_chars
    plain = user_record_bytes + key
    entry = aggregation.entry_bytes(user_record_bytes)
    base = aggregation.overhead_bytes("c" * key) + key
    most = max(1, (max_aggregate_bytes - base) // entry)
    worker_rate = per_worker * rate
    period = min(flush_ms / 1000, batch / worker_rate) if worker_rate > 0 else flush_ms / 1000
    mean = rate * period

    def cost(n: int) -> tuple[int, int, int]:  # (records, billed KB, bytes) of n frames of one flush
        full, rest = divmod(n, most)
        sizes = [base + most * entry] * full + ([plain if rest == 1 else base + rest * entry] if rest else [])
        return len(sizes), sum(billed_kb(x) for x in sizes), sum(sizes)

    if mean <= 0:  # a lone frame now and then: one plain record each
        return Packing(period, 0.0, 1.0, float(billed_kb(plain)), float(plain))
    spread = 12 * math.sqrt(mean) + 30
    totals = [0.0, 0.0, 0.0]
    for n in range(max(1, int(mean - spread)), int(mean + spread) + 1):
        p = math.exp(n * math.log(mean) - mean - math.lgamma(n + 1))
        for i, x in enumerate(cost(n)):
            totals[i] += p * x
    return Packing(period, mean, totals[0] / mean, totals[1] / mean, totals[2] / mean)


def item_bytes(data_bytes: int, *, connection_id_chars: int = CONNECTION_ID_CHARS, worker_id_chars: int = WORKER_ID_CHARS) -> int:
    """A messages-table item's size by DynamoDB's rule (attribute names plus values;
    numbers about 1 byte per two digits, plus 1) for a frame of ``data_bytes``."""
    attrs = {
        schema.MSG_PK: len("CONN#") + connection_id_chars,
        schema.MSG_SK: 6,  # seq up to 10^10
        schema.MESSAGE_DATA: data_bytes,
        schema.MSG_FENCE_TOKEN: 4,
        schema.MSG_WORKER_ID: worker_id_chars,
        schema.RECEIVED_AT_MS: 8,
        schema.MESSAGE_TTL_ATTRIBUTE: 6,
    }
    return sum(len(name) + size for name, size in attrs.items())


def billed_kb(size: int) -> int:
    """Kinesis on-demand bills each record rounded up to the next KB (1,024 bytes)."""
    return max(1, math.ceil(size / KB))


def on_demand_shards(write_bytes_per_s: float, records_per_s: float) -> int:
    """Shards an on-demand stream keeps for a steady write rate: room for twice it (it
    accommodates up to double its previous peak), and never under its default four. Not
    billed in on-demand mode: it sets how many consumer invocations run at once."""
    need = max(write_bytes_per_s / SHARD_WRITE_BYTES, records_per_s / SHARD_WRITE_RECORDS)
    return max(ON_DEMAND_MIN_SHARDS, math.ceil(2 * need))


def distinct_in_batch(batch: float, keys: float) -> float:
    """Expected distinct connections among ``batch`` records of ``keys`` connections
    sending equally often: each is absent with probability (1 - 1/keys) ** batch."""
    if keys <= 1:
        return min(1.0, batch)
    return keys * (1 - (1 - 1 / keys) ** batch)


# A synchronous invocation's payload: at most 6 MB. Each Kinesis record is in the event
# base64-encoded, with about 650 bytes of its own (event id, sequence number, ARNs, ...).
LAMBDA_PAYLOAD_BYTES = 6 * 1024 * 1024
EVENT_RECORD_OVERHEAD_BYTES = 650


def batch_cap(record_size: int) -> int:
    """The most records of ``record_size`` bytes one invocation's event holds."""
    return max(1, LAMBDA_PAYLOAD_BYTES // (math.ceil(record_size / 3) * 4 + EVENT_RECORD_OVERHEAD_BYTES))


def consumer_rates(*, records_per_s: float, connections: int, shards: int, consumer: Consumer,
                   record_size: int = 0) -> dict[str, float]:
    """The reference consumer's invocations, records per invocation, S3 PUTs and
    state-table writes per second. Per shard, records arrive at ``lam``; an invocation
    takes what waited ``window_s`` or a full batch (``batch_size``, or fewer where records
    of ``record_size`` would pass the payload limit), whichever comes first, and at least
    one record: min(lam, max(1 / window_s, lam / batch)) per second."""
    if records_per_s <= 0:
        return {"invocations": 0.0, "records_per_invocation": 0.0, "s3_puts": 0.0, "state_writes": 0.0, "shards": shards}
    lam = records_per_s / shards
    most = min(consumer.batch_size, batch_cap(record_size)) if record_size else consumer.batch_size
    per_shard = min(lam, max(1 / consumer.window_s, lam / most))
    batch = lam / per_shard
    per_batch = distinct_in_batch(batch, connections / shards)
    invocations = per_shard * shards
    objects = per_batch if consumer.object_per_connection else 1.0
    return {"invocations": invocations, "records_per_invocation": batch, "s3_puts": invocations * objects,
            "state_writes": invocations * per_batch, "shards": shards}


def kinesis_month(
    *,
    records_per_s: float,
    record_size: int,
    connections: int,
    workers: int,
    retention_hours: float,
    consumer: Consumer | None,
    prices: Mapping[str, float],
    billed_kb_per_record: float | None = None,
) -> dict[str, Any]:
    """$ per month of the stream, its KMS key and requests, and the reference consumer
    (``consumer`` None: no consumer priced; a user's own reader pays retrieval anyway).
    ``records_per_s`` Kinesis records of ``record_size`` bytes on average, each billed
    ``billed_kb_per_record`` KB on average (None: ``record_size`` rounded up)."""
    month_s = HOURS_PER_MONTH * 3600
    per_record = billed_kb(record_size) if billed_kb_per_record is None else billed_kb_per_record
    billed = records_per_s * per_record * KB  # bytes per second as billed
    gb_month = billed * month_s / GB
    shards = on_demand_shards(records_per_s * record_size, records_per_s)
    # Stored beyond the free 24 h, at the steady state: bytes per second times the hours kept.
    extended_h = max(0.0, min(retention_hours, 168) - 24)
    long_h = max(0.0, retention_hours - 168)
    dollars = {
        "stream": KINESIS_PRICES["stream_hour"] * HOURS_PER_MONTH,
        "ingest": gb_month * KINESIS_PRICES["ingest_gb"],
        "retrieval": gb_month * KINESIS_PRICES["retrieval_gb"],
        "retention": billed * 3600 / GB * (extended_h * KINESIS_PRICES["extended_retention_gb_month"]
                                           + long_h * KINESIS_PRICES["long_term_retention_gb_month"]),
    }
    credentials = workers + (shards if consumer else 0)
    kms_requests = credentials * month_s / KMS_CALL_PERIOD_S
    dollars["kms"] = KMS_PRICES["key_month"] + kms_requests / 1e4 * KMS_PRICES["per_10k_requests"]
    rates = None
    if consumer is not None:
        rates = consumer_rates(records_per_s=records_per_s, connections=connections, shards=shards, consumer=consumer,
                               record_size=record_size)
        dollars["consumer_lambda"] = rates["invocations"] * month_s * (
            LAMBDA_PRICES["per_million_requests"] / 1e6
            + consumer.ms_per_invocation / 1000 * consumer.memory_mb / 1024 * LAMBDA_PRICES["gb_second"])
        dollars["consumer_s3"] = rates["s3_puts"] * month_s / 1000 * S3_PRICES["put_per_thousand"]
        dollars["consumer_state"] = rates["state_writes"] * month_s / 1e6 * prices["dynamodb_wru_per_million"]
    else:
        dollars["retrieval"] = 0.0
    dollars["total"] = sum(dollars.values())
    return {"gb_ingested_per_month": gb_month, "shards": shards, "kms_requests_per_month": kms_requests,
            "consumer": rates, "month": dollars}


def dynamodb_month(*, records_per_s: float, item_size: int, ttl_days: float, prices: Mapping[str, float]) -> dict[str, Any]:
    """$ per month of the messages table: each frame's write units, and its storage for
    ``ttl_days`` at the steady state."""
    wru = max(1, math.ceil(item_size / KB))
    stored_gb = records_per_s * ttl_days * 86400 * (item_size + DYNAMODB_ITEM_OVERHEAD_BYTES) / GB
    dollars = {
        "writes": records_per_s * wru * HOURS_PER_MONTH * 3600 / 1e6 * prices["dynamodb_wru_per_million"],
        "storage": stored_gb * DYNAMODB_STORAGE_GB_MONTH,
    }
    dollars["total"] = sum(dollars.values())
    return {"wru_per_message": wru, "wru_per_s": records_per_s * wru, "stored_gb": stored_gb, "month": dollars}


def sinks(
    measured: Measured,
    *,
    connections: int,
    per_worker: int,
    rate: float,
    shards: int,
    checkpoint_s: float,
    ttl_days: float,
    frame_bytes: int = DEFAULT_FRAME_BYTES,
    retention_hours: float = 24,
    flush_ms: int = 100,
    consumer: Consumer | None = Consumer(),
    gzip_ratio: float = GZIP_RATIO,
) -> dict[str, Any]:
    """Each sink's $ per month for ``connections`` receiving ``rate`` frames per second
    of ``frame_bytes`` each: holding (:func:`.fleet.fleet`), checkpoints, and the sink's
    own; with $ per 1,000 connections and the limits of :func:`limits`."""
    holding = fleet(corrected_ops(measured, math.ceil(connections / per_worker)), connections=connections,
                    per_worker=per_worker, shards=shards, prices=measured.prices,
                    fixed_per_worker_hour=measured.fixed_per_worker_hour, measured_shards=measured_shards(measured, shards))
    per_s = connections * rate
    checkpoint_wru_s = (connections * measured.checkpoint_units / checkpoint_s) if rate > 0 else 0.0
    base = {
        "holding": holding["month"]["total"],
        "checkpoints": checkpoint_wru_s * HOURS_PER_MONTH * 3600 / 1e6 * measured.prices["dynamodb_wru_per_million"],
    }
    rec, item = record_bytes(frame_bytes), item_bytes(frame_bytes)
    table = dynamodb_month(records_per_s=per_s, item_size=item, ttl_days=ttl_days, prices=measured.prices)
    # The writer's batch: the stream's 500 frames a call; with the table too, the table's 25.
    packed, packed_both = (
        packing(rate=rate, flush_ms=flush_ms, per_worker=per_worker, user_record_bytes=rec - CONNECTION_ID_CHARS,
                batch=batch)
        for batch in (records.MAX_PUT_RECORDS, MESSAGES_TABLE_BATCH)
    )

    def stream_month(p: Packing) -> dict[str, Any]:
        return kinesis_month(records_per_s=per_s * p.records_per_message, record_size=p.record_bytes,
                             connections=connections, workers=holding["workers"], retention_hours=retention_hours,
                             consumer=consumer, prices=measured.prices, billed_kb_per_record=p.billed_kb_per_record)

    stream, stream_both = stream_month(packed), stream_month(packed_both)
    hose = firehose_month(connections=connections, per_worker=per_worker, rate=rate, period_s=packed.period_s,
                          record_bytes=rec - CONNECTION_ID_CHARS, ttl_days=ttl_days, gzip_ratio=gzip_ratio)
    out: dict[str, Any] = {}
    for name, parts in (
        (schema.SINK_DYNAMODB, {"dynamodb": table["month"]["total"]}),
        (schema.SINK_KINESIS, {"kinesis": stream["month"]["total"]}),
        (f"{schema.SINK_DYNAMODB},{schema.SINK_KINESIS}",
         {"dynamodb": table["month"]["total"], "kinesis": stream_both["month"]["total"]}),
        (schema.SINK_FIREHOSE, {"firehose": hose["month"]["total"]}),
    ):
        total = sum(base.values()) + sum(parts.values())
        out[name] = {"month": {**base, **parts, "total": total}, "per_1000_connections": total / connections * 1000}
    return {
        "connections": connections,
        "per_worker": per_worker,
        "workers": holding["workers"],
        "rate": rate,
        "frame_bytes": frame_bytes,
        "record_bytes": rec,
        "flush_ms": flush_ms,
        "packing": {"kinesis": vars(packed), "dynamodb,kinesis": vars(packed_both)},
        "item_bytes": item,
        "retention_hours": retention_hours,
        "ttl_days": ttl_days,
        "consumer": vars(consumer) if consumer else None,
        "dynamodb": table,
        "kinesis": stream,
        "firehose": hose,
        "sinks": out,
        "limits": limits(connections=connections, per_worker=per_worker, rate=rate,
                         record_size=round(packed.record_bytes), item_size=item, flush_ms=flush_ms,
                         records_per_message=packed.records_per_message),
    }


def limits(*, connections: int, per_worker: int, rate: float, record_size: int, item_size: int, flush_ms: int,
           records_per_message: float = 1.0) -> list[dict[str, Any]]:
    """Where each sink's limits bind: for each, the load at this size, the limit, its
    utilisation and the size (connections, or one connection's rate) it is reached at.
    One connection's frames go to one partition key: one shard, or one table partition.
    The stream's: ``records_per_message`` Kinesis records of ``record_size`` bytes a
    frame (:func:`packing`; taken as fixed where a limit is reached at another rate)."""
    per_s = connections * rate * records_per_message  # Kinesis records
    bytes_s = per_s * record_size
    wru = max(1, math.ceil(item_size / KB))
    per_call = per_worker * rate * records_per_message * flush_ms / 1000  # records a worker's writer has at each flush
    call_cap = min(records.MAX_PUT_RECORDS, records.MAX_PUT_BYTES // record_size)
    shard_rate = min(SHARD_WRITE_RECORDS, SHARD_WRITE_BYTES / record_size)

    def at(name: str, sink: str, load: float, limit: float, unit: str, scales_with: str) -> dict[str, Any]:
        util = load / limit
        # Every load here grows linearly with what it scales with.
        base = rate if scales_with == "rate" else connections
        return {"name": name, "sink": sink, "load": load, "limit": limit, "unit": unit, "utilisation": util,
                "scales_with": scales_with, "reached_at": base / util if util else None}

    return [
        at("one connection: its shard (1 MB/s, 1,000 records/s per partition key)", schema.SINK_KINESIS,
           rate * records_per_message, shard_rate, "records/s", "rate"),
        at("on-demand stream: default write capacity (4 MB/s; it doubles its previous peak within 15 minutes)",
           schema.SINK_KINESIS, bytes_s, ON_DEMAND_DEFAULT_WRITE_BYTES, "bytes/s", "connections"),
        at("on-demand stream: maximum write (10 GB/s in us-east-1, us-west-2, eu-west-1)", schema.SINK_KINESIS,
           bytes_s, ON_DEMAND_MAX_WRITE_BYTES, "bytes/s", "connections"),
        at("on-demand stream: maximum write elsewhere (200 MB/s; more on request)", schema.SINK_KINESIS,
           bytes_s, ON_DEMAND_MAX_WRITE_BYTES_ELSEWHERE, "bytes/s", "connections"),
        at("provisioned mode instead: account shard quota (20,000 in us-east-1)", schema.SINK_KINESIS,
           max(bytes_s / SHARD_WRITE_BYTES, per_s / SHARD_WRITE_RECORDS), PROVISIONED_SHARD_QUOTA, "shards", "connections"),
        at(f"PutRecords: {records.MAX_PUT_RECORDS} records / 5 MiB per call (a worker's records per {flush_ms} ms flush)",
           schema.SINK_KINESIS, per_call, call_cap, "records", "rate"),
        at("one connection: its table partition (1,000 write units/s)", schema.SINK_DYNAMODB,
           rate * wru, PARTITION_WCU, "WRU/s", "rate"),
        at("messages table: on-demand write quota (40,000 WRU/s, adjustable)", schema.SINK_DYNAMODB,
           connections * rate * wru, TABLE_QUOTA, "WRU/s", "connections"),
    ]
