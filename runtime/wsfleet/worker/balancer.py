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
  through the graceful handoff (close, flush, release with checkpoint, hint naming itself
  and, from the summary's list of sessions under their share, the one it is meant for),
  a few per pass; the named worker takes it, others leave it to it for a moment (then
  to any worker under its share: :func:`wsfleet.balance.declines_shed_hint`), and the
  shedder's own free scan skips it for a while.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Mapping

from .. import clock, schema
from ..balance import IN_TRANSIT_S, FleetLoad, is_summarizer, max_moves, shed_count, shed_targets, summarize
from ..leases import SessionTiming, Watched
from ..logs import JsonLogger
from ..store import SessionsStore, now_ms
from ..store.sessions import RING_PAGE_LIMIT
from .session import SessionKeeper

MIN_HOLD_S = 60.0  # a connection held for less than this is never moved: none moves twice
SHED_COOLDOWN_S = 60.0  # the shedder's free scan leaves what it shed alone this long
SUMMARY_MAX_AGE_MS = 60_000  # an older summary is not acted on (its writer may be gone)
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
        max_connections: int,
        enabled: bool,
        tolerance: float,
        call: Call,
        log: JsonLogger,
        successors: Callable[[], list[str]],
        recovering: Callable[[], bool],
        runners: Callable[[], Mapping[str, Any]],
        last_acquired_ms: Callable[[], int] = lambda: 0,
        watched: Callable[[], Mapping[str, Watched]] = dict,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.fleet: FleetLoad | None = None
        # ENDED sessions still in the ring as the summary read them, and those of its watched
        # ones past expiry and skew (an unwatched crashed one counts once its watchers end it)
        self.dead_sessions: list[str] = []
        self.shed = 0
        self._sessions = sessions
        self._keeper = keeper
        self._timing = timing
        self._max = max_connections
        self._enabled = enabled
        self._tolerance = tolerance
        self._call = call
        self._log = log
        self._successors = successors
        self._recovering = recovering
        self._runners = runners
        self._last_acquired_ms = last_acquired_ms
        self._clock_ms = clock_ms
        self._watched = watched
        self._counts: list[tuple[int, int]] = []  # (ms, connections counted) of the recent summaries
        self._read: list[dict] = []  # the ring read so far, when it takes several passes
        self._cursor: dict | None = None  # where the next page starts
        self._written: dict | None = None  # the figures last written, and when
        self._written_at_ms = 0
        self._shed_at: dict[str, float] = {}
        self.summary_arrived = asyncio.Event()

    def on_summary(self, item: Mapping) -> None:
        """The summary item, as a watch read brought it: a balance pass follows at once
        (see ``Worker._balance_loop``), so a join is acted on as soon as each worker
        reads of it, not up to a pass later."""
        self.fleet = FleetLoad.from_item(item)
        self.summary_arrived.set()

    def fresh_fleet(self) -> FleetLoad | None:
        fleet = self.fleet
        if fleet is None or self._clock_ms() - fleet.at_ms > SUMMARY_MAX_AGE_MS:
            return None
        return fleet

    def shed_recently(self, connection_id: str) -> bool:
        at = self._shed_at.get(connection_id)
        return at is not None and clock.now() - at < SHED_COOLDOWN_S

    async def summarize_once(self) -> FleetLoad | None:
        """If this is the last session of the ring, read the next page(s) of the ring
        (at most ``SUMMARY_PAGES`` Queries of ``SUMMARY_PAGE_ITEMS`` sessions a pass: the
        work per pass is bounded at any fleet size, and a read that fails is retried
        from where it stopped at the next pass); once a whole ring has been read, make
        the summary and write it if its figures changed or the one written is
        ``SUMMARY_REFRESH_MS`` old (so that readers can tell a stale one). Returns the
        summary made this pass, or None."""
        me = self._keeper.session_id
        if not self._keeper.live() or not is_summarizer(me, self._successors()):
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
        watched = self._watched()
        counted = sum(int(i.get(schema.ACTIVE, 0)) for i in items if i.get(schema.SESSION_STATE) == schema.LIVE)
        self._counts = [(at, n) for at, n in self._counts if now - at < IN_TRANSIT_S * 1000] + [(now, counted)]
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
        self.fleet = fleet
        self.summary_arrived.set()  # its own balance pass: it does not read the item it writes
        if fleet.figures() != self._written or now - self._written_at_ms >= SUMMARY_REFRESH_MS:
            await self._call(self._sessions.put_summary, fleet.as_item())
            self._written, self._written_at_ms = fleet.figures(), now
        return fleet

    async def balance_once(self) -> int:
        """Shed what is above this worker's fair share (see :func:`shed_count`), oldest
        held first. Returns how many it asked to shed."""
        fleet = self.fresh_fleet()
        if not self._enabled or fleet is None or not self._keeper.live():
            return 0
        runners = self._runners()
        # A summary taken before our latest acquisition reached our session item (one
        # renewal later) undercounts the fleet: a fleet that is filling up would shed.
        if self._last_acquired_ms() + self._timing.heartbeat_ms >= fleet.at_ms or fleet.active < len(runners):
            return 0
        n = shed_count(
            active=len(runners),
            max_connections=self._max,
            fleet=fleet,
            tolerance=self._tolerance,
            max_moves=max_moves(self._max),
            recovering=self._recovering(),
            me=self._keeper.session_id,
        )
        now = clock.now()
        movable = sorted(
            (r for r in runners.values() if r.end_reason is None and now - r.acquired_mono >= MIN_HOLD_S),
            key=lambda r: r.acquired_mono,
        )[:n]
        for runner, to in zip(movable, shed_targets(fleet, self._keeper.session_id, len(movable)), strict=True):
            self._shed_at[runner.connection_id] = now
            runner.request_shed(to)
        self._shed_at = {c: t for c, t in self._shed_at.items() if now - t < SHED_COOLDOWN_S}
        if movable:
            self.shed += len(movable)
            self._log.info(
                "rebalance_shed",
                count=len(movable),
                active=len(runners),
                target=fleet.target(self._keeper.session_id, self._max),
                fleet_active=fleet.active,
                workers=fleet.workers,
            )
        return len(movable)
