"""The delivery stream (``SINK=firehose``) priced per message: pure arithmetic, as
:mod:`.sinks`, which adds it beside the table and the stream.

What a frame costs there (:mod:`wsfleet.sinks.firehose`): its line goes, with the
worker's other lines of one flush (every connection's), into one Firehose record; ingestion is billed per
GB with **each record rounded up to 5 KB**; dynamic partitioning adds a charge per GB
processed and per 1,000 S3 objects delivered; and each object is an S3 PUT. Firehose
delivers one object per active partition (a day and a connection bucket: 64 a day) per
buffer (``BUFFER_SECONDS``, or ``BUFFER_MIB`` of it, whichever first). Not priced: the
JQ processing hours dynamic partitioning bills ($0.07 an hour of JQ time, unmeasured
here), the GZIP'd objects' S3 storage and Athena's scans (per TB a query reads).
"""

from __future__ import annotations

import math
from typing import Any

from ..records import CONNECTION_BUCKET, CONNECTION_BUCKETS
from ..records import FIREHOSE_MAX_PUT_RECORDS as MAX_PUT_RECORDS
from ..records import FIREHOSE_MAX_RECORD_BYTES as MAX_RECORD_BYTES
from .model import HOURS_PER_MONTH, S3_PRICES

# us-east-1 list prices as of December 2026 (check before relying on them): Direct PUT
# ingestion (the first 500 TB a month), dynamic partitioning per GB and per 1,000 objects.
FIREHOSE_PRICES = {"ingest_gb": 0.029, "partitioning_gb": 0.020, "partitioning_per_thousand_objects": 0.005}
BILLING_UNIT = 5 * 1024  # each record is billed rounded up to the next 5 KB
GB = 1 << 30
# The stacks' buffer (stacks.constructs.messages_delivery): one object per partition
# at least this often.
BUFFER_SECONDS = 300
BUFFER_BYTES = 128 << 20


def line_bytes(record_bytes: int) -> int:
    """A frame's line: its stream record (without the partition key), its
    ``connection_bucket`` field and the newline."""
    return record_bytes + len(f',"{CONNECTION_BUCKET}":{CONNECTION_BUCKETS - 1}') + 1


def firehose_month(*, connections: int, per_worker: int, rate: float, period_s: float, record_bytes: int) -> dict[str, Any]:
    """$ per month of the delivery stream for ``connections`` sending ``rate`` frames a
    second whose stream record is ``record_bytes`` (:func:`.sinks.record_bytes` less the
    key), a worker's frames of one ``period_s`` flush (its ``per_worker`` connections'; a
    Poisson number of them, as :func:`.sinks.packing` counts them) packed into records
    of at most 1,000 KiB and 500 frames (the writer's call); with the records, billed KB
    and bytes per message."""
    line = line_bytes(record_bytes)
    most = max(1, min(MAX_RECORD_BYTES // line, MAX_PUT_RECORDS))
    mean = per_worker * rate * period_s
    records_pm, billed_pm = 1.0, math.ceil(line / BILLING_UNIT) * BILLING_UNIT
    if mean > 0:
        spread = 12 * math.sqrt(mean) + 30
        n_records = n_billed = 0.0
        for n in range(max(1, int(mean - spread)), int(mean + spread) + 1):
            p = math.exp(n * math.log(mean) - mean - math.lgamma(n + 1))
            full, rest = divmod(n, most)
            sizes = [most * line] * full + ([rest * line] if rest else [])
            n_records += p * len(sizes)
            n_billed += p * sum(math.ceil(s / BILLING_UNIT) * BILLING_UNIT for s in sizes)
        records_pm, billed_pm = n_records / mean, n_billed / mean
    month_s = HOURS_PER_MONTH * 3600
    per_s = connections * rate
    partitions = min(CONNECTION_BUCKETS, connections)
    objects_s = partitions * max(1 / BUFFER_SECONDS, per_s * line / partitions / BUFFER_BYTES) if per_s else 0.0
    dollars = {
        "ingest": per_s * billed_pm * month_s / GB * FIREHOSE_PRICES["ingest_gb"],
        "partitioning": per_s * line * month_s / GB * FIREHOSE_PRICES["partitioning_gb"]
        + objects_s * month_s / 1000 * FIREHOSE_PRICES["partitioning_per_thousand_objects"],
        "s3_puts": objects_s * month_s / 1000 * S3_PRICES["put_per_thousand"],
    }
    dollars["total"] = sum(dollars.values())
    return {
        "line_bytes": line,
        "records_per_message": records_pm,
        "billed_kb_per_message": billed_pm / 1024,
        "objects_per_month": objects_s * month_s,
        "per_message": dollars["total"] / (per_s * month_s) if per_s else 0.0,
        "month": dollars,
    }
