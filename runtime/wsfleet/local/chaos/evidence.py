"""The evidence a chaos run is judged by, as plain data, and how it is gathered.

Only what the workers cannot vouch for themselves counts:

* the upstream's books: every socket per stream (opened, closed, what it was sent, by
  which client address), every moment two were open at once, and every frame produced;
* the messages table: every stored row with its fence and writer; the connections
  table's checkpoints;
* the emulator's journal: every message write and every acquisition, in the order the
  serialised DynamoDB applied them;
* the observer's snapshots: ownership as the tables define it (a connection is owned
  while its session is LIVE and unexpired) next to the upstream's open sockets, twice a
  second.

The workers' logs are gathered too, but the checker reads them only to cross-check.
The checker's unit tests build an :class:`Evidence` by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from ... import schema
from ..emulator import journal
from ..fleet import Fleet, Sample
from ..upstream import Overlap, SocketRecord


@dataclass(frozen=True)
class Snapshot:
    """One observer sample, kept small (a long run takes thousands)."""

    t: float
    owners: dict[str, str]  # STARTED connections: the live owner, "" if none
    open_sockets: dict[str, int] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)
    sent_heads: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, sample: Sample) -> "Snapshot":
        return cls(sample.t, sample.owners(), dict(sample.open_sockets), dict(sample.heads), dict(sample.sent_heads))


@dataclass(frozen=True)
class Row:
    """One stored message."""

    seq: int
    fence: int
    worker: str
    received_at_ms: int
    data: str  # the frame's data, as stored


@dataclass
class Evidence:
    connections: list[str]
    sockets: dict[str, list[SocketRecord]]
    overlaps: list[Overlap]
    frames: dict[str, dict[int, str]]  # upstream: per stream, seq -> the frame's data as JSON
    rows: dict[str, list[Row]]
    checkpoints: dict[str, int]
    journal: list[dict[str, Any]]
    snapshots: list[Snapshot]
    logs: dict[str, list[dict]] = field(default_factory=dict)
    exits: list[tuple[str, int, float]] = field(default_factory=list)  # workers that exited unasked
    end_t: float = 0.0  # when the evidence was gathered


def frame_data(raw: bytes) -> str:
    """A numbered frame's ``data`` as compact JSON (what the worker stores)."""
    return json.dumps(json.loads(raw)["data"], separators=(",", ":"))


def gather(fleet: Fleet, connection_ids: Sequence[str], snapshots: list[Snapshot], exits: list, end_t: float) -> Evidence:
    upstream = fleet.upstream
    assert upstream is not None
    table = fleet.messages_store
    states = fleet.scan()
    rows: dict[str, list[Row]] = {}
    for cid in connection_ids:
        rows[cid] = [
            Row(
                seq=int(item[schema.MSG_SK]),
                fence=int(item.get(schema.MSG_FENCE_TOKEN, 0)),
                worker=item.get(schema.MSG_WORKER_ID, ""),
                received_at_ms=int(item.get(schema.RECEIVED_AT_MS, 0)),
                data=item.get(schema.MESSAGE_DATA, ""),
            )
            for item in table.read_all(cid)
        ]
    return Evidence(
        connections=list(connection_ids),
        sockets={cid: upstream.sockets(cid) for cid in connection_ids},
        overlaps=upstream.overlaps(),
        frames={cid: {seq: frame_data(raw) for seq, raw in upstream.frames(cid).items()} for cid in connection_ids},
        rows=rows,
        checkpoints={cid: states[cid].last_seq for cid in connection_ids if cid in states},
        journal=journal(fleet.emulator.endpoint_url),
        snapshots=snapshots,
        logs={name: fleet.events(name) for name in fleet.workers},
        exits=list(exits),
        end_t=end_t,
    )
