"""A connection's checkpoint as a value that only moves forward. No I/O.

The checkpoint (``last_seq`` in the connection item) is the highest seq durably stored
with no gap below it: every seq up to it is in the messages, as data or as a skip marker,
so the next owner resumes right after it. Stored data stays stored, so within one
ownership the checkpoint never goes back; :meth:`Checkpoint.advanced` is the one place
that rule is kept in the worker (the store's conditional write keeps it for the table).

The checkpoint write also carries what it covers, for GET: :class:`Tally` (frames,
bytes, the newest frame's time), added by the write that moves the checkpoint over it,
once (:class:`Uncounted`).
"""

from __future__ import annotations

from dataclasses import dataclass


class Checkpoint(int):
    """The highest seq stored gap-free. An ``int`` (it is written as ``last_seq``, logged
    and compared as the seq it is); what it adds is that it only moves forward, through
    :meth:`advanced`.

    A lower seq is ignored, not refused: what it reports (stored up to there) is already
    covered, so it is stale, never wrong, and raising would fail the frame path that made
    the report (the writer's stored callback) for no loss. Nothing is lost either way;
    only a checkpoint written backwards would lose something, and that is the store's
    condition to refuse."""

    __slots__ = ()

    def __new__(cls, seq: int = 0) -> Checkpoint:
        if seq < 0:
            raise ValueError(f"a checkpoint is a seq, 0 or more: {seq}")
        return super().__new__(cls, seq)

    def advanced(self, seq: int) -> Checkpoint:
        """The checkpoint once everything up to ``seq`` is stored gap-free: ``seq`` if it
        is higher, else this one unchanged."""
        return Checkpoint(seq) if seq > self else self


@dataclass(frozen=True)
class Tally:
    """What a connection stored, for GET: data frames (skip markers are counted apart, as
    ``skipped``), the bytes of their data as stored (compact JSON, UTF-8; an object's
    ``data_bytes``), and the received time of the newest one (epoch ms, 0 for none)."""

    frames: int = 0
    bytes: int = 0
    last_frame_at_ms: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.frames + other.frames, self.bytes + other.bytes, max(self.last_frame_at_ms, other.last_frame_at_ms)
        )

    def __bool__(self) -> bool:
        return self.frames > 0


@dataclass(frozen=True)
class Uncounted:
    """What a connection stored that no checkpoint write has counted yet: per stored batch,
    (the last seq it stands for, its :class:`Tally`), in seq order, and ``base``, the
    stored checkpoint they are thought to lie past.

    The rule that keeps the item's counts exact: a checkpoint write moving ``last_seq``
    from ``q`` to ``s`` adds exactly the batches in (q, s] (:meth:`past`), conditional on
    the stored checkpoint still being ``q``. A write that landed with its answer lost
    finds ``s`` stored when it goes again, and the batches past ``s``: none; a checkpoint
    another owner moved meanwhile is read from the failed condition and the write goes
    again against it (:meth:`ConnectionsStore.checkpoint_many`)."""

    base: int = 0
    pieces: tuple[tuple[int, Tally], ...] = ()

    def past(self, seq: int, upto: int | None = None) -> Tally:
        """The batches whose last seq lies past ``seq`` (and at most ``upto``)."""
        total = Tally()
        for end, tally in self.pieces:
            if end > seq and (upto is None or end <= upto):
                total += tally
        return total


class StoredEnd(int):
    """Where what is stored gap-free past a checkpoint ends (a seq, as a sink's
    ``stored_end`` returns it), with what its items add to the counts, per item (its last
    seq, its :class:`Tally`): stored by an owner that died before a checkpoint covered
    them, they are counted by the next owner's first checkpoint, once (:class:`Uncounted`)."""

    pieces: tuple[tuple[int, Tally], ...]

    def __new__(cls, end: int, pieces: tuple[tuple[int, Tally], ...] = ()) -> StoredEnd:
        value = super().__new__(cls, end)
        value.pieces = pieces
        return value
