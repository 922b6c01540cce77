"""A connection's checkpoint as a value that only moves forward. No I/O.

The checkpoint (``last_seq`` in the connection item) is the highest seq durably stored
with no gap below it: every seq up to it is in the messages, as data or as a skip marker,
so the next owner resumes right after it. Stored data stays stored, so within one
ownership the checkpoint never goes back; :meth:`Checkpoint.advanced` is the one place
that rule is kept in the worker (the store's conditional write keeps it for the table).
"""

from __future__ import annotations


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
