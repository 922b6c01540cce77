"""The local upstream's books: every socket per stream, overlaps, refused handshakes,
and each stream's frames. Touched only from the server's event loop; accessors hand
out copies."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .kinds import DEFAULT, Kind

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection


@dataclass
class SocketRecord:
    """One WebSocket the upstream accepted. Times are epoch seconds (wall clock).

    ``from_seq`` is what the socket asked for: the URL's, or the subscribe message's
    when it sent one (``subscribed_from``). ``live_from`` is, for ``replay=none``, the
    first seq it could be sent (the head when it opened, plus one)."""

    id: int
    stream: str
    peer: str
    path: str
    from_seq: int
    opened_at: float
    closed_at: float | None = None
    frames_sent: int = 0
    last_seq_sent: int = 0
    first_seq_sent: int | None = None
    injected_sent: int = 0
    oversized_sent: int = 0
    amplified_sent: int = 0  # amplification frames (an amplify= kind) sent in place of seqs
    dropped: bool = False
    offset: int = 0  # replay_from: it started this many seqs after from_seq (before, if negative)
    kind: Kind = field(default_factory=Kind)
    subprotocol: str | None = None  # the one selected in the handshake
    subscribed_from: int | None = None  # the subscribe message's from_seq
    subscribe_error: str | None = None  # why its subscribe message was refused (closed 1008)
    live_from: int | None = None
    pings_sent: int = 0  # ping_flood: PINGs sent


@dataclass
class Overlap:
    """A socket opened on a stream while others were open on it.

    ``socket_ids`` lists every socket open at that moment, the new one last.
    ``ended_at`` is when the stream was back to at most one open socket.
    """

    stream: str
    started_at: float
    socket_ids: tuple[int, ...]
    peers: tuple[str, ...]
    ended_at: float | None = None


@dataclass(frozen=True)
class StreamTotals:
    stream: str
    produced: int  # head seq
    oldest_retained: int  # seq of the oldest retained frame (produced + 1 when none)
    sockets_opened: int
    open_sockets: int
    max_concurrent: int
    overlaps: int
    frames_sent: int
    injected: int
    sent_head: int = 0  # the highest seq sent on a socket open now (0 when none is)
    shape: str = DEFAULT
    refused: int = 0  # handshakes refused (any status)


class Stream:
    """One stream's frames and books."""

    def __init__(self, name: str, history: int | None, shape: str = DEFAULT) -> None:
        self.name = name
        self.shape = shape  # fixed at creation: the frames are produced in it
        # Seq oldest_retained + i is frames[i]; None for a seq skipped (never produced).
        self.frames: collections.deque[bytes | None] = collections.deque(maxlen=history)
        self.head = 0
        # Raw frames to send after seq ``k`` (0: before seq 1), in injection order.
        self.injected: dict[int, list[bytes]] = {}
        self.injected_total = 0
        # Replaced at every change; waiters hold the old one, which is then set.
        self.changed = asyncio.Event()
        self.sockets: list[SocketRecord] = []
        self.open: dict[int, tuple[SocketRecord, ServerConnection]] = {}
        self.max_concurrent = 0
        self.overlaps: list[Overlap] = []
        self.stalled = False
        self.slow_s = 0.0
        self.next_offset = 0  # replay_from, for the next socket opened

    @property
    def oldest_retained(self) -> int:
        return self.head - len(self.frames) + 1

    def frame(self, seq: int) -> bytes | None:
        return self.frames[seq - self.oldest_retained]

    def retained(self) -> dict[int, bytes]:
        return {self.oldest_retained + i: f for i, f in enumerate(self.frames) if f is not None}

    def append(self, frame: bytes | None) -> None:
        self.frames.append(frame)
        self.notify()

    def inject(self, text: str | bytes) -> None:
        self.injected.setdefault(self.head, []).append(text if isinstance(text, bytes) else text.encode())
        self.injected_total += 1
        self.notify()

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def opened(self, record: SocketRecord, ws: ServerConnection) -> None:
        self.sockets.append(record)
        self.open[record.id] = (record, ws)
        self.max_concurrent = max(self.max_concurrent, len(self.open))
        if len(self.open) > 1:
            others = [r for r, _ in self.open.values()]
            self.overlaps.append(
                Overlap(
                    stream=self.name,
                    started_at=record.opened_at,
                    socket_ids=tuple(r.id for r in others),
                    peers=tuple(r.peer for r in others),
                )
            )

    def closed(self, record: SocketRecord, at: float) -> None:
        record.closed_at = at
        self.open.pop(record.id, None)
        if len(self.open) <= 1:
            for overlap in self.overlaps:
                if overlap.ended_at is None:
                    overlap.ended_at = at

    def totals(self, refused: int = 0) -> StreamTotals:
        return StreamTotals(
            stream=self.name,
            produced=self.head,
            oldest_retained=self.oldest_retained,
            sockets_opened=len(self.sockets),
            open_sockets=len(self.open),
            max_concurrent=self.max_concurrent,
            overlaps=len(self.overlaps),
            frames_sent=sum(r.frames_sent for r in self.sockets),
            injected=self.injected_total,
            sent_head=max((r.last_seq_sent for r, _ in self.open.values()), default=0),
            shape=self.shape,
            refused=refused,
        )
