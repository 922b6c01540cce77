"""CloudWatch's side of the Embedded Metric Format, locally: metrics extracted from log
lines as CloudWatch Logs extracts them, and a line CloudWatch would drop refused.

The worker publishes its metrics as EMF lines on stdout (``wsfleet.metrics``); deployed,
CloudWatch Logs turns them into metrics. Here the same lines are read back from a run's
logs, under the format's rules (the specification's: a ``_aws`` member with an integer
``Timestamp`` and ``CloudWatchMetrics`` directives, each with a ``Namespace``,
``Dimensions`` (sets of at most 30 names, each a string member of the line) and
``Metrics`` (at most 100, each a ``Name`` that is a numeric member, or a list of at most
100 numbers, and a known ``Unit``)), so that a line that breaks one fails a test instead
of a dashboard going quiet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

UNITS = frozenset({
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
    "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
    "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
    "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
})
MAX_METRICS, MAX_DIMENSIONS, MAX_VALUES = 100, 30, 100


class InvalidEmf(ValueError):
    """A line CloudWatch would not extract metrics from; the message says why."""


@dataclass(frozen=True)
class Datapoint:
    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    value: float
    unit: str
    timestamp_ms: int


def is_emf(line: Mapping[str, Any]) -> bool:
    return isinstance(line, Mapping) and "_aws" in line


def extract(line: Mapping[str, Any]) -> list[Datapoint]:
    """The datapoints of one EMF line (InvalidEmf if CloudWatch would drop it)."""
    meta = line.get("_aws")
    if not isinstance(meta, Mapping):
        raise InvalidEmf("_aws must be an object")
    timestamp = meta.get("Timestamp")
    if type(timestamp) is not int or timestamp < 0:
        raise InvalidEmf(f"_aws.Timestamp must be milliseconds since the epoch, got {timestamp!r}")
    directives = meta.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        raise InvalidEmf("_aws.CloudWatchMetrics must be a non-empty list")
    points = []
    for directive in directives:
        namespace = directive.get("Namespace")
        if not isinstance(namespace, str) or not 1 <= len(namespace) <= 255:
            raise InvalidEmf(f"Namespace must be 1-255 characters, got {namespace!r}")
        sets = directive.get("Dimensions")
        if not isinstance(sets, list):
            raise InvalidEmf("Dimensions must be a list of dimension sets")
        metrics = directive.get("Metrics")
        if not isinstance(metrics, list) or len(metrics) > MAX_METRICS:
            raise InvalidEmf(f"Metrics must be a list of at most {MAX_METRICS}")
        for names in sets or [[]]:
            if not isinstance(names, list) or len(names) > MAX_DIMENSIONS:
                raise InvalidEmf(f"a dimension set must be a list of at most {MAX_DIMENSIONS} names")
            for name in names:
                if not isinstance(line.get(name), str):
                    raise InvalidEmf(f"dimension {name!r} must be a string member of the line")
            dims = tuple((name, line[name]) for name in names)
            for metric in metrics:
                points += _metric(line, namespace, dims, metric, timestamp)
    return points


def _metric(line: Mapping[str, Any], namespace: str, dims: tuple, metric: Mapping[str, Any], ts: int) -> list[Datapoint]:
    name, unit = metric.get("Name"), metric.get("Unit", "None")
    if not isinstance(name, str) or not 1 <= len(name) <= 1024:
        raise InvalidEmf(f"a metric's Name must be 1-1024 characters, got {name!r}")
    if unit not in UNITS:
        raise InvalidEmf(f"metric {name}: unknown Unit {unit!r}")
    value = line.get(name)
    values = value if isinstance(value, list) else [value]
    if not values or len(values) > MAX_VALUES or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise InvalidEmf(f"metric {name} must be a number (or at most {MAX_VALUES}) in the line, got {value!r}")
    return [Datapoint(namespace, name, dims, float(v), unit, ts) for v in values]


def from_log(lines: Iterable[str | Mapping[str, Any]]) -> list[Datapoint]:
    """Every datapoint of a run's log (JSON lines, or parsed ones), in order; lines that
    are not EMF are passed over, an EMF line that is invalid raises."""
    points = []
    for line in lines:
        record = json.loads(line) if isinstance(line, str) else line
        if is_emf(record):
            points += extract(record)
    return points
