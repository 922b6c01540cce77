"""The crash-loop breaker's writes on a connection item: a strike against the prime
suspect of a dead session, and setting a quarantined connection aside (out of every
partition a taker reads). A part of :class:`~wsfleet.store.ConnectionsStore`, kept apart
so that the table's ownership writes stay one room. The rules are
:mod:`wsfleet.crash_loop`'s; a START clears what these write (:mod:`.desired`)."""

from __future__ import annotations

from typing import Any

from .. import schema
from ..crash_loop import Strike, Suspect, strike
from . import conditions as cond

STRIKE_ROUNDS = 4  # reads and writes of one strike whose item keeps changing in between

# Out of the owner index and attached to nobody: no free scan, hint or drain finds it.
_SET_ASIDE_SETS = ["#o = :empty", "#l = :empty", "#u = :now"]
_SET_ASIDE_REMOVES = ["#k", "#rf"]


class Quarantines:
    """``ConnectionsStore``'s strike and set-aside writes (it supplies the table helpers)."""

    _conditional_update: Any
    _now_ms: Any
    get: Any

    def strike(self, connection_id: str, suspect: Suspect, *, dead_session: str, quarantine_after: int) -> Strike | None:
        """Count the death of ``suspect``'s owner (the session ``dead_session``, ENDED by
        the caller) against the connection, by :func:`wsfleet.crash_loop.strike`, from a
        strongly consistent read. The strike that quarantines it also sets it aside when
        it is free or still attached to ``dead_session``; one held by another session
        keeps running there, and is set aside when that one lets it go or dies
        (:meth:`set_aside`).

        Conditional on: the item as read (:func:`~.conditions.strike_pinned`: STARTED,
        not quarantined, its session, fence and newest strike); on a failure it is read
        and judged again. Returns the strike written, or None when it counts none (see
        :func:`~wsfleet.crash_loop.strike`: a retry whose first write landed finds its
        own strike and counts nothing)."""
        for _ in range(STRIKE_ROUNDS):
            item = self.get(connection_id)
            now = self._now_ms()
            decided = strike(item, suspect, now_ms=now, quarantine_after=quarantine_after)
            if decided is None:
                return None
            assert item is not None
            holder = item.get(schema.LEASE_SESSION, "")
            sets, removes = ["#sk = :n", "#ss = :since", "#sf = :sf"], []
            values: dict[str, Any] = {
                ":n": decided.strikes,
                ":since": decided.since_ms,
                ":sf": decided.fence_token,
                ":started": schema.STARTED,
                ":holder": holder,
                ":fence": int(item.get(schema.FENCE_TOKEN, 0)),
            }
            if schema.STRIKE_FENCE in item:
                values[":last"] = int(item[schema.STRIKE_FENCE])
            if decided.quarantined is not None:
                sets.append("#qt = :q")
                values[":q"] = decided.quarantined
                if holder in ("", dead_session):  # set aside in the same write
                    sets += _SET_ASIDE_SETS
                    removes += _SET_ASIDE_REMOVES
                    values.update({":empty": "", ":now": now})
            update = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
            new, _ = self._conditional_update(
                connection_id, update=update, condition=cond.strike_pinned(item), values=values, returns="NONE"
            )
            if new is not None:
                return decided
        return None

    def set_aside(self, connection_id: str, *, holder: str) -> bool:
        """Take a quarantined connection out of every partition a taker reads: attached
        to nobody, out of the owner index. ``holder``: the session it is attached to as
        read ("" when free); never a LIVE one's that still holds it (that owner's socket
        runs until it lets it go).

        Conditional on: quarantined and attached to ``holder``
        (:data:`~.conditions.SET_ASIDE`). Returns False when a START cleared it, or it
        was set aside (or taken) by another first."""
        new, _ = self._conditional_update(
            connection_id,
            update=f"SET {', '.join(_SET_ASIDE_SETS)} REMOVE {', '.join(_SET_ASIDE_REMOVES)}",
            condition=cond.SET_ASIDE,
            values={":empty": "", ":now": self._now_ms(), ":holder": holder},
            returns="NONE",
        )
        return new is not None
