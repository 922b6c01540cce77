"""What the fleet's observer reads of the tables (sessions, connections, samples of both
beside the upstream's books), the reachability check over consecutive samples, and the
shapes of the fleet's final audits. Plain data and pure functions."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from wsfleet import schema
from wsfleet.leases import released_at_fence, unreachable


@dataclass(frozen=True)
class SessionState:
    """One worker session, as the observer read it."""

    worker_id: str
    state: str  # LIVE | ENDED
    expires_at_ms: int  # by its worker's wall clock, as are heartbeat_at_ms and started_at_ms
    heartbeat_at_ms: int = 0
    started_at_ms: int = 0
    ended_by: str = ""  # the session (of a watcher) or the worker id (its own) that ended it
    in_ring: bool = False  # in the watch ring: LIVE, or ENDED and not yet drained

    def live_at(self, now_ms: int) -> bool:
        return self.state == schema.LIVE and self.expires_at_ms > now_ms


@dataclass(frozen=True)
class ConnState:
    """One connection item, with its session as the observer read it."""

    desired_state: str
    owner: str  # lease_owner: the worker id of the session it is attached to, "" when free
    session: str  # lease_session, "" when free
    expires_at_ms: int  # that session's expiry while it is LIVE, else 0 (as GET /connections says)
    fence_token: int
    last_seq: int
    owner_key: str = ""  # the by_owner partition: S#<session>, FREE#<shard>, or "" (none)
    quarantined: bool = False  # set aside by the crash-loop breaker until a new START

    def owned_at(self, now_ms: int) -> str:
        """The owner if it is attached to a session that is LIVE and unexpired at
        ``now_ms``, else ""."""
        return self.owner if self.session and self.expires_at_ms > now_ms else ""


@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds, when the scan returned
    connections: dict[str, ConnState]
    open_sockets: dict[str, int]  # per stream
    produced: int  # sum of the streams' heads
    frames_sent: int  # sum over every socket ever opened (replays included)
    sessions: dict[str, SessionState] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)  # per stream: the seq produced last
    sent_heads: dict[str, int] = field(default_factory=dict)  # per stream: the highest seq sent on an open socket

    def owners(self) -> dict[str, str]:
        """Live owner per STARTED connection ("" if none)."""
        now = int(self.t * 1000)
        return {cid: c.owned_at(now) for cid, c in self.connections.items() if c.desired_state == schema.STARTED}

    def owned_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for owner in self.owners().values():
            if owner:
                counts[owner] = counts.get(owner, 0) + 1
        return counts

    def orphans(self) -> list[str]:
        """STARTED connections not attached to a live session."""
        return sorted(cid for cid, owner in self.owners().items() if not owner)

    @property
    def stored(self) -> int:
        """Sum of checkpoints: messages durably stored (as of each connection's last
        checkpoint, at most CHECKPOINT_SECONDS old while frames arrive)."""
        return sum(c.last_seq for c in self.connections.values())


def session_from_item(item: Mapping[str, Any]) -> SessionState:
    return SessionState(
        worker_id=item.get(schema.SESSION_WORKER_ID, ""),
        state=item.get(schema.SESSION_STATE, ""),
        expires_at_ms=int(item.get(schema.EXPIRES_AT_MS, 0)),
        heartbeat_at_ms=int(item.get(schema.HEARTBEAT_AT_MS, 0)),
        started_at_ms=int(item.get(schema.STARTED_AT_MS, 0)),
        ended_by=item.get(schema.ENDED_BY, ""),
        in_ring=item.get(schema.RING) == schema.RING_VALUE,
    )


def state_from_item(item: Mapping[str, Any], sessions: Mapping[str, SessionState]) -> ConnState:
    session_id = item.get(schema.LEASE_SESSION, "")
    session = sessions.get(session_id) if session_id else None
    if released_at_fence(item):
        session = None  # handed off and not taken yet: nobody holds it (still attached, for reachability)
    return ConnState(
        desired_state=item.get(schema.DESIRED_STATE, ""),
        owner=item.get(schema.LEASE_OWNER, ""),
        session=session_id,
        expires_at_ms=session.expires_at_ms if session is not None and session.state == schema.LIVE else 0,
        fence_token=int(item.get(schema.FENCE_TOKEN, 0)),
        last_seq=int(item.get(schema.LAST_SEQ, 0)),
        owner_key=item.get(schema.OWNER_KEY, ""),
        quarantined=schema.QUARANTINED in item,
    )


def unreachable_in(sessions: Mapping[str, SessionState], connections: Mapping[str, ConnState]) -> dict[str, str]:
    """Connections no worker would ever take (:func:`wsfleet.leases.unreachable`), by
    why, from ``sessions`` read BEFORE ``connections``: a session out of the ring never
    comes back into it, so a connection read attached to one after it was seen out is
    unreachable then. (Read the other way round, a drain that frees a connection and
    then takes its session out of the ring would look like a violation.) A session
    missing from ``sessions`` is newer than that read, not gone: it is left out."""
    found = {}
    for cid, c in connections.items():
        session = sessions.get(c.session) if c.session else None
        if c.session and session is None:
            continue
        item = {schema.DESIRED_STATE: c.desired_state, schema.LEASE_SESSION: c.session, schema.OWNER_KEY: c.owner_key,
                **({schema.QUARANTINED: True} if c.quarantined else {})}
        raw = None if session is None else {schema.SESSION_STATE: session.state, **({schema.RING: schema.RING_VALUE} if session.in_ring else {})}
        why = unreachable(item, raw)
        if why is not None:
            found[cid] = why.value
    return found


class Observed(Protocol):
    """What the reachability check reads of an observer sample (a :class:`Sample`, or a
    chaos run's snapshot of one)."""

    @property
    def t(self) -> float: ...
    @property
    def connections(self) -> Mapping[str, ConnState]: ...
    @property
    def sessions(self) -> Mapping[str, SessionState]: ...


def reachability_violations(samples: Sequence[Observed]) -> list[tuple[float, str, str]]:
    """(time, connection, why) for every connection found unreachable between two
    consecutive samples: the first one's sessions (each sample reads its connections,
    then its sessions) against the next one's connections."""
    return [
        (cur.t, cid, why)
        for prev, cur in itertools.pairwise(samples)
        for cid, why in unreachable_in(prev.sessions, cur.connections).items()
    ]


@dataclass
class Audit:
    """One connection's messages after the run, against the upstream's books."""

    connection_id: str
    rows: int
    first: int | None
    last: int | None
    checkpoint: int
    produced: int  # the stream's head
    delivered: int  # distinct seqs the upstream sent to any socket
    missing: list[int] = field(default_factory=list)  # seqs absent below the last stored one

    @property
    def ok(self) -> bool:
        """Exactly 1..checkpoint stored (seq is the key, so a count equal to the range
        means no gap; duplicates cannot exist as rows)."""
        return self.gap_free and (self.last or 0) == self.checkpoint

    @property
    def gap_free(self) -> bool:
        """Exactly 1..last stored, the checkpoint maybe behind: what an owner that gave up
        before its release leaves (its last batch landed; the connection is freed as is)."""
        return not self.missing and self.rows == (self.last or 0)


@dataclass
class LargeFrame:
    """One frame of large data: what the upstream sent (its books) against what the
    fleet stored and reads back (the item, then its S3 object)."""

    connection_id: str
    seq: int
    sent_bytes: int  # the data's compact JSON, UTF-8
    sent_sha256: str
    stored: str  # "object", "inline", "marker" or "absent"
    data_ref: str | None = None
    item_bytes: int | None = None  # what the item says
    item_sha256: str | None = None
    read_bytes: int | None = None  # what the object read back holds
    read_sha256: str | None = None
    via: str = "api"  # read back through the read API, or ("stream", "firehose") from its record's data_ref

    @property
    def ok(self) -> bool:
        """Stored as an object that holds exactly what was sent, as its item says."""
        sent = (self.sent_bytes, self.sent_sha256)
        return self.stored == "object" and (self.item_bytes, self.item_sha256) == sent == (self.read_bytes, self.read_sha256)
