"""The reachability sweep: every connection checked against the invariant, once for the
whole fleet.

The invariant (:func:`wsfleet.leases.unreachable`): every connection is free in a
``FREE#`` partition, free and STOPPED, or attached to a session in the watch ring. The
fleet keeps it by construction (acquisitions are conditional on the acquirer's session
being LIVE, a session leaves the ring only once nothing is attached to it); this sweep is
how production *sees* that it holds. The fleet's summarizer (the last session of the ring,
:func:`wsfleet.balance.is_summarizer`) pages through the connections table, a whole pass
every ``SWEEP_SECONDS`` at most: the table is scanned in parallel segments (Scan's
``Segment``/``TotalSegments``), each at most one page of ``SWEEP_PAGE_ITEMS`` a second, as
many segments as a pass needs to take at most half of ``SWEEP_SECONDS``
(:func:`sweep_segments`, from the connections the last pass scanned or the fleet summary
counts). A connection that looks unreachable is read again consistently, with its session, and only
if it still is: counted (``UnreachableConnections``, which has an alarm), logged, and
repaired. Repairs are conditional writes that any worker may make: a connection of an
ENDED (or deleted) session is freed for the fleet and hinted, as a drain does; a LIVE
session missing from the ring is put back in it; a free STARTED connection outside the
free pool is put back in it; one a LIVE session handed off too long ago
(:data:`~wsfleet.leases.HANDOFF_UNREACHABLE_MS`: its hint lost and its releaser's memory
of it too) is freed into the pool (conditional on its session, fence and release mark)
and hinted.

Cost: a Scan reads whole items (about 300 bytes each), so a pass costs about 0.04 read
units per connection; at one pass every 600 s, about 0.25 RRU per connection-hour. The
sessions a page names are read with it, except those read in the last
``SWEEP_SESSION_REUSE_S`` (a pass over 500,000 connections names every session many times: it
reads each a few times, not once a page). At 500,000 connections and the default 600 s: 9
segments, 1,800 connections a second, a pass of about 280 s; about 66 read units a second
for the Scan (1,800 x 300 bytes, eventually consistent) and each of 2,000 sessions again
every 30 s for the sessions (about 33 more; once a page, it would be about 900).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Mapping

from .. import clock
from .. import metrics_names as names
from .. import schema
from ..balance import is_summarizer
from ..leases import SWEEP_PAGE_ITEMS, SWEEP_SESSION_REUSE_S, Unreachable, sweep_segments, unreachable
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import ConnectionsStore, Released, SessionsStore, now_ms
from .hints import Hints
from .session import SessionKeeper
from .takeover import Takeover

Call = Callable[..., Awaitable[Any]]


class Sweeper:
    def __init__(
        self,
        *,
        connections: ConnectionsStore,
        sessions: SessionsStore,
        keeper: SessionKeeper,
        takeover: Takeover,
        call: Call,
        hints: Hints,
        counters: Counters,
        log: JsonLogger,
        sweep_s: float,
        page_items: int = SWEEP_PAGE_ITEMS,
        first_pass_s: float | None = None,
        connections_known: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = clock.now,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        """``takeover``: its ring reads say whether we sweep for the fleet (the summarizer
        does). ``first_pass_s``: when the first pass may start, from now (a whole ``sweep_s``
        by default: a fleet that restarts its workers does not sweep at every restart).
        ``connections_known``: how many connections the fleet summary counts, for the
        first pass's segments (later passes go by what the last one scanned)."""
        self.passes = 0
        self.found = 0
        self.segments = 1  # of the pass under way, or the last one
        self.scanned = 0  # connections the last whole pass read
        self._connections = connections
        self._sessions = sessions
        self._keeper = keeper
        self._takeover = takeover
        self._call = call
        self._hints = hints
        self._counters = counters
        self._log = log
        self._sweep_s = sweep_s
        self._page = page_items
        self._clock = clock
        self._clock_ms = clock_ms
        self._connections_known = connections_known
        self._sweeping = False
        # Each open segment of the pass under way: {segment: where its next page starts}
        self._cursors: dict[int, dict | None] = {}
        self._started = clock() if first_pass_s is None else clock() - sweep_s + first_pass_s
        self._scanned = 0
        self._found_in_pass = 0
        self._session_reads: dict[str, tuple[float, dict]] = {}  # session id: (read at, item)

    async def step(self) -> int:
        """If this worker sweeps for the fleet and a pass is under way or due: one page of
        each segment not done yet, read together. Returns how many unreachable
        connections it found (and repaired)."""
        if not self._keeper.live() or not is_summarizer(self._keeper.session_id, self._takeover.successors()):
            self._sweeping = False  # another worker sweeps now; a pass starts over here if it comes back
            return 0
        if not self._sweeping:
            if self._clock() - self._started < self._sweep_s:
                return 0
            known = max(self.scanned, self._connections_known())
            self.segments = sweep_segments(known, sweep_s=self._sweep_s, page_items=self._page)
            self._sweeping, self._started = True, self._clock()
            self._cursors = dict.fromkeys(range(self.segments))
            self._scanned = self._found_in_pass = 0
        # Every segment's page is waited for, even past a failure: a failed segment reads
        # its page again at the next step, and none is still in flight by then.
        results = await asyncio.gather(*(self._segment_page(segment) for segment in list(self._cursors)), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        found = sum(r for r in results if not isinstance(r, BaseException))
        self._found_in_pass += found
        if failed is not None:
            raise failed
        if not self._cursors:
            self._sweeping = False
            self.passes += 1
            self.scanned = self._scanned
            self._log.info(
                "sweep_done",
                scanned=self._scanned,
                segments=self.segments,
                unreachable=self._found_in_pass,
                took_s=round(self._clock() - self._started, 1),
            )
        return found

    async def _segment_page(self, segment: int) -> int:
        """The next page of one segment, checked; the segment is done after its last."""
        items, cursor = await self._call(
            self._connections.sweep_page, self._cursors[segment], limit=self._page, segment=segment, segments=self.segments
        )
        if cursor is None:
            del self._cursors[segment]
        else:
            self._cursors[segment] = cursor
        self._scanned += len(items)
        return await self.check(items)

    async def check(self, items: list[dict]) -> int:
        """Check connections as a page read them; confirm, count and repair the
        unreachable ones. Returns how many were."""
        sessions = await self._sessions_of(items)
        found = 0
        for item in items:
            if unreachable(item, sessions.get(item.get(schema.LEASE_SESSION, "")), now_ms=self._clock_ms()) is not None:
                found += await self._confirm_and_repair(schema.connection_id_from_pk(item[schema.PK]))
        return found

    async def _sessions_of(self, items: list[dict]) -> dict[str, dict]:
        """The sessions the page's connections are attached to: read, unless read in the
        last ``SWEEP_SESSION_REUSE_S`` (a session not found is read again each time)."""
        now = self._clock()
        self._session_reads = {sid: r for sid, r in self._session_reads.items() if now - r[0] < SWEEP_SESSION_REUSE_S}
        ids = sorted({i[schema.LEASE_SESSION] for i in items if i.get(schema.LEASE_SESSION)} - set(self._session_reads))
        for session in await self._call(self._sessions.get_many, ids) if ids else []:
            self._session_reads[session[schema.SESSION_ID]] = (now, session)
        return {sid: item for sid, (_, item) in self._session_reads.items()}

    async def _confirm_and_repair(self, connection_id: str) -> int:
        item = await self._call(self._connections.get, connection_id)
        if item is None:
            return 0
        session_id = item.get(schema.LEASE_SESSION, "")
        session = await self._call(self._sessions.get, session_id) if session_id else None
        why = unreachable(item, session, now_ms=self._clock_ms())
        if why is None:
            return 0  # the page was stale: it moved on meanwhile
        self.found += 1
        self._counters.add(names.UNREACHABLE_CONNECTIONS)
        repaired = await self._repair(connection_id, item, session, why)
        self._log.error(
            "unreachable_connection",
            connection_id=connection_id,
            why=why.value,
            session_id=session_id,
            session_state=(session or {}).get(schema.SESSION_STATE),
            desired_state=item.get(schema.DESIRED_STATE),
            repaired=repaired,
        )
        return 1

    async def _repair(self, connection_id: str, item: Mapping, session: Mapping | None, why: Unreachable) -> bool:
        if why is Unreachable.NOT_IN_FREE_POOL:
            return await self._call(self._connections.free_orphan, connection_id, dead_session="")
        session_id = item[schema.LEASE_SESSION]
        if why is Unreachable.HANDOFF_UNCLAIMED:
            fence = int(item[schema.FENCE_TOKEN])
            landed = await self._call(self._connections.free_released, connection_id, session_id=session_id, fence_token=fence)
            if landed is Released.FREE:
                await self._hints.hint(connection_id)
            return landed is not Released.LOST
        if session is not None and session.get(schema.SESSION_STATE) == schema.LIVE:
            return await self._call(self._sessions.rejoin_ring, session_id)  # its worker holds the socket
        freed = await self._call(self._connections.free_orphan, connection_id, dead_session=session_id)
        if freed and item.get(schema.DESIRED_STATE) == schema.STARTED:
            await self._hints.hint(connection_id)
        return freed

    def stats(self) -> dict[str, Any]:
        return {"passes": self.passes, "unreachable": self.found}
