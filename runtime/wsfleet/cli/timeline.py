"""Who held which connection when, read back from the workers' own log lines: the input of
``wsfleet report``. No AWS call: a directory of JSON-lines files, as a local run writes
them (``<run_dir>/<worker>.log``) or as a deployed fleet's log group is exported
(``aws logs create-export-task`` writes gzipped files whose lines start with a
timestamp before the JSON: both are read).

From the worker's events (``wsfleet.worker``): ``lease_acquired`` opens an owner period
(with its ``fence_token``), ``connection_ended`` closes it (``why``); ``connected`` and
``socket_closed`` bound a socket; ``worker_started`` begins a process, so a period its
previous process left open (a kill -9 logs nothing) ends at that process's last line,
as does one still open where the log ends. ``active`` on any line is the worker's load.
Warnings and errors naming a connection, and the few events below, become markers.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

# Files read under the directory (recursively); any other file is left alone.
SUFFIXES = (".log", ".jsonl", ".log.gz", ".jsonl.gz", ".gz")
# Info events worth a marker on a connection's lane (warnings and errors always are).
MARKED = frozenset({"stop_received", "lease_released", "connection_moved", "reconnecting", "handoff_stopped"})
STILL_HELD = "still held where the log ends"
PROCESS_GONE = "its process logged nothing more"


@dataclass
class Period:
    """One worker's ownership of a connection, as its log tells it."""

    worker: str
    fence: int
    start: float
    end: float = 0.0
    why: str = ""  # connection_ended's why, or STILL_HELD / PROCESS_GONE
    source: str = ""  # lease_acquired's source: hint, orphan, handoff, ...


@dataclass(frozen=True)
class Marker:
    ts: float
    event: str
    level: str
    worker: str
    detail: str


@dataclass
class Lane:
    connection_id: str
    periods: list[Period] = field(default_factory=list)
    sockets: list[tuple[float, float, str]] = field(default_factory=list)  # (open, closed, worker)
    markers: list[Marker] = field(default_factory=list)

    def overlaps(self) -> int:
        """Moments two workers' logs both claim the connection (a paused owner that has
        not yet noticed its session is gone does; the socket books say who really sent)."""
        spans = sorted((p.start, p.end) for p in self.periods)
        return sum(1 for (_, end), (start, _) in zip(spans, spans[1:], strict=False) if start < end)

    def gaps(self) -> list[tuple[float, float]]:
        """Stretches without a socket between the first socket and the last one."""
        spans = sorted((a, b) for a, b, _ in self.sockets)
        out, reach = [], None
        for a, b in spans:
            if reach is not None and a > reach:
                out.append((reach, a))
            reach = b if reach is None else max(reach, b)
        return out


@dataclass
class Timeline:
    start: float
    end: float
    lanes: dict[str, Lane]
    load: dict[str, list[tuple[float, int]]]  # worker -> (ts, active), in time order
    workers: list[str]  # in order of first appearance
    lines: int  # worker lines read
    skipped: int  # lines that were not a worker's JSON event
    files: int


class NoEvents(ValueError):
    """The directory holds no worker log line."""


def files_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


def json_from(line: str) -> dict[str, Any] | None:
    """The JSON object from a log line's first ``{`` (an export's timestamp before it is
    skipped), or None."""
    at = line.find("{")
    if at < 0:
        return None
    try:
        record = json.loads(line[at:])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def parse(line: str) -> dict[str, Any] | None:
    """A worker's event, or None: :func:`json_from` the line, with ``event``, a numeric
    ``ts`` and ``worker_id``."""
    record = json_from(line)
    if record is None or not isinstance(record.get("event"), str):
        return None
    if not isinstance(record.get("ts"), (int, float)) or not isinstance(record.get("worker_id"), str):
        return None
    return record


def read(directory: Path | str) -> Timeline:
    """The timeline of every worker log line under ``directory``; NoEvents if none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NoEvents(f"{directory} is not a directory")
    paths = files_in(directory)
    records, skipped = [], 0
    for path in paths:
        for line in _lines(path):
            record = parse(line)
            if record is None:
                skipped += bool(line.strip())
            else:
                records.append(record)
    if not records:
        raise NoEvents(
            f"no worker log line in {directory} ({len(paths)} files read: *.log, *.jsonl and gzipped ones, "
            "JSON lines with event, ts and worker_id)"
        )
    records.sort(key=lambda r: r["ts"])
    timeline = build(records)
    timeline.skipped, timeline.files = skipped, len(paths)
    return timeline


def build(records: Iterable[dict[str, Any]]) -> Timeline:
    """The timeline of ``records`` (worker events in time order)."""
    lanes: dict[str, Lane] = {}
    load: dict[str, list[tuple[float, int]]] = {}
    last_seen: dict[str, float] = {}
    held: dict[tuple[str, str], Period] = {}  # (worker, connection) -> its open period
    sockets: dict[tuple[str, str], float] = {}  # (worker, connection) -> when its socket opened
    count = 0
    first = None

    def lane(cid: str) -> Lane:
        return lanes.setdefault(cid, Lane(cid))

    def close_socket(key: tuple[str, str], at: float) -> None:
        opened = sockets.pop(key, None)
        if opened is not None:
            lane(key[1]).sockets.append((opened, at, key[0]))

    def end_process(worker: str, why: str) -> None:
        at = last_seen.get(worker)
        for key in [k for k in held if k[0] == worker]:
            period = held.pop(key)
            period.end, period.why = max(at or period.start, period.start), why
            close_socket(key, period.end)

    for r in records:
        count += 1
        ts, event, worker = float(r["ts"]), r["event"], r["worker_id"]
        first = ts if first is None else first
        cid = r.get("connection_id") if isinstance(r.get("connection_id"), str) else None
        if event == "worker_started":
            end_process(worker, PROCESS_GONE)
            load.setdefault(worker, []).append((ts, 0))
        last_seen[worker] = ts
        if isinstance(r.get("active"), int):
            load.setdefault(worker, []).append((ts, r["active"]))
        if cid is None:
            continue
        key = (worker, cid)
        if event == "lease_acquired":
            if key in held:  # acquired again without an end logged: the first ends here
                held[key].end, held[key].why = ts, "acquired again"
                close_socket(key, ts)
            period = Period(worker, _int(r.get("fence_token")), ts, source=str(r.get("source", "")))
            held[key] = period
            lane(cid).periods.append(period)
        elif event == "connected":
            close_socket(key, ts)
            sockets[key] = ts
        elif event == "socket_closed":
            close_socket(key, ts)
        elif event == "connection_ended" and key in held:
            period = held.pop(key)
            period.end, period.why = ts, str(r.get("why", ""))
            close_socket(key, ts)
        level = str(r.get("level", ""))
        if level in ("warning", "error") or event in MARKED:
            lane(cid).markers.append(Marker(ts, event, level, worker, _detail(r)))
    for worker in {w for w, _ in held}:
        end_process(worker, STILL_HELD)
    if first is None:
        raise NoEvents("no worker log line")
    end = max(last_seen.values())
    return Timeline(
        start=first,
        end=end,
        lanes=dict(sorted(lanes.items())),
        load=load,
        workers=list(last_seen),  # dicts keep insertion order: first appearance
        lines=count,
        skipped=0,
        files=0,
    )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# Fields every line has, or that the lane already shows: not repeated in a marker's tooltip.
_SHOWN = frozenset({"ts", "level", "event", "worker_id", "connection_id", "trace_id", "fence_token"})


def _detail(record: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in record.items() if k not in _SHOWN]
    return ", ".join(parts)[:300]
