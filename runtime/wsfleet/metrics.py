"""Worker metrics: counters kept in memory, published each interval as one log line in
CloudWatch's Embedded Metric Format (EMF): the worker's stdout goes to CloudWatch Logs
(the awslogs driver), which extracts the metrics from the line. No PutMetricData call,
no API request per worker; the line is priced as log bytes, and every metric carries
the ``ServiceName`` dimension only, so the number of metrics does not grow with the
workers (each line names its worker as a property, for Logs Insights). Building the
line is pure; writing it is the worker's."""

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
    loop_lag_p99_ms: float | None = None,
    loop_lag_max_ms: float | None = None,
    refused_connections: int | None = None,
    trace_export_failures: int = 0,
    silent_connections: int | None = None,
    malformed_connections: int | None = None,
) -> list[dict[str, Any]]:
    """What one interval reports, as datums (``MetricName``, ``Dimensions``, ``Value``,
    ``Unit``): the ``ActiveConnections`` gauge (what ECS target tracking scales on,
    averaged over the service's tasks), the ``UnownedConnections`` gauge when
    it could be counted, ``LoopLagP99`` and ``EventLoopLagMs`` (the interval's longest)
    when the loop has been probed, the
    ``RefusedConnections`` gauge (held connections whose last connect was refused), and
    counter deltas, and ``TraceExportFailures`` when some span exports failed. Every
    one carries ``ServiceName`` only."""
    service = [{"Name": names.DIMENSION_SERVICE_NAME, "Value": service_name}]
    counts = {
        names.ACTIVE_CONNECTIONS: active_connections,
        names.UNOWNED_CONNECTIONS: unowned_connections,
        names.REFUSED_CONNECTIONS: refused_connections,
        names.SILENT_CONNECTIONS: silent_connections,
        names.MALFORMED_CONNECTIONS: malformed_connections,
        **deltas,
    }
    data = [datum(name, service, value, "Count") for name, value in counts.items() if value is not None]
    if loop_lag_p99_ms is not None:
        data.append(datum(names.LOOP_LAG_P99, service, loop_lag_p99_ms, "Milliseconds"))
    if loop_lag_max_ms is not None:
        data.append(datum(names.EVENT_LOOP_LAG, service, loop_lag_max_ms, "Milliseconds"))
    if trace_export_failures > 0:
        data.append(datum(names.TRACE_EXPORT_FAILURES, service, trace_export_failures, "Count"))
    return data


def datum(name: str, dimensions: list[dict[str, str]], value: float, unit: str) -> dict[str, Any]:
    return {"MetricName": name, "Dimensions": dimensions, "Value": float(value), "Unit": unit}


# The format's limits (CloudWatch drops a line that breaks them): checked here, so that a
# change that would is a test failure, not metrics silently missing.
EMF_EVENT = "metrics"  # the log event an EMF line is (its "event" member)
EMF_MAX_METRICS = 100  # per directive
EMF_MAX_DIMENSIONS = 30  # per dimension set


def emf(namespace: str, data: list[dict[str, Any]], *, timestamp_ms: int, properties: dict[str, Any]) -> dict[str, Any]:
    """One EMF document for ``data`` (:func:`metric_data`'s datums, which share one set of
    dimensions): the ``_aws`` metadata (timestamp, namespace, the dimension set and each
    metric's unit), each dimension's and metric's value as a member, and ``properties``
    (not metrics: searchable in Logs Insights). Raises ValueError on what CloudWatch would drop."""
    dimensions = {d["Name"]: d["Value"] for d in data[0]["Dimensions"]} if data else {}
    if any({x["Name"]: x["Value"] for x in d["Dimensions"]} != dimensions for d in data):
        raise ValueError("one EMF document holds metrics of one dimension set")
    if len(data) > EMF_MAX_METRICS or len(dimensions) > EMF_MAX_DIMENSIONS:
        raise ValueError(f"EMF: at most {EMF_MAX_METRICS} metrics and {EMF_MAX_DIMENSIONS} dimensions a directive")
    values = {d["MetricName"]: d["Value"] for d in data}
    clash = (set(values) | set(dimensions)) & set(properties)
    if len(values) != len(data) or set(values) & set(dimensions) or clash:
        raise ValueError(f"EMF: a member named twice ({sorted(clash) or 'a metric'})")
    directive = {
        "Namespace": namespace,
        "Dimensions": [sorted(dimensions)],
        "Metrics": [{"Name": d["MetricName"], "Unit": d["Unit"]} for d in data],
    }
    return {"_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [directive]}, **dimensions, **values, **properties}
