"""The writer's decisions, without I/O: what goes into a batch and what becomes of it.

:class:`Pending` holds every connection's pending frames (a :class:`Lane` each) as the
:class:`~wsfleet.worker.writer.Writer` hands them over, and decides from them alone,
with the time passed in: whether a receive loop must wait (the caps), when the next
batch is due, which frames it takes, and, once the store answered, which frames go back
and which connection hears up to which seq. :func:`refusal` says what to send after the
store refused a batch as invalid. The writer drives them: it owns the tasks, the events
that wake receive loops, and every call to the store.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..checkpoint import Tally
from ..sinks import StoredObject, data_size, needs_object
from ..stream import Frame, Problem

Handed = tuple[Frame, float]  # a pending frame and when it was handed over (clock.now() s)
Entry = tuple[str, int, Frame]  # (connection id, fence, frame): one item for the sink


def frame_bytes(frame: Frame) -> int:
    """The data a pending frame holds (:func:`data_size`: none for a marker, whatever size
    it records). Large data counts twice: its upload encodes a copy of it (the request's
    body)."""
    size = data_size(frame)
    return 2 * size if needs_object(frame) else size


def tally(frames: Iterable[Handed]) -> Tally:
    """What stored frames add to their connection's counts: the data frames (not the skip
    markers), their data's bytes, the newest one's received time."""
    data = [f for f, _ in frames if not f.is_marker]
    return Tally(len(data), sum(map(data_size, data)), max((f.received_at_ms for f in data), default=0))


def within_limit(frame: Frame, max_data_bytes: int) -> Frame:
    """The frame, or its over_frame_limit marker if its data grew over the frame limit
    once re-encoded (escaping can)."""
    return frame.as_marker(Problem.TOO_LARGE) if data_size(frame) > max_data_bytes else frame


@dataclass(kw_only=True)
class Lane:
    """One connection's pending frames, in seq order."""

    connection_id: str
    fence_token: int
    frames: deque[Handed] = field(default_factory=deque)
    in_flight: bool = False  # a batch holds some of its frames: none other is sent meanwhile
    flushing: int = 0  # callers waiting for it to empty: its frames are sent at once
    objects: dict[int, StoredObject] = field(default_factory=dict)  # by seq: large data stored, its item not yet

    def awaiting_object(self, frame: Frame) -> bool:
        """Whether the frame's item must wait: its data needs an object not stored yet."""
        return needs_object(frame) and frame.seq not in self.objects

    @property
    def ready(self) -> bool:
        return not self.in_flight and bool(self.frames) and not self.awaiting_object(self.frames[0][0])


Batch = list[tuple[Lane, list[Handed]]]


def entries(batch: Batch) -> list[Entry]:
    """The batch's items, as the sink takes them."""
    return [(lane.connection_id, lane.fence_token, f) for lane, frames in batch for f, _ in frames]


def objects(batch: Batch) -> dict[tuple[str, int], StoredObject]:
    """The stored objects of the batch's large frames, by (connection id, seq)."""
    return {
        (lane.connection_id, f.seq): lane.objects[f.seq] for lane, frames in batch for f, _ in frames if needs_object(f)
    }


@dataclass(frozen=True)
class Settled:
    """What became of a batch (:meth:`Pending.settle`)."""

    stored: list[tuple[Lane, int, Tally]]  # each lane stored: (lane, the last seq its items stand for, what it counts)
    large: int  # of the stored frames, those whose data is in an object
    freed: int  # bytes of data no longer held (stored, or given up)


