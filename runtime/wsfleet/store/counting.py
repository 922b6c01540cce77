"""The counts a checkpoint carries (frames, bytes, last_frame_at_ms: a
:class:`~wsfleet.checkpoint.Tally`): the checkpoint entry, and the writes that add them,
each conditional on the stored checkpoint the counts were taken against
(:func:`~.conditions.counted_checkpoint`), so that no retry adds them twice. A part of
:class:`~wsfleet.store.ConnectionsStore`, kept apart as :mod:`.last_error` is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint import Tally, Uncounted
from . import conditions as cond


@dataclass(frozen=True)
class CheckpointEntry:
    """One connection's checkpoint, as :meth:`ConnectionsStore.checkpoint_many` writes it."""

    connection_id: str
    session_id: str
    fence_token: int
    last_seq: int
    # What the checkpoint covers that no write has counted yet: added to the item's counts
    # (frames, bytes, last_frame_at_ms) by the write that moves last_seq over it, once.
    uncounted: Uncounted = Uncounted()


class Counting:
    """``ConnectionsStore``'s counting checkpoint update (it supplies ``_transact_update``)."""

    _transact_update: Any

    def _checkpoint_update(self, e: CheckpointEntry, counted_from: int, now: int) -> dict:
        """One entry of :meth:`ConnectionsStore.checkpoint_many`: counting what lies in
        (``counted_from``, ``last_seq``] if anything, else a plain checkpoint."""
        values = {":seq": e.last_seq, ":now": now, ":session": e.session_id, ":fence": e.fence_token}
        counts = e.uncounted.past(counted_from, e.last_seq)
        if not counts:
            update, condition = "SET #q = :seq, #u = :now", cond.CHECKPOINT
        else:
            update = "SET #q = :seq, #u = :now, #lfa = :lfa ADD #nf :nf, #nb :nb"
            condition = cond.counted_checkpoint(counted_from)
            values.update(counted_values(counted_from, counts))
        return self._transact_update(e.connection_id, update=update, condition=condition, values=values, return_old=True)


def counted_values(counted_from: int, counts: Tally) -> dict:
    """The values of a counting write: the checkpoint counted against, what it adds."""
    return {":from": counted_from, ":nf": counts.frames, ":nb": counts.bytes, ":lfa": counts.last_frame_at_ms}
