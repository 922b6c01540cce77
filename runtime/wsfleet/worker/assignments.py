"""Picking up what other workers moved to this worker's session.

A move (:mod:`.moves`) attaches a connection to our session and posts it to our inbox of
assignments in one write; each renewal brings back the assignments not yet acted on
(:class:`~.session.SessionKeeper`), as it does the STOPs. The connection is ours already:
its acquire reads it as ours and writes nothing (a retry's rule), then holds it like any
other. Its mover closed its socket before the move (no two sockets), and the move's
fence refuses the mover's late writes.

What can go wrong, and who repairs it:

* no room here (we filled up since the mover read our load): the connection is freed
  (conditional on it still being attached to our session) and hinted for anyone;
* the pickup's acquire fails or its answer is lost: the connection is still attached to
  us, and the audit (:meth:`.acquisition.Acquisition.audit_once`) adopts it;
* we shut down or die before picking it up: it is attached to our session, which ends;
  a leaving worker frees it (:meth:`.attached.Attachments.leave_ring_when_clear` reads
  the inbox), a dead one's watchers drain it like any of its connections;
* a STOP for it: the router posts it to our inbox; one that comes with the assignment
  waits for the pickup (assignments are acted on first), one after it finds it held.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .. import clock, schema
from ..leases import INBOX_IDLE_POLL_S, INBOX_POLL_S
from ..logs import JsonLogger
from ..store import ConnectionsStore, SessionsStore
from .acquisition import Acquisition
from .attached import Attachments
from .hints import Hints
from .holdings import Holdings
from .session import SessionKeeper

Call = Callable[..., Awaitable[Any]]

# While moves are likely on their way to us (under our target by the summary; a watched
# session looked dead or came due to end; the summary lists a dead one still holding
# connections, not a graceful leaver's nor a suspect's; or we picked one up lately) the
# session item is read this often between renewals (a strongly consistent GetItem, 1 read
# unit); otherwise once IDLE_POLL_S has passed since it was last seen (a renewal's answer
# or a read): a drain names survivors by load, whose summaries may not show it coming.
POLL_S = INBOX_POLL_S
IDLE_POLL_S = INBOX_IDLE_POLL_S
EXPECT_AFTER_PICKUP_S = 4.0  # moves come in bursts: keep reading this long after one
# ... and this long after a watched session looked dead or came due to end (its end, a race
# lost to another watcher, and the drain's moves take a few seconds)
EXPECT_AFTER_SUSPECT_S = 6.0


class Assignments:
    def __init__(
        self,
        *,
        acquisition: Acquisition,
        holdings: Holdings,
        keeper: SessionKeeper,
        connections: ConnectionsStore,
        sessions: SessionsStore,
        attachments: Attachments,
        hints: Hints,
        call: Call,
        log: JsonLogger,
        suspect_at: Callable[[], float] = lambda: float("-inf"),
    ) -> None:
        """``suspect_at``: clock.now() when a session we watch last looked dead (the
        takeover's ``suspect_at``)."""
        self.picked_up = 0
        self._suspect_at = suspect_at
        self._acquisition = acquisition
        self._holdings = holdings
        self._keeper = keeper
        self._connections = connections
        self._sessions = sessions
        self._picked_at = float("-inf")  # clock.now() of our last pickup
        self._read_at = float("-inf")  # clock.now() of our last read of the session item
        self._attachments = attachments
        self._hints = hints
        self._call = call
        self._log = log
        self._tasks: set[asyncio.Task] = set()

    def on_assigned(self, entries: set[str]) -> set[str]:
        """Pick up the inbox's assignments (entries of one connection and fence each);
        returns those acted on. While the worker shuts down none is: they stay in the
        inbox, where the leaving worker's last step finds them (nothing picks them up)."""
        if not self._acquisition.accepting():
            return set()
        for entry in sorted(entries):
            connection_id, fence = schema.parse_stop_entry(entry)
            if not self._holdings.busy(connection_id):
                task = asyncio.create_task(self._pick_up(connection_id, fence), name=f"assigned:{connection_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return set(entries)

    def expecting(self) -> bool:
        """Whether moves are likely on their way to us (see :data:`POLL_S`)."""
        now = clock.now()
        if now - self._picked_at < EXPECT_AFTER_PICKUP_S or now - self._suspect_at() < EXPECT_AFTER_SUSPECT_S:
            return True
        standing = self._holdings.standing(self._keeper.session_id)
        fleet = standing.fleet
        # A dead session the summary lists holding connections (not a graceful leaver's: 0).
        return standing.under_target() or (fleet is not None and any(n > 0 for n in fleet.dead.values()))

    def due(self) -> bool:
        """Whether to read the session item now: every time while :meth:`expecting`,
        else once :data:`IDLE_POLL_S` has passed since it was last seen."""
        seen = max(self._read_at, self._keeper.read_at)
        return clock.now() - seen >= IDLE_POLL_S or self.expecting()

    async def poll_once(self) -> int:
        """Between renewals, when :meth:`due`: read our session item and pick up its
        assignments as a renewal would. Returns how many entries it found."""
        session_id = self._keeper.session_id
        if not self._keeper.live() or not self._acquisition.accepting() or not self.due():
            return 0
        self._read_at = clock.now()
        item = await self._call(self._sessions.get, session_id)
        if item is None or item.get(schema.SESSION_STATE) != schema.LIVE or self._keeper.session_id != session_id:
            return 0
        self._keeper.note_drain(item)
        entries = set(item.get(schema.ASSIGNED) or ())
        self._keeper.take_assigned(entries)
        return len(entries)

    async def _pick_up(self, connection_id: str, fence: int) -> None:
        session_id = self._keeper.session_id
        try:
            if self._holdings.free() <= 0:
                await self._give_back(connection_id, session_id)
                return
            self._picked_at = clock.now()
            runner = await self._acquisition.try_acquire(connection_id, source="assigned", expected_session=session_id)
            self.picked_up += runner is not None
            self._log.info("assignment_picked_up", connection_id=connection_id, fence_token=fence, held=runner is not None)
        except Exception as exc:  # noqa: BLE001 - still attached to us: the audit adopts it
            self._log.warning("assignment_pickup_failed", connection_id=connection_id, error=f"{type(exc).__name__}: {exc}")

    async def _give_back(self, connection_id: str, session_id: str) -> None:
        """No room here: free it (conditional on it still being attached to our session;
        nobody holds a socket for it) and hint it for anyone."""
        self._attachments.trying(connection_id)  # attached to us until the free lands
        if await self._call(self._connections.free_orphan, connection_id, dead_session=session_id):
            self._attachments.settled(connection_id)
            await self._hints.hint(connection_id)
        self._log.info("assignment_given_back", connection_id=connection_id)
