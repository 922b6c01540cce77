"""An assigned-seq feed's numbers for one ownership (upstream ``seq: assigned``): where
they start, and the seqs reserved before any is used.

The upstream sends no seq and cannot replay, so the worker numbers the frames it
accepts: the stored end + 1, + 2, ... A new owner after a crash cannot know exactly
where its predecessor's numbers ended (a write of a frozen former owner may still land
late), so an owner numbers only up to what it reserved in the connection item first
(``seq_reserved``, :meth:`~wsfleet.store.ConnectionsStore.reserve_seqs`, conditional on
its session and fence, a block of ``RESERVE_BLOCK`` seqs per write), and a new owner
after a crash starts after that reservation: no seq ever holds two frames. The cost: one
conditional write per block, and after a crash the unused rest of the block is a jump in
the seqs just before the new owner's ``reconnect`` marker. After a clean release (every
write landed before it) the new owner starts right after the checkpoint.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from ..checkpoint import Checkpoint
from .retry import LeaseExpired

RESERVE_BLOCK = 100  # seqs reserved per write: 1 % more writes than frames, a jump of at most this after a crash


def start(*, assigned: bool, checkpoint: int, stored_end: int, reserved: int) -> Checkpoint:
    """Where an ownership resumes, or starts numbering: after what is stored gap-free
    (the checkpoint, or the stored end found past it); for an assigned-seq feed taken
    from a crashed owner, after its reservation too (``reserved``: 0 after a clean
    release, when the checkpoint is exact)."""
    end = Checkpoint(checkpoint).advanced(stored_end)
    return end.advanced(reserved) if assigned else end


class Reservation:
    """The seqs this ownership reserved; ``write(upto=...)`` reserves up to ``upto``
    (True when written, False when the connection is no longer ours; it raises
    :class:`LeaseExpired` once the deadline has passed)."""

    def __init__(self, reserved: int, write: Callable[..., Awaitable[bool]], *, block: int = RESERVE_BLOCK) -> None:
        self.reserved = reserved
        self._write = write
        self._block = block

    async def cover(self, seq: int) -> str | None:
        """None once seqs up to ``seq`` are reserved (a block written first if they are
        not yet), so frames up to it may be queued; else why the connection ends
        (``"lost"`` or ``"expired"``, an EndReason's value), and nothing may be queued."""
        if seq <= self.reserved:
            return None
        upto = seq + self._block - 1
        try:
            if not await self._write(upto=upto):
                return "lost"
        except LeaseExpired:
            return "expired"
        self.reserved = upto
        return None
