"""What may be attached to this worker's session without a runner holding it, and
taking the session out of the watch ring only once nothing is.

Every STARTED connection must stay reachable: free (``FREE#``), attached to a LIVE
session, or attached to an ENDED session that is still in the ring, where its watchers
drain it. A session may leave the ring only when nothing is attached to it. Its own
worker cannot learn that from the owner index alone (eventually consistent), and a
connection can be attached with no runner knowing: an acquisition cancelled by SIGTERM
while its request was in flight, one whose answer was lost, a release that gave up at
the deadline. So the worker keeps, per session, the connections it has tried to
acquire and not yet seen leave (:class:`Attachments`). At a clean exit it ends its
session first (an acquisition conditional on the session being LIVE can no longer land),
then reads each of those (and what others moved to it and it never picked up: its
inbox of assignments) consistently, frees what is still attached (and hints it), and
only then leaves the ring. Whatever it cannot settle in its budget stays in the ring, for
its watchers to drain.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from .. import schema
from ..logs import JsonLogger
from ..store import ConnectionsStore, SessionsStore
from .hints import Hints

Call = Callable[..., Awaitable[Any]]


class Attachments:
    def __init__(
        self,
        *,
        connections: ConnectionsStore,
        sessions: SessionsStore,
        call: Call,
        hints: Hints,
        log: JsonLogger,
    ) -> None:
        self.session_id = ""
        self._maybe: set[str] = set()
        self._connections = connections
        self._sessions = sessions
        self._call = call
        self._hints = hints
        self._log = log

    def reset(self, session_id: str) -> None:
        """A new session: nothing can be attached to it yet."""
        self.session_id = session_id
        self._maybe.clear()

    def trying(self, connection_id: str) -> None:
        """An acquisition for the current session is about to be sent."""
        self._maybe.add(connection_id)

    def settled(self, connection_id: str) -> None:
        """Known not to be attached to the current session: released, freed, taken by
        another, or refused by the one and only acquire request sent for it."""
        self._maybe.discard(connection_id)

    def detached(self, connection_id: str, session_id: str) -> None:
        """Known no longer attached to ``session_id``: settled, if that is the current one."""
        if session_id == self.session_id:
            self._maybe.discard(connection_id)

    def maybe_attached(self, connection_id: str) -> bool:
        """Tried for the current session and not seen leave: checked at a clean exit."""
        return connection_id in self._maybe

    async def leave_ring_when_clear(
        self, session_id: str, *, held: Callable[[str], bool], handed: Callable[[str], bool] = lambda _: False
    ) -> bool:
        """After our own session ``session_id`` ENDED: :meth:`free_unheld`, and leave the
        ring if nothing is left attached. Returns True if it left the ring. Raises what the
        store raises (the caller bounds it by its budget); the session then stays in the
        ring, which is always safe."""
        left, handing, freed, checked = await self.free_unheld(session_id, held=held, handed=handed)
        if left:
            self._log.warning("session_left_in_ring", session_id=session_id, attached=len(left), handed=len(handing))
            return False
        if handing:
            # The usual end of a SIGTERM: the last handoffs' takers are still on their way.
            self._log.info("session_left_in_ring_for_its_handoffs", session_id=session_id, handed=len(handing))
            return False
        gone = await self._call(self._sessions.leave_ring, session_id)
        self._log.info("session_left_ring", session_id=session_id, checked=checked, freed=freed, left_ring=gone)
        return gone

    async def free_unheld(
        self, session_id: str, *, held: Callable[[str], bool], handed: Callable[[str], bool] = lambda _: False
    ) -> tuple[list[str], list[str], int, int]:
        """Free (and hint) whatever is attached to our session ``session_id`` with no runner
        of ours (``held``) and not handed off to a peer that has yet to take it (``handed``:
        its hint's taker, else the session's watchers, take it). Returns (held, handed,
        freed, checked). Each free is conditional on the connection still being attached to
        the session, so it is safe while it is LIVE too (a leaving worker's first step) as
        after it ENDED (then on its behalf, as any drainer's: nobody else can hold those)."""
        candidates = set(self._maybe) if session_id == self.session_id else set()
        # What others moved to us and we never picked up (we stopped picking up at
        # SIGTERM): attached to us, listed in the inbox of the session item, read now
        # that it is ENDED (no move can add to it any more).
        session = await self._call(self._sessions.get, session_id)
        candidates |= {schema.parse_stop_entry(e)[0] for e in (session or {}).get(schema.ASSIGNED) or ()}
        candidates = sorted(candidates)
        items = await self._call(self._connections.get_many, candidates) if candidates else {}
        attached = [c for c, item in items.items() if item is not None and item.get(schema.LEASE_SESSION) == session_id]
        # The owner index too: a connection attached by a path this worker did not
        # track would show there (eventually).
        indexed = {row.connection_id for row in await self._call(self._connections.owned_by, session_id)}
        left: list[str] = []
        handing: list[str] = []
        freed = 0
        for connection_id in sorted(set(attached) | indexed):
            if held(connection_id):
                left.append(connection_id)  # its socket may still be open: the watchers take it after
                continue
            if handed(connection_id):
                handing.append(connection_id)
                continue
            if await self._call(self._connections.free_orphan, connection_id, dead_session=session_id):
                freed += 1
                await self._hints.hint(connection_id)
        return left, handing, freed, len(candidates)
