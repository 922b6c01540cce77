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


def metric_data(*, service_name: str, active_connections: int, deltas: dict[str, int]) -> list[dict[str, Any]]:
    """The PutMetricData ``MetricData``: the ``ActiveConnections`` gauge (what ECS
    target tracking scales on, averaged over the service's tasks) and counter deltas."""
    dims = [{"Name": names.DIMENSION_SERVICE_NAME, "Value": service_name}]
    data = [
        {
            "MetricName": names.ACTIVE_CONNECTIONS,
            "Dimensions": dims,
            "Value": float(active_connections),
            "Unit": "Count",
        }
    ]
    data += [{"MetricName": n, "Dimensions": dims, "Value": float(v), "Unit": "Count"} for n, v in deltas.items()]
    return data
