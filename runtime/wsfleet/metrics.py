"""Worker metrics: counters kept in memory, published to CloudWatch as one
PutMetricData per interval. Building the request is pure; sending it is the worker's."""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import metrics_names as names


class Counters:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._published: Counter[str] = Counter()

    def add(self, name: str, n: int = 1) -> None:
        if name not in names.COUNTERS:
            raise KeyError(f"unknown counter {name!r}")
        self._counts[name] += n

    def total(self, name: str) -> int:
        return self._counts[name]

    def totals(self) -> dict[str, int]:
        return {name: self._counts[name] for name in names.COUNTERS}

    def take_deltas(self) -> dict[str, int]:
        """What changed since the last call (what one publish reports)."""
        deltas = {name: self._counts[name] - self._published[name] for name in names.COUNTERS}
        self._published = Counter(self._counts)
        return deltas


def metric_data(
    *,
    service_name: str,
    active_connections: int,
    deltas: dict[str, int],
    unowned_connections: int | None = None,
    worker_id: str | None = None,
    loop_lag_p99_ms: float | None = None,
    loop_lag_max_ms: float | None = None,
    refused_connections: int | None = None,
    trace_export_failures: int = 0,
) -> list[dict[str, Any]]:
    """The PutMetricData ``MetricData``: the ``ActiveConnections`` gauge (what ECS
    target tracking scales on, averaged over the service's tasks), the same gauge once
    more per worker when ``worker_id`` is given, the ``UnownedConnections`` gauge when
    it could be counted, ``LoopLagP99`` and ``EventLoopLagMs`` (the interval's longest)
    when the loop has been probed, the
    ``RefusedConnections`` gauge (held connections whose last connect was refused), and
    counter deltas, and ``TraceExportFailures`` when some span exports failed. Everything
    but the per-worker gauge carries ``ServiceName`` only."""
    service = [{"Name": names.DIMENSION_SERVICE_NAME, "Value": service_name}]
    counts = {
        names.ACTIVE_CONNECTIONS: active_connections,
        names.UNOWNED_CONNECTIONS: unowned_connections,
        names.REFUSED_CONNECTIONS: refused_connections,
        **deltas,
    }
    data = [_datum(name, service, value, "Count") for name, value in counts.items() if value is not None]
    if worker_id is not None:
        worker = [*service, {"Name": names.DIMENSION_WORKER_ID, "Value": worker_id}]
        data.append(_datum(names.ACTIVE_CONNECTIONS, worker, active_connections, "Count"))
    if loop_lag_p99_ms is not None:
        data.append(_datum(names.LOOP_LAG_P99, service, loop_lag_p99_ms, "Milliseconds"))
    if loop_lag_max_ms is not None:
        data.append(_datum(names.EVENT_LOOP_LAG, service, loop_lag_max_ms, "Milliseconds"))
    if trace_export_failures > 0:
        data.append(_datum(names.TRACE_EXPORT_FAILURES, service, trace_export_failures, "Count"))
    return data


def _datum(name: str, dimensions: list[dict[str, str]], value: float, unit: str) -> dict[str, Any]:
    return {"MetricName": name, "Dimensions": dimensions, "Value": float(value), "Unit": unit}
