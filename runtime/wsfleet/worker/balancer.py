"""Balancing: knowing the fleet's load and shedding what is above this worker's share.

* **Summary.** The last session of the watch ring (see :func:`wsfleet.balance.is_summarizer`)
  reads the ring about every watch pause: Query pages of the ``by_ring`` index, which
  projects every session's state and load, a bounded number a pass; once it has read a
  whole ring it writes the fleet summary item, only when its figures changed (or every
  ``SUMMARY_REFRESH_MS``). O(workers) for that one worker, in pages of 40 sessions a read
  unit. Every worker reads the summary with its watch reads (:class:`~.takeover.Takeover`
  fetches it every few passes), so each knows its exact target without reading every
  session.
* **Shedding.** A worker above its share by more than the tolerance sheds the excess
  through the graceful handoff (close, flush, release with checkpoint), a few per pass,
  then moves each to the session it is meant for, from the summary's list of sessions
  under their share, in one conditional write that session picks up (:mod:`.moves`);
  one meant for nobody in particular is hinted for workers under their share
  (:func:`wsfleet.balance.declines_shed_hint`), and the shedder's own free scan skips it
  for a while.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .. import clock, schema
from ..balance import IN_TRANSIT_S, SETTLE_S, FleetLoad, is_summarizer, max_moves, pass_room, summarize
from ..leases import SessionTiming
from ..logs import JsonLogger
from ..store import SessionsStore, now_ms
from ..store.sessions import RING_PAGE_LIMIT
from .decide import choose_shed
from .holdings import Holdings
from .session import SessionKeeper
from .summary import FleetSummary
from .takeover import Takeover

MIN_HOLD_S = 60.0  # a connection held for less than this is never moved: none moves twice
SHED_BURST = schema.ASSIGNED_MAX // 3  # sheds at once, then the rest a heartbeat apart
# An unchanged summary is written again this often, so that its age tells readers its
# writer is alive: well under SUMMARY_MAX_AGE_MS, less the readers' ~16 s between reads.
SUMMARY_REFRESH_MS = 30_000
SUMMARY_PAGES = 2  # ring Queries per summarizer pass at most
SUMMARY_PAGE_ITEMS = RING_PAGE_LIMIT  # sessions per Query: 14k workers are read in 4 passes

Call = Callable[..., Awaitable[Any]]


class Balancer:
    def __init__(
        self,
        *,
        sessions: SessionsStore,
        keeper: SessionKeeper,
        timing: SessionTiming,
        enabled: bool,
        tolerance: float,
        call: Call,
        log: JsonLogger,
        holdings: Holdings,
        summary: FleetSummary,
        takeover: Takeover,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        """``takeover``: its ring reads say whether we summarize (its successors) and what
        our watched sessions look like; ``summary``: where the summary we make goes."""
        # ENDED sessions still in the ring as the summary read them, and those of its watched
        # ones past expiry and skew (an unwatched crashed one counts once its watchers end it)
        self.dead_sessions: list[str] = []
        self.shed = 0
        self._sessions = sessions
        self._keeper = keeper
        self._timing = timing
        self._enabled = enabled
        self._tolerance = tolerance
        self._call = call
        self._log = log
        self._holdings = holdings
        self._summary = summary
        self._takeover = takeover
        self._clock_ms = clock_ms
        self._counts: list[tuple[int, int]] = []  # (ms, connections counted) of the recent summaries
        self._read: list[dict] = []  # the ring read so far, when it takes several passes
        self._cursor: dict | None = None  # where the next page starts
        self._written: dict | None = None  # the figures last written, and when
        self._written_at_ms = 0
        self._settle_until = 0.0  # a rebalance under way until then (clock.now()): see SETTLE_S

    async def summarize_once(self) -> FleetLoad | None:
        """If this is the last session of the ring, read the next page(s) of the ring
        (at most ``SUMMARY_PAGES`` Queries of ``SUMMARY_PAGE_ITEMS`` sessions a pass: the
        work per pass is bounded at any fleet size, and a read that fails is retried
        from where it stopped at the next pass); once a whole ring has been read, make
        the summary and write it if its figures changed or the one written is
        ``SUMMARY_REFRESH_MS`` old (so that readers can tell a stale one). Returns the
        summary made this pass, or None."""
        me = self._keeper.session_id
        if not self._keeper.live() or not is_summarizer(me, self._takeover.successors()):
            self._read, self._cursor = [], None
            return None
        for _ in range(SUMMARY_PAGES):
            page, self._cursor = await self._call(self._sessions.ring_page, self._cursor, limit=SUMMARY_PAGE_ITEMS)
            self._read.extend(page)
            if self._cursor is None:
                break
        if self._cursor is not None:
            return None  # the rest of the ring at the next pass
        items, self._read = self._read, []
        now = self._clock_ms()
        watched = self._takeover.watched
        counted = sum(int(i.get(schema.ACTIVE, 0)) for i in items if i.get(schema.SESSION_STATE) == schema.LIVE)
        def recent(counts: list[tuple[int, int]]) -> list[tuple[int, int]]:
            return [(at, n) for at, n in counts if now - at < IN_TRANSIT_S * 1000]
        self._counts = (recent(self._counts) or recent(await self._inherited())) + [(now, counted)]
        fleet = summarize(
            items, now_ms=now, timing=self._timing, watched=watched, active_at_least=max(n for _, n in self._counts)
        )
        endable = self._timing.endable_below_ms(now)
        self.dead_sessions = [
            i[schema.SESSION_ID]
            for i in items
            if i.get(schema.SESSION_STATE) == schema.ENDED
            or (i[schema.SESSION_ID] in watched and watched[i[schema.SESSION_ID]].expires_at_ms < endable)
        ]
        self._summary.known(fleet)  # its own balance pass follows: it does not read the item it writes
        if fleet.figures() != self._written or now - self._written_at_ms >= SUMMARY_REFRESH_MS:
            await self._call(self._sessions.put_summary, fleet.as_item())
            self._written, self._written_at_ms = fleet.figures(), now
        return fleet

    async def _inherited(self) -> list[tuple[int, int]]:
        """The count of the summary we take over from (a read as the role changes hands): a join's
        newcomer, the ring's new last one, first reads a ring whose moves are in transit to it."""
        prior = map(FleetLoad.from_item, await self._call(self._sessions.get_many, [schema.FLEET_SUMMARY_ID]))
        return [(p.at_ms, p.active) for p in prior]

    async def balance_once(self) -> int:
        """Shed what is above this worker's fair share (:func:`.decide.choose_shed`),
        oldest held first. Returns how many it asked to shed."""
        fleet = self._summary.fresh()
        if not self._enabled or fleet is None or not self._keeper.live():
            return 0
        me, max_connections, now = self._keeper.session_id, self._holdings.max_connections, clock.now()
        if fleet.max_deficit > 1:
            self._settle_until = now + SETTLE_S
        moves = choose_shed(
            self._holdings.held(),
            fleet=fleet,
            me=me,
            max_connections=max_connections,
            tolerance=self._tolerance,
            max_moves=max_moves(max_connections),
            recovering=self._takeover.recovering(),
            last_acquired_ms=self._holdings.last_acquired_ms,
            heartbeat_ms=self._timing.heartbeat_ms,
            now=now,
            min_hold_s=MIN_HOLD_S,
            settling=now < self._settle_until,
            room=pass_room(self._timing),
        )
        shed = 0
        for n, (connection_id, to) in enumerate(moves):
            if n and not n % SHED_BURST:  # a third of an inbox a renewal, from each shedder
                await asyncio.sleep(self._timing.heartbeat_ms / 1000)
            if self._keeper.live() and self._holdings.holds(connection_id) and not self._holdings.ending(connection_id):
                self._holdings.shed(connection_id)
                self._holdings.runners[connection_id].request_shed(to)
                shed += 1
        if shed:
            self.shed += shed
            self._log.info("rebalance_shed", count=shed, active=self._holdings.count(),
                           target=fleet.target(me, max_connections), fleet_active=fleet.active, workers=fleet.workers)
        return shed
