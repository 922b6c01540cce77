"""Why an owner cannot connect: a connection item's ``last_error``, for GET.

Written by the owner only (conditional on its session and fence, like a checkpoint),
never with a secret in it; removed once a frame is accepted again. A part of
:class:`~wsfleet.store.ConnectionsStore`, kept apart so that the table's ownership
writes stay one room."""

from __future__ import annotations

from typing import Any

from ..validation import without_addresses
from . import conditions as cond


class LastErrors:
    """``ConnectionsStore``'s last_error writes (it supplies ``_conditional_update``)."""

    _conditional_update: Any
    _now_ms: Any

    def note_error(self, connection_id: str, *, session_id: str, fence_token: int, text: str) -> bool:
        """Record why its owner cannot connect (``last_error``, with no secret and no IP
        address in it: any address in ``text`` is written as ``<address>``; and
        ``last_error_at_ms``), for GET. Conditional on: ``lease_session`` and
        ``fence_token`` are ours (and not handed off), and ``last_error`` is not already ``text`` (the same
        error again is not written again: its time says when it began). Returns False if
        the connection is no longer ours (a lost race, not an exception); True when
        written, or already so (a retry of a write that landed)."""
        new, old = self._conditional_update(
            connection_id,
            update="SET #le = :text, #lt = :now",
            condition=cond.NEW_ERROR,
            values={
                ":text": without_addresses(text), ":now": self._now_ms(), ":session": session_id, ":fence": fence_token
            },
            returns="NONE",
        )
        return new is not None or cond.holds(old, session_id, fence_token)

    def clear_error(self, connection_id: str, *, session_id: str, fence_token: int) -> bool:
        """Remove ``last_error`` once a frame is accepted again. Conditional on:
        ``lease_session`` and ``fence_token`` are ours, and there is one to remove.
        Returns False if the connection is no longer ours; True when removed or already
        absent."""
        new, old = self._conditional_update(
            connection_id,
            update="REMOVE #le, #lt",
            condition=cond.STORED_ERROR,
            values={":session": session_id, ":fence": fence_token},
            returns="NONE",
        )
        return new is not None or cond.holds(old, session_id, fence_token)

