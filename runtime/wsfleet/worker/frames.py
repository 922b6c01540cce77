"""One connection's frame rules, as decisions without I/O.

The connection's runner (:mod:`wsfleet.worker.connection`) owns the socket and the
writes; what it does with a frame it received, and when it asks for its checkpoint, is
decided here from the connection's state, bytes and times in, a decision out. Parsing
and the seq rules themselves are :mod:`wsfleet.stream`'s (:func:`~wsfleet.stream.parse_frame`,
:class:`~wsfleet.stream.SeqTracker`); this module puts them together for one frame.

The rules: a frame never fails the connection. One that cannot be parsed or stored is
counted and skipped, or stored as a skip marker at its seq (:mod:`wsfleet.stream`). No
silent holes: seqs the upstream jumps over are stored as one ``upstream_gap`` marker
before the frame, and a frame over the socket's limit that closes it at the same resume
point ``OVER_LIMIT_TRIES`` times becomes an ``over_frame_limit`` marker
(:meth:`SeqTracker.closed_over_limit`), the stream resuming after it. An upstream that
cannot replay (``resume: none``) starts, on a connection's first ownership ever, where
the upstream is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..checkpoint import Checkpoint, Tally, Uncounted
from ..stream import UNNUMBERED, Frame, FrameShape, Problem, Rejected, SeqTracker, parse_frame


@dataclass(slots=True)  # not frozen: one is built per frame, and a frozen one costs 2 us more
class Received:
    """What to do with one received frame, in this order: count and log its
    ``problem`` if any; when ``start_at`` is set, checkpoint it first (and store nothing
    if that fails); queue ``frames`` (none for a frame rejected or already in hand), and
    only then accept ``seq`` (:meth:`SeqTracker.accept`). Read, never changed."""

    size: int  # bytes received
    problem: Problem | None = None  # a bad frame: counted in MalformedFrames and logged
    stored_as: str | None = None  # what stands for a bad frame: nothing, a skip_marker, its data escaped
    seq: int | None = None  # the frame's seq, if it has a usable one
    start_at: int | None = None  # the stream starts after this seq: checkpoint it before queueing
    frames: Sequence[Frame] = ()  # to queue, in order: a gap marker first, if any, then the frame

    @property
    def gap(self) -> Frame | None:
        """The marker queued before the frame, if any: ``upstream_gap`` for the seqs it
        jumped over, or an assigned-seq feed's ``reconnect``."""
        first = self.frames[0] if self.frames else None
        return first if first is not None and first.problem in (Problem.UPSTREAM_GAP, Problem.RECONNECT) else None

    def problem_fields(self) -> dict[str, object]:
        """The bad frame's log fields besides its problem."""
        if self.seq is None:
            return {"size": self.size, "stored": self.stored_as}
        return {"size": self.size, "seq": self.seq, "stored": self.stored_as}


def receive(
    message: bytes, received_at_ms: int, *, tracker: SeqTracker, shape: FrameShape, may_start_fresh: bool
) -> Received:
    """Decide what one received frame asks for, given what the connection has in hand
    (``tracker``, not changed here) and where its frames keep seq and data (``shape``).

    ``may_start_fresh``: the upstream cannot replay and this is the connection's first
    ownership ever (fence 1). Then, with no frame in hand yet, its first frame is where
    the stream starts for us, not the end of a gap (nothing before it was ever asked
    for). A later owner finding nothing stored does not start fresh: an owner before it
    may have been sent frames and died before storing any (kill -9 between its first
    frames and its first write), so what lies below the first frame is a gap to mark,
    never silently skipped."""
    parsed = parse_frame(message, received_at_ms, shape)
    return decided(parsed, len(message), tracker=tracker, may_start_fresh=may_start_fresh)


