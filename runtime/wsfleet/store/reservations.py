"""An assigned-seq feed's reserved seqs: a connection item's ``seq_reserved``.

The owner of a feed whose seqs the worker assigns (upstream ``seq: assigned``) numbers
a frame only up to what it reserved here first, a block at a time. A new owner after a
crash numbers after the reservation, so the write of a frozen former owner that lands
late can only land at a seq no later owner ever uses: no seq holds two frames. A part of
:class:`~wsfleet.store.ConnectionsStore`, kept apart so that the table's ownership writes
stay one room."""

from __future__ import annotations

from typing import Any

from . import conditions as cond


class SeqReservations:
    """``ConnectionsStore``'s reservation write (it supplies ``_conditional_update``)."""

    _conditional_update: Any
    _now_ms: Any

    def reserve_seqs(self, connection_id: str, *, session_id: str, fence_token: int, upto: int) -> bool:
        """Set ``seq_reserved`` to ``upto``: this ownership may number frames up to it.
        Conditional on: ``lease_session`` and ``fence_token`` are ours, not handed off
        (:data:`~.conditions.HOLDING`). It may move the value back: an owner starts
        numbering after what a crashed owner reserved, or, after a clean release, after
        the checkpoint (every write of that owner landed before it), so what it reserves
        is never below a seq any write may still land at. Returns False if the connection
        is no longer ours; True when written (a retry of one that landed writes it again)."""
        new, old = self._conditional_update(
            connection_id,
            update="SET #sr = :upto",
            condition=cond.HOLDING,
            values={":upto": upto, ":session": session_id, ":fence": fence_token},
            returns="NONE",
        )
        return new is not None
