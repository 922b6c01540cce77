"""The delivery stream (``SINK=firehose``) priced per message: the one model of it, pure
arithmetic. :mod:`.sinks` sets it beside the table and the stream; :mod:`.modes` adds
its quotas and sets it beside the other ways to keep the messages.

What a frame costs there (:mod:`wsfleet.sinks.firehose`): its line goes, with the
worker's other lines of one flush (every connection's), into one Firehose record of at
most 1,000 KiB and 500 lines; ingestion is billed per GB, in tiers by the month's volume,
with **each record rounded up to 5 KB**; dynamic partitioning adds a charge per GB
processed and per 1,000 S3 objects delivered; each object is an S3 PUT; the objects are
kept for the message TTL, GZIP'd as the stacks' delivery stream writes them: priced at the
lines' size over ``gzip_ratio`` (:data:`GZIP_RATIO`, 2: the floor measured for lines whose
data does not compress at all, random bytes in base64, where the envelope of each line
still does; JSON feeds' lines compress 7-9 times: ``python -m bench sinks`` measures it
on what it delivered, ``wsfleet plan --gzip-ratio`` prices another).
Firehose delivers one object per active partition (a day and a connection bucket: 64 a
day) per buffer (``FIREHOSE_BUFFER_SECONDS``, or ``FIREHOSE_BUFFER_MIB`` of it, whichever
first). Not priced: the JQ processing hours dynamic partitioning bills ($0.07 an hour of
JQ time, unmeasured here) and Athena's scans (per TB a query reads).
"""

from __future__ import annotations

import math
from typing import Any

from ..records import (
    CONNECTION_BUCKET,
    CONNECTION_BUCKETS,
    FIREHOSE_BUFFER_MIB,
    FIREHOSE_BUFFER_SECONDS,
    FIREHOSE_MAX_PUT_RECORDS,
    FIREHOSE_MAX_RECORD_BYTES,
)
from .model import HOURS_PER_MONTH
from .prices import FIREHOSE_INGEST_TIERS_GB, FIREHOSE_PRICES, FIREHOSE_RECORD_ROUNDING_BYTES, S3_PRICES

GB = 1 << 30
MONTH_S = HOURS_PER_MONTH * 3600
# A delivered object's lines over its GZIP'd size, when nothing better is known: lines of
# 200 bytes of random base64 data (which does not compress) and the record's fields
# around it, 10,000 of them GZIP'd at level 6: 2.04. Transcripts, trades and sensor
# readings of 110-140 bytes of JSON: 7.0-9.0.
GZIP_RATIO = 2.0


def line_bytes(record_bytes: int) -> int:
    """A frame's line: its stream record (without the partition key), its
    ``connection_bucket`` field and the newline."""
    return record_bytes + len(f',"{CONNECTION_BUCKET}":{CONNECTION_BUCKETS - 1}') + 1


def ingest_dollars(gb: float) -> float:
    """$ of a month's ``gb`` ingested (billed GB), by Firehose's volume tiers."""
    total, below = 0.0, 0.0
    for upto, price in FIREHOSE_INGEST_TIERS_GB:
        total += max(0.0, min(gb, upto) - below) * price
        below = upto
    return total + max(0.0, gb - below) * FIREHOSE_INGEST_TIERS_GB[-1][1]


def _packed(line: int, mean: float) -> tuple[float, float]:
    """(records, billed bytes) per message when a worker's flush holds a Poisson number of
    lines with this ``mean``, cut into records of at most 1,000 KiB and 500 lines."""
    most = max(1, min(FIREHOSE_MAX_RECORD_BYTES // line, FIREHOSE_MAX_PUT_RECORDS))
    if mean <= 0:
        return 1.0, math.ceil(line / FIREHOSE_RECORD_ROUNDING_BYTES) * FIREHOSE_RECORD_ROUNDING_BYTES
    spread = 12 * math.sqrt(mean) + 30
    n_records = n_billed = 0.0
    for n in range(max(1, int(mean - spread)), int(mean + spread) + 1):
        p = math.exp(n * math.log(mean) - mean - math.lgamma(n + 1))
        full, rest = divmod(n, most)
        sizes = [most * line] * full + ([rest * line] if rest else [])
        n_records += p * len(sizes)
        n_billed += p * sum(math.ceil(s / FIREHOSE_RECORD_ROUNDING_BYTES) * FIREHOSE_RECORD_ROUNDING_BYTES for s in sizes)
    return n_records / mean, n_billed / mean


def firehose_month(*, connections: int, per_worker: int, rate: float, period_s: float, record_bytes: int,
                   ttl_days: float, gzip_ratio: float = GZIP_RATIO) -> dict[str, Any]:
    """$ per month of the delivery stream for ``connections`` sending ``rate`` frames a
    second whose stream record is ``record_bytes`` (:func:`.sinks.record_bytes` less the
    key): a worker's frames of one ``period_s`` flush (its ``per_worker`` connections'; a
    Poisson number of them, as :func:`.sinks.packing` counts them) packed into records
    (one PutRecordBatch a flush), the objects kept ``ttl_days`` at ``gzip_ratio`` times
    smaller than their lines; with the rates its quotas are checked against
    (:func:`.modes.firehose`)."""
    if not gzip_ratio >= 1:
        raise ValueError(f"gzip_ratio {gzip_ratio!r}: GZIP'd lines are not larger than the lines (a ratio of at least 1)")
    line = line_bytes(record_bytes)
    records_pm, billed_pm = _packed(line, per_worker * rate * period_s)
    per_s = connections * rate
    workers = math.ceil(connections / per_worker) if per_worker else 0
    partitions = min(CONNECTION_BUCKETS, connections)
    bytes_s = per_s * line
    objects_s = partitions * max(1 / FIREHOSE_BUFFER_SECONDS, bytes_s / partitions / (FIREHOSE_BUFFER_MIB << 20)) \
        if per_s else 0.0
    stored_gb = bytes_s / gzip_ratio * ttl_days * 86400 / GB
    dollars = {
        "ingest": ingest_dollars(per_s * billed_pm * MONTH_S / GB),
        "partitioning": bytes_s * MONTH_S / GB * FIREHOSE_PRICES["dynamic_partitioning_gb"]
        + objects_s * MONTH_S / 1000 * FIREHOSE_PRICES["per_1000_objects"],
        "s3_puts": objects_s * MONTH_S / 1000 * S3_PRICES["put_per_thousand"],
        "storage": stored_gb * S3_PRICES["gb_month"],
    }
    dollars["total"] = sum(dollars.values())
    return {
        "line_bytes": line,
        "records_per_message": records_pm,
        "record_bytes": line / records_pm,
        "billed_kb_per_message": billed_pm / 1024,
        "calls_per_s": workers / period_s if per_s and period_s > 0 else 0.0,
        "records_per_s": per_s * records_pm,
        "bytes_per_s": bytes_s,
        "partitions": partitions,
        "objects_per_s": objects_s,
        "objects_per_month": objects_s * MONTH_S,
        "gb_per_month": bytes_s * MONTH_S / GB,
        "gzip_ratio": gzip_ratio,
        "stored_gb": stored_gb,
        "per_message": dollars["total"] / (per_s * MONTH_S) if per_s else 0.0,
        "month": dollars,
    }
