"""What a benchmark's messages stream holds, as Kinesis bills it: its Kinesis records
(aggregates or plain), the frames' records in them, and per frame the Kinesis records,
bytes and KB billed (each Kinesis record rounded up to a KB)."""

from __future__ import annotations

import math
from typing import Any

from sim import stream_audit
from wsfleet import aggregation


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