def decided(frame: Frame | Rejected, size: int, *, tracker: SeqTracker, may_start_fresh: bool) -> Received:
    """:func:`receive` for a frame parsed already (elsewhere: a large one, off the event
    loop, by :mod:`.decoder`), ``size`` bytes as received."""
    if isinstance(frame, Rejected):
        return Received(frame.size, frame.problem, "nothing")
    stored_as = None if frame.problem is None else "skip_marker" if frame.is_marker else "escaped"
    if frame.seq == UNNUMBERED:  # an assigned-seq feed's: numbered here, after a reconnect marker if due
        frames = tracker.numbered(frame)
        return Received(size, frame.problem, stored_as, frames[-1].seq, frames=frames)
    if may_start_fresh and tracker.last_accepted == 0 and frame.seq > 1:
        return Received(size, frame.problem, stored_as, frame.seq, start_at=frame.seq - 1, frames=(frame,))
    return Received(size, frame.problem, stored_as, frame.seq, frames=tracker.to_store(frame))


@dataclass
class CheckpointTimer:
    """When a connection asks for its checkpoint to be written: at least every
    ``every_s`` while frames are stored, never for a quiet connection. It asks
    ``gather_share`` of that early, so that its checkpoint can leave together with other
    connections' ones (:mod:`wsfleet.worker.checkpoints`). Times are
    :func:`wsfleet.clock.now` seconds, passed in.

    A frame stored is covered by a checkpoint within ``every_s``, the last of a burst
    too: the checkpointer, woken by a stored batch, waits :meth:`wait_s` and asks then.
    So the item's counts (frames, bytes, last_frame_at_ms) are at most ``every_s`` (and a
    flush) behind what is stored. It also keeps what was stored since the last checkpoint
    and not counted yet (:meth:`uncounted`), for the next checkpoint write to add."""

    every_s: float
    gather_share: float
    written: Checkpoint  # the last checkpoint in the item, as far as this ownership knows
    at: float  # when it was written (or the ownership began)
    pieces: list[tuple[int, Tally]] = field(default_factory=list)  # stored past ``written``, uncounted: (last seq, counts)

    @classmethod
    def after(cls, every_s: float, gather_share: float, written: Checkpoint, now: float, stored_end: int) -> CheckpointTimer:
        """A new ownership's timer, from its checkpoint as read; ``stored_end``: where a sink
        found the stored messages end past it (a :class:`~wsfleet.checkpoint.StoredEnd`
        brings what a dead owner stored there, for the first checkpoint to count)."""
        return cls(every_s, gather_share, written, now, list(getattr(stored_end, "pieces", ())))

    def time_to_ask(self, now: float) -> bool:
        """``every_s`` less the gathering time has passed since the last checkpoint."""
        return now - self.at >= self.every_s * (1 - self.gather_share)

    def wait_s(self, now: float) -> float:
        """Seconds until it is time to ask (0: now)."""
        return max(0.0, self.at + self.every_s * (1 - self.gather_share) - now)

    def stored(self, end: int, counts: Tally) -> None:
        """A batch stored the connection's seqs up to ``end``, adding ``counts``."""
        if counts:
            self.pieces.append((end, counts))

    def uncounted(self) -> Uncounted:
        """What a checkpoint written now adds to the item's counts, against ``written``."""
        return Uncounted(self.written, tuple(self.pieces))

    def due(self, stored: Checkpoint, now: float) -> bool:
        """A checkpoint is asked for once it is time to, and only if frames were stored
        since the last one."""
        return stored > self.written and self.time_to_ask(now)

    @property
    def by(self) -> float:
        """When the checkpoint asked for must be written at the latest."""
        return self.at + self.every_s

    def wrote(self, checkpoint: Checkpoint, now: float) -> None:
        """``checkpoint`` is in the item since ``now``."""
        self.written = self.written.advanced(checkpoint)
        self.at = now
        self.pieces = [p for p in self.pieces if p[0] > self.written]  # counted

    def started(self, checkpoint: Checkpoint) -> None:
        """The stream's start was written: not a periodic checkpoint, so the timing stays."""
        self.written = self.written.advanced(checkpoint)
        self.pieces = [p for p in self.pieces if p[0] > self.written]