class Pending:
    """Every connection's pending frames: the caps that make receive loops wait, and
    what the next batch takes. Lanes with pending frames wait in the order their first
    pending frame arrived (oldest first)."""

    def __init__(
        self,
        *,
        batch: int,
        concurrency: int,
        interval_s: float,
        max_per_lane: int,
        max_frames: int,
        max_bytes: int | None,
    ) -> None:
        self.batch = batch  # entries per put_many: the sink's max_batch
        self._concurrency = concurrency
        self._interval = interval_s
        self._max_per_lane = max_per_lane
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self.waiting: OrderedDict[str, Lane] = OrderedDict()
        self.count = 0  # frames pending, not in flight
        self.bytes = 0  # data of frames handed over and not yet stored or given up, in flight included
        self.bytes_high_water = 0

    # --- handing over -------------------------------------------------------------------

    def full(self, lane: Lane, size: int) -> bool:
        """Whether ``size`` more bytes for ``lane`` must wait: its cap or the worker's is
        reached. The byte cap never holds back a frame when no bytes are held, so one
        larger than the cap cannot wedge the writer."""
        over_bytes = self._max_bytes is not None and self.bytes > 0 and self.bytes + size > self._max_bytes
        return len(lane.frames) >= self._max_per_lane or self.count >= self._max_frames or over_bytes

    def add(self, lane: Lane, frames: Sequence[Frame], size: int, now: float) -> bool:
        """Queue frames of one lane, in seq order, ``size`` bytes of data in all. True
        when the writer's loop should look again (a batch is full, or the lane is the
        only one waiting)."""
        lane.frames.extend((frame, now) for frame in frames)
        self.count += len(frames)
        self.bytes += size
        self.bytes_high_water = max(self.bytes_high_water, self.bytes)
        self.waiting.setdefault(lane.connection_id, lane)
        return self.count >= self.batch or len(self.waiting) == 1

    def release(self, frames: Iterable[Handed]) -> int:
        """These frames' data is no longer ours to hold (stored, or given up): the bytes
        freed."""
        freed = sum(frame_bytes(f) for f, _ in frames)
        self.bytes -= freed
        return freed

    def drop(self, lane: Lane) -> int:
        """Forget a lane's pending frames (its connection is closed): how many."""
        self.waiting.pop(lane.connection_id, None)
        dropped = len(lane.frames)
        self.count -= dropped
        self.release(lane.frames)
        lane.frames.clear()
        return dropped

    # --- the next batch -----------------------------------------------------------------

    def ready(self) -> list[Lane]:
        return [lane for lane in self.waiting.values() if lane.ready]

    def _apart(self, ready: list[Lane]) -> list[Lane]:
        """The lanes the next batch may hold: a lane with a batch's worth pending alone
        (when it is the oldest), else only lanes with less. A connection written faster
        than the store takes is one whose partition the store throttles (DynamoDB's
        1,000 units a second), and a batch is retried until all its items are in: the
        lanes sharing it would wait in flight, their frames held back by a stranger's
        throttle. Alone, its batch is full anyway."""
        if not ready:
            return ready
        if len(ready[0].frames) >= self.batch:
            return ready[:1]
        return [lane for lane in ready if len(lane.frames) < self.batch]

    def due_in(self, now: float) -> float | None:
        """Seconds until a batch is due (0: now), or None when nothing can be sent: due
        when a batch is full or a lane is being flushed, else ``interval_s`` after the
        oldest ready frame was handed over."""
        ready = self.ready()
        if not ready:
            return None
        if sum(len(lane.frames) for lane in ready) >= self.batch or any(lane.flushing for lane in ready):
            return 0.0
        oldest = min(lane.frames[0][1] for lane in ready)
        return max(0.0, oldest + self._interval - now)

    def take(self) -> Batch:
        """Up to a batch from the lanes whose first frame is oldest. When more is pending
        than one batch holds, the ready lanes are spread over as many concurrent batches
        as the pending frames fill (a lane has one batch in flight at a time, so one
        batch holding every busy lane would serialise them all); within a batch, each
        lane's fair share first, then the rest from the front. A lane served goes to the
        back; its frames taken are in flight. A lane that alone fills a batch goes alone
        (see :meth:`_apart`)."""
        ready = self._apart(self.ready())
        if not ready:
            return []
        batches = min(self._concurrency, math.ceil(sum(len(lane.frames) for lane in ready) / self.batch))
        # The spread is for a few deep lanes; many shallow ones (a frame or two each, the
        # usual case with many quiet connections) still fill one whole batch: 26 pending
        # frames of 26 connections go as 25 now and 1 later, not as 13 and 13.
        take, have = max(1, math.ceil(len(ready) / max(1, batches))), 0
        for n, lane in enumerate(ready, 1):
            have += len(lane.frames)
            if n >= take and have >= self.batch:
                take = n
                break
        else:
            take = len(ready)
        ready = ready[:take]
        share = max(1, self.batch // len(ready))
        taken: dict[str, list[Handed]] = {}
        room = self.batch
        for limit in (share, self.batch):
            for lane in ready:
                if room == 0:
                    break
                have = taken.setdefault(lane.connection_id, [])
                n = min(limit - len(have), len(lane.frames), room)
                moved = 0
                while moved < n and not lane.awaiting_object(lane.frames[0][0]):  # up to a frame still uploading
                    have.append(lane.frames.popleft())
                    moved += 1
                room -= moved
        batch = []
        for lane in ready:
            frames = taken.get(lane.connection_id) or []
            if not frames:
                continue
            lane.in_flight = True
            self.count -= len(frames)
            self.waiting.pop(lane.connection_id, None)
            if lane.frames:
                self.waiting[lane.connection_id] = lane  # its next frame is younger: to the back
            batch.append((lane, frames))
        return batch

    # --- the store's answer -------------------------------------------------------------

    def settle(
        self, batch: Batch, *, stored: bool, is_open: Callable[[Lane], bool], is_live: Callable[[Lane], bool]
    ) -> Settled:
        """The batch is over: its lanes may send again. Stored, each lane still open
        hears up to which seq (the last its items stand for: a range marker's end). Not
        stored (past the deadline, or cancelled), the frames go back in front of their
        lane with the times they were handed over, if it is still open and live
        (``is_live``: its deadline is ahead); past the deadline they are never written by
        us, and their connection is being dropped with the session (the next owner
        replays them). A lane closed meanwhile (``is_open`` false: perhaps opened again
        as another lane) gets nothing back: its runner is gone."""
        for lane, _ in batch:
            lane.in_flight = False
        large = 0
        if stored:
            for lane, frames in batch:
                if lane.objects:  # (most lanes never have any: no work per frame for them)
                    large += sum(lane.objects.pop(f.seq, None) is not None for f, _ in frames)
        told, freed = [], 0
        for lane, frames in batch:
            if stored or not is_open(lane) or not is_live(lane):
                freed += self.release(frames)
                if stored and is_open(lane):
                    told.append((lane, frames[-1][0].end, tally(frames)))
                continue
            lane.frames.extendleft(reversed(frames))
            self.count += len(frames)
            self.waiting[lane.connection_id] = lane
            self.waiting.move_to_end(lane.connection_id, last=False)
        return Settled(told, large, freed)


@dataclass(frozen=True)
class Refusal:
    """What to send after the store refused entries as invalid (:func:`refusal`)."""

    again: tuple[list[Entry], ...]  # to send, in this order
    malformed: Entry | None = None  # the one item refused: its skip marker is in ``again``
    dropped: Entry | None = None  # a skip marker refused: nothing is left to stand in for it


def refusal(refused: Sequence[Entry]) -> Refusal:
    """A batch the store refuses as invalid is split in halves until the item is found;
    that item is stored as a ``store_refused`` skip marker instead, and a marker refused
    too is dropped."""
    if len(refused) > 1:
        half = len(refused) // 2
        return Refusal((list(refused[:half]), list(refused[half:])))
    ((connection_id, fence_token, frame),) = refused
    if frame.is_marker:
        return Refusal((), dropped=refused[0])
    return Refusal(([(connection_id, fence_token, frame.as_marker(Problem.STORE_REFUSED))],), malformed=refused[0])
