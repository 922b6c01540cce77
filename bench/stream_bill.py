"""What a benchmark's messages stream holds, as Kinesis bills it: its Kinesis records
(aggregates or plain), the frames' records in them, and per frame the Kinesis records,
bytes and KB billed (each Kinesis record rounded up to a KB); and the same of the
delivery stream's objects, as Firehose bills them (each record rounded up to 5 KB), and
how many times smaller GZIP makes their lines (the stacks' delivery stream GZIPs each
object it writes; the plan's ``--gzip-ratio``)."""

from __future__ import annotations

import gzip
import math
from typing import Any

from sim import stream_audit
from sim.delivery_audit import delivery_objects
from wsfleet import aggregation, records
from wsfleet.plan.prices import FIREHOSE_RECORD_ROUNDING_BYTES as BILLING_UNIT
from wsfleet.sinks.firehose import MAX_RECORD_BYTES


def stream_bill(kinesis: Any, stream: str) -> dict[str, Any]:
    """The figures of the module's docstring over every record of ``stream`` now."""
    n = frames = size = kb = 0
    for _, raw in stream_audit.kinesis_records(kinesis, stream):
        n += 1
        frames += len(aggregation.user_records(raw["Data"], raw["PartitionKey"]))
        bytes_ = len(raw["Data"]) + len(raw["PartitionKey"].encode("utf-8"))  # as Kinesis counts a record
        size += bytes_
        kb += math.ceil(bytes_ / 1024)
    return {
        "kinesis_records": n,
        "frames": frames,
        "records_per_message": n / frames if frames else None,
        "bytes_per_message": size / frames if frames else None,
        "billed_kb_per_message": kb / frames if frames else None,
    }


def delivery_bill(firehose: Any, s3: Any, delivery_stream: str) -> dict[str, Any]:
    """Firehose records, bytes and KB billed per frame over every object the emulator's
    delivery stream holds now. moto writes each PutRecordBatch as one object, its records'
    bytes one after the other, and the worker packs every line of one call into records
    of at most 1,000 KiB, filled in order: an object's records are its lines cut where the
    next would pass that size (:class:`wsfleet.sinks.firehose.DeliverySink`)."""
    n = frames = size = billed = 0
    bodies = []
    for _, body in delivery_objects(firehose, s3, delivery_stream):
        bodies.append(body)
        run_bytes = 0
        for line in body.splitlines(keepends=True):
            records.decode(line)  # every line a record of the stream's shape
            if run_bytes and run_bytes + len(line) > MAX_RECORD_BYTES:
                n, billed, run_bytes = n + 1, billed + math.ceil(run_bytes / BILLING_UNIT) * BILLING_UNIT, 0
            frames, size, run_bytes = frames + 1, size + len(line), run_bytes + len(line)
        if run_bytes:
            n, billed = n + 1, billed + math.ceil(run_bytes / BILLING_UNIT) * BILLING_UNIT
    return {
        "firehose_records": n,
        "frames": frames,
        "records_per_message": n / frames if frames else None,
        "bytes_per_message": size / frames if frames else None,
        "billed_kb_per_message": billed / 1024 / frames if frames else None,
        # Every line delivered, GZIP'd as one object (level 6), as a delivery stream's
        # buffer of them is: its objects in the emulator are one call's lines each.
        "gzip_ratio": size / len(gzip.compress(b"".join(bodies), 6)) if frames else None,
    }
