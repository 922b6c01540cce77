"""What the workers' metrics cost: EMF log lines, not API calls.

Each worker writes one Embedded Metric Format line per metrics interval
(:mod:`wsfleet.metrics`); CloudWatch Logs ingests it (priced per GB, like every log
line) and extracts the metrics from it. Every metric carries the ``ServiceName``
dimension only, so the fleet has a fixed number of custom metrics (priced per
metric-month) whatever its number of workers; what grows with the workers is the bytes
of their lines. Sized from a line built by the worker's own code with every metric in
it, so a metric added is priced without touching this module. No I/O.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .. import metrics, settings_spec
from .. import metrics_names as names
from .model import HOURS_PER_MONTH

CLOUDWATCH_LOGS_INGEST_PER_GB = 0.50  # us-east-1, standard log class (December 2026: check before relying on it)
CLOUDWATCH_CUSTOM_METRIC_MONTH = 0.30  # the first 10,000 metrics
# What CloudWatch Logs bills a log event beside its message: 26 bytes.
LOG_EVENT_OVERHEAD_BYTES = 26
METRICS_SECONDS = float(settings_spec.VARIABLES[settings_spec.METRICS_SECONDS].default)


def full_line() -> dict[str, Any]:
    """A metrics line with every metric the worker can publish, at widths a busy worker
    would print (as the worker's logger writes it: time, level, event, worker)."""
    data = metrics.metric_data(
        service_name="wsfleet-prod-worker",
        active_connections=250,
        deltas=dict.fromkeys(names.COUNTERS, 12_345),
        unowned_connections=12,
        loop_lag_p99_ms=12.345,
        loop_lag_max_ms=123.456,
        refused_connections=3,
        trace_export_failures=1,
        silent_connections=2,
        malformed_connections=1,
    )
    worker = "0123456789abcdef0123456789abcdef"  # an ECS task id
    document = metrics.emf(names.DEFAULT_NAMESPACE, data, timestamp_ms=1_800_000_000_000,
                           properties={names.DIMENSION_WORKER_ID: worker})
    return {"ts": 1_800_000_000.123, "level": "info", "event": metrics.EMF_EVENT, "worker_id": worker, **document}


def line_bytes() -> int:
    """The bytes CloudWatch Logs bills for one worker's metrics line."""
    return len(json.dumps(full_line(), separators=(",", ":"))) + LOG_EVENT_OVERHEAD_BYTES


def metric_count() -> int:
    """The fleet's custom metrics: one per metric name (one dimension set), whatever its workers."""
    return len(full_line()["_aws"]["CloudWatchMetrics"][0]["Metrics"])


def month(workers: int, prices: Mapping[str, float] | None = None, *, metrics_seconds: float = METRICS_SECONDS) -> dict[str, float]:
    """$ per month of the fleet's metrics: the lines' ingestion (grows with the workers)
    and the custom metrics (does not)."""
    prices = prices or {}
    per_gb = prices.get("cloudwatch_logs_ingest_per_gb", CLOUDWATCH_LOGS_INGEST_PER_GB)
    per_metric = prices.get("cloudwatch_custom_metric_month", CLOUDWATCH_CUSTOM_METRIC_MONTH)
    gb = workers * HOURS_PER_MONTH * 3600 / metrics_seconds * line_bytes() / 1e9
    return {"log_gb": gb, "logs": gb * per_gb, "metrics": metric_count() * per_metric,
            "total": gb * per_gb + metric_count() * per_metric}
