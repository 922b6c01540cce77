"""The evidence a chaos run is judged by, as plain data, and how it is gathered.

Only what the workers cannot vouch for themselves counts:

* the upstream's books: every socket per stream (opened, closed, what it was sent, by
  which client address), every moment two were open at once, and every frame produced;
* the messages table: every stored row with its fence and writer; the connections
  table's checkpoints; with a Kinesis sink, every record on the messages stream (and,
  with no table sink, the rows a consumer of the stream keeps, in the table's place);
* the emulator's journal: every message write and every acquisition, in the order the
  serialised DynamoDB applied them;
* the observer's snapshots: ownership as the tables define it (a connection is owned
  while its session is LIVE and unexpired) next to the upstream's open sockets, twice a
  second, with the connections and sessions as read (for the reachability invariant).

A connection's ws_url may name more than one stream of the upstream over a run (a START
with a new url): its sockets and frames are kept per stream, with the streams each
connection used.

The workers' logs are gathered too, but the checker reads them only to cross-check.
The checker's unit tests build an :class:`Evidence` by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TypeVar

from wsfleet import schema
from ..emulator import journal
from ..fleet import Fleet
from ..observed import ConnState, Sample, SessionState
from ..stream_audit import Delivery, as_items, consumer_view
from ..upstream import DEFAULT, Overlap, SocketRecord
from ..upstream.kinds import stored_data

V = TypeVar("V")


@dataclass(frozen=True)
class Snapshot:
    """One observer sample, kept small (a long run takes thousands): per connection, its
    owner and the sockets open on every stream it may use; the stream its ws_url names
    gives the heads. The connections and sessions as read share every object that did
    not change with the snapshot before (:meth:`of`)."""

    t: float
    owners: dict[str, str]  # STARTED connections: the live owner, "" if none
    open_sockets: dict[str, int] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)
    sent_heads: dict[str, int] = field(default_factory=dict)
    connections: Mapping[str, ConnState] = field(default_factory=dict)
    sessions: Mapping[str, SessionState] = field(default_factory=dict)

    @classmethod
    def of(cls, sample: Sample, streams: Mapping[str, Sequence[str]] | None = None,
           previous: "Snapshot | None" = None) -> "Snapshot":
        """``streams``: per connection, the streams it may have a socket on, the one its
        ws_url names first (default: the stream named after it)."""
        ours = {cid: (streams or {}).get(cid) or [cid] for cid in sample.connections}
        return cls(
            sample.t,
            sample.owners(),
            {cid: sum(sample.open_sockets.get(s, 0) for s in names) for cid, names in ours.items()},
            {cid: sample.heads.get(names[0], 0) for cid, names in ours.items()},
            {cid: sample.sent_heads.get(names[0], 0) for cid, names in ours.items()},
            _shared(sample.connections, previous.connections if previous else {}),
            _shared(sample.sessions, previous.sessions if previous else {}),
        )


def _shared(now: Mapping[str, V], before: Mapping[str, V]) -> dict[str, V]:
    """``now``, with each value equal to the one ``before`` replaced by that one."""
    return {k: before[k] if k in before and before[k] == v else v for k, v in now.items()}


@dataclass(frozen=True)
class Row:
    """One stored message."""

    seq: int
    fence: int
    worker: str
    received_at_ms: int
    data: str  # the frame's data, as stored ("" for a skip marker)
    skipped: str = ""  # a skip marker's reason (malformed, upstream_gap, ...)


@dataclass
class Evidence:
    connections: list[str]
    sockets: dict[str, list[SocketRecord]]  # upstream: per stream
    overlaps: list[Overlap]
    # upstream: per stream, seq -> the frame's data as JSON (None: a frame that is not
    # JSON with a data member, a byzantine one)
    frames: dict[str, dict[int, str | None]]
    rows: dict[str, list[Row]]  # per connection
    checkpoints: dict[str, int]
    journal: list[dict[str, Any]]
    snapshots: list[Snapshot]
    logs: dict[str, list[dict]] = field(default_factory=dict)
    exits: list[tuple[str, int, float]] = field(default_factory=list)  # workers that exited unasked
    end_t: float = 0.0  # when the evidence was gathered
    streams: dict[str, list[str]] = field(default_factory=dict)  # per connection (default: the one named after it)
    sinks: tuple[str, ...] = (schema.SINK_DYNAMODB,)  # where the rows came from: the table, or the stream's consumer view
    stream: list[Delivery] | None = None  # the messages stream read whole, where it is a sink

    def streams_of(self, cid: str) -> list[str]:
        return self.streams.get(cid) or [cid]

    def sockets_of(self, cid: str) -> list[SocketRecord]:
        """Every socket on every stream the connection used, in the order they opened."""
        return sorted((r for s in self.streams_of(cid) for r in self.sockets.get(s, [])), key=lambda r: r.opened_at)


def frame_data(raw: bytes) -> str | None:
    """A numbered frame's ``data`` as compact JSON (what the worker stores), or None for
    a frame that is not JSON with a data member (a byzantine one)."""
    return stored_data(DEFAULT, raw)


def rows_of(items: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Stored message items (as the messages table or the stream's consumer keeps them) as rows."""
    return [
        Row(
            seq=int(item[schema.MSG_SK]),
            fence=int(item.get(schema.MSG_FENCE_TOKEN, 0)),
            worker=item.get(schema.MSG_WORKER_ID, ""),
            received_at_ms=int(item.get(schema.RECEIVED_AT_MS, 0)),
            data=item.get(schema.MESSAGE_DATA, ""),
            skipped=item.get(schema.SKIPPED, ""),
        )
        for item in items
    ]


def gather(fleet: Fleet, connection_ids: Sequence[str], snapshots: list[Snapshot], exits: list, end_t: float,
           streams: Mapping[str, list[str]] | None = None) -> Evidence:
    """``streams``: per connection, every stream its ws_url named (default: the one
    named after it)."""
    upstream = fleet.upstream
    assert upstream is not None
    streams = {cid: list((streams or {}).get(cid) or [cid]) for cid in connection_ids}
    every = [s for names in streams.values() for s in names]
    states = fleet.scan()
    stream = fleet.read_stream() if schema.SINK_KINESIS in fleet.sinks else None
    if schema.SINK_DYNAMODB in fleet.sinks:
        items = {cid: fleet.messages_store.read_all(cid) for cid in connection_ids}
    else:
        # No table: what a reader keeps of the stream, else of the delivery stream's objects.
        view = consumer_view(stream if stream is not None else fleet.read_deliveries())
        items = {cid: as_items(view.get(cid, {})) for cid in connection_ids}
    rows = {cid: rows_of(items[cid]) for cid in connection_ids}
    return Evidence(
        connections=list(connection_ids),
        sockets={s: upstream.sockets(s) for s in every},
        overlaps=upstream.overlaps(),
        frames={s: upstream.expected_data(s) for s in every},
        rows=rows,
        checkpoints={cid: states[cid].last_seq for cid in connection_ids if cid in states},
        journal=journal(fleet.emulator.endpoint_url),
        snapshots=snapshots,
        logs={name: fleet.events(name) for name in fleet.workers},
        exits=list(exits),
        end_t=end_t,
        streams=streams,
        sinks=fleet.sinks,
        stream=stream,
    )
