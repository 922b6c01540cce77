"""``wsfleet logs ID``: one connection's log lines, wherever the fleet's processes wrote
them. Every line is one JSON object (``wsfleet.logs``) and those about a connection carry
its ``connection_id``; that field is the filter.

Deployed, the workers and the router log to CloudWatch Logs: their log groups are the
service stack's outputs (``wsfleet.stack_outputs``), read with FilterLogEvents and the
JSON filter pattern ``{ $.connection_id = "ID" }``, so only the connection's lines leave
CloudWatch. A local run (``make demo``, the fleet tests) has no CloudWatch Logs: its
processes write ``<run_dir>/<name>.log``, read here with the same filter (``--run-dir``).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .. import stack_outputs
from .errors import CliError
from .timeline import files_in, json_from

# The service stack's outputs naming the log groups that hold connections' lines.
LOG_GROUP_OUTPUTS = (stack_outputs.WORKER_LOG_GROUP_NAME, stack_outputs.ROUTER_LOG_GROUP_NAME)


def pattern(connection_id: str) -> str:
    """CloudWatch's filter for JSON lines whose ``connection_id`` is this one (ids are
    A-Za-z0-9._:-, nothing to escape inside the quotes)."""
    return '{ $.connection_id = "%s" }' % connection_id


def log_groups_of(outputs: Mapping[str, str], stack_name: str) -> list[str]:
    groups = [outputs[key] for key in LOG_GROUP_OUTPUTS if outputs.get(key)]
    if not groups:
        raise CliError(
            f"stack {stack_name} has no log group outputs: name the service stack (wsfleet-<env>-service), deployed "
            f"with its {' and '.join(LOG_GROUP_OUTPUTS)} outputs, or pass --log-group"
        )
    return groups


def line_of(text: str, connection_id: str) -> dict[str, Any] | None:
    """The JSON object of a log line about ``connection_id``, else None (an export's
    timestamp before the JSON is skipped, as ``wsfleet report`` does)."""
    if connection_id not in text:
        return None
    record = json_from(text)
    return record if record is not None and record.get("connection_id") == connection_id else None


# --- CloudWatch Logs -----------------------------------------------------------------------


class CloudWatchLines:
    """FilterLogEvents over the log groups, every page; ``read`` returns the lines from
    ``start_ms`` in time order, each once (a follow's next read starts at the last
    timestamp seen, and the events seen at it are not shown again)."""

    def __init__(self, logs: Any, groups: list[str], connection_id: str, *, start_ms: int) -> None:
        self._logs = logs
        self._groups = groups
        self._connection_id = connection_id
        self._start_ms = start_ms
        self._seen: set[str] = set()

    def read(self) -> list[dict[str, Any]]:
        found, latest = [], self._start_ms
        for group in self._groups:
            kwargs = {"logGroupName": group, "filterPattern": pattern(self._connection_id), "startTime": self._start_ms}
            while True:
                try:
                    page = self._logs.filter_log_events(**kwargs)
                except self._logs.exceptions.ResourceNotFoundException:
                    raise CliError(f"log group {group} does not exist in {self._logs.meta.region_name}") from None
                for event in page.get("events", []):
                    if event["eventId"] in self._seen:
                        continue
                    self._seen.add(event["eventId"])
                    record = line_of(event["message"], self._connection_id)
                    if record is not None:
                        found.append((event["timestamp"], record))
                    latest = max(latest, event["timestamp"])
                if not page.get("nextToken"):
                    break
                kwargs["nextToken"] = page["nextToken"]
        self._start_ms = latest
        return [record for _, record in sorted(found, key=lambda pair: pair[0])]


# --- a local run's files ---------------------------------------------------------------------


class RunDirLines:
    """The run directory's log files (``*.log``, ``*.jsonl``, gzipped too, recursively):
    ``read`` returns the connection's lines written since the last read (all of them the
    first time) with a ``ts`` from ``start_s``, in time order; a line still being written
    waits for its newline."""

    def __init__(self, run_dir: str, connection_id: str, *, start_s: float) -> None:
        self._dir = Path(run_dir)
        self._start_s = start_s
        if not self._dir.is_dir():
            raise CliError(f"--run-dir {run_dir}: no such directory")
        self._connection_id = connection_id
        self._offsets: dict[Path, int] = {}

    def _new_lines(self, path: Path) -> Iterator[str]:
        if path.name.endswith(".gz"):  # written whole: read once
            if path not in self._offsets:
                self._offsets[path] = 0
                with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                    yield from f
            return
        with open(path, "rb") as f:
            f.seek(self._offsets.get(path, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offsets[path] = self._offsets.get(path, 0) + end
        yield from data[:end].decode("utf-8", "replace").splitlines()

    def read(self) -> list[dict[str, Any]]:
        found = []
        for path in files_in(self._dir):
            for text in self._new_lines(path):
                record = line_of(text, self._connection_id)
                if record is not None and isinstance(record.get("ts"), (int, float)) and record["ts"] >= self._start_s:
                    found.append(record)
        return sorted(found, key=lambda r: r["ts"])


# --- showing them ------------------------------------------------------------------------------

_SHOWN_FIRST = ("ts", "level", "event", "worker_id", "component", "connection_id")


def text(record: Mapping[str, Any]) -> str:
    """``HH:MM:SS.mmm  LEVEL  WORKER  EVENT  key=value ...`` (UTC), for people."""
    at = dt.datetime.fromtimestamp(float(record.get("ts", 0)), dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    who = record.get("worker_id") or record.get("component") or "-"
    rest = " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in record.items() if k not in _SHOWN_FIRST)
    return f"{at}  {str(record.get('level', '-')):7}  {who}  {record.get('event', '-')}  {rest}".rstrip()


def follow(
    read: Callable[[], list[dict[str, Any]]],
    show: Callable[[dict[str, Any]], None],
    *,
    interval: float,
) -> None:
    """Read and show again every ``interval`` seconds, until Ctrl-C (the caller's)."""
    while True:
        time.sleep(interval)
        for record in read():
            show(record)
