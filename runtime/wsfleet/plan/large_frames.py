"""What a large frame costs (issue 19). Data over an item's inline limit
(stream.MAX_MESSAGE_BYTES) is stored as an S3 object and a small pointer item (CONTRACT.md
section 4). What one such frame costs, against what the same data would cost inline in
the messages table where an item could hold it. Pure arithmetic, no AWS calls.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .model import DYNAMODB_STORAGE_GB_MONTH, HOURS_PER_MONTH, S3_PRICES

ITEM_LIMIT_BYTES = 400 * 1024  # DynamoDB's item size limit
POINTER_ITEM_WRU = 1  # the pointer item (keys, data_ref, data_bytes, data_sha256, ...) is under 1 KB
DAYS_PER_MONTH = HOURS_PER_MONTH / 24


def large_frame_cost(size_bytes: int, *, prices: Mapping[str, float], retention_days: float, reads: int = 1) -> dict[str, Any]:
    """$ per million frames of ``size_bytes`` stored, kept ``retention_days`` (0: one
    month, as a floor for "kept forever") and read ``reads`` times each: through S3 (PUT
    + the pointer item's write, GETs of the presigned URL, storage), and inline in the
    messages table (write units of the whole item, the read API's Query reading it,
    storage) or None where an item cannot hold it. Data transfer out is extra in both."""
    gb = size_bytes / 1e9
    months = (retention_days or DAYS_PER_MONTH) / DAYS_PER_MONTH
    s3 = {
        "put": S3_PRICES["put_per_thousand"] * 1000,
        "pointer_item": POINTER_ITEM_WRU * prices["dynamodb_wru_per_million"],
        "reads": reads * (S3_PRICES["get_per_thousand"] * 1000 + 0.5 * prices["dynamodb_rru_per_million"]),
        "storage": gb * S3_PRICES["gb_month"] * months * 1e6,
    }
    s3["total"] = sum(s3.values())
    inline = None
    if size_bytes <= ITEM_LIMIT_BYTES:
        inline = {
            "write": math.ceil(size_bytes / 1024) * prices["dynamodb_wru_per_million"],
            "reads": reads * 0.5 * math.ceil(size_bytes / 4096) * prices["dynamodb_rru_per_million"],
            "storage": gb * DYNAMODB_STORAGE_GB_MONTH * months * 1e6,
        }
        inline["total"] = sum(inline.values())
    return {"bytes": size_bytes, "retention_days": retention_days, "reads": reads,
            "per_million_s3": s3, "per_million_inline": inline}


def large_frames_month(*, connections: int, rate: float, size_bytes: int, prices: Mapping[str, float],
                       retention_days: float, reads: int = 1) -> dict[str, Any]:
    """A fleet's large frames over a month: ``rate`` frames/s of ``size_bytes`` on each
    of ``connections``: their count, $ (see :func:`large_frame_cost`: storage at the
    steady state of ``retention_days``) and the S3 request rate the fleet sends."""
    per_s = rate * connections
    frames = per_s * 3600 * HOURS_PER_MONTH
    cost = large_frame_cost(size_bytes, prices=prices, retention_days=retention_days, reads=reads)
    return {
        "frames_per_month": frames,
        "puts_per_second": per_s,
        "stored_gb": per_s * 86400 * (retention_days or DAYS_PER_MONTH) * size_bytes / 1e9,
        "dollars_s3": frames / 1e6 * cost["per_million_s3"]["total"],
        "dollars_inline": None if cost["per_million_inline"] is None else frames / 1e6 * cost["per_million_inline"]["total"],
        "per_frame": cost,
    }
