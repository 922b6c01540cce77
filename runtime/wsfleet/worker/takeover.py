"""Taking what is dead or free.

* **Watching.** Sessions sit in a ring (the sessions table's ``by_ring`` index, sorted by
  id). Each worker reads only its ``WATCH_K`` successors, about every
  ``SessionTiming.watch_pause_s`` (one BatchGetItem): watching costs O(workers) in all,
  never every worker reading every session. A LIVE one that missed a renewal gets its
  end scheduled for the moment it expires plus the skew margin, so a crash is taken
  over at about the lease. One that is ENDED or suspect makes the worker read one
  successor further in the same pass, and on past those that look dead too
  (:func:`wsfleet.leases.watch_reach`): a session whose watchers all died with it is
  seen by the next live one before them.
* **Ending and draining.** The end is a conditional write (LIVE and expired): one winner,
  and the session can never be renewed again. Then its connections, found with one
  ``by_owner`` query, are taken: this worker's fair-share deficit acquired here, each
  of the rest moved to a survivor under its target (one plan for the fleet, from the
  fleet summary the worker already holds, never a read of the ring; :mod:`.moves`),
  every write conditional on that session. A drained session
  leaves the ring. A drainer that dies halfway leaves the ENDED session in the ring,
  where its watchers find it and drain it again.
* **Free scan.** STARTED connections that nobody owns (a lost hint) are found by
  querying the ``FREE#<shard>`` partitions every ``RECONCILE_SECONDS`` (jittered), each
  scan from a random shard and a random point in it, round to where it began, so that
  the fleet's scanners do not all race for the same first entries; the pause doubles
  after every scan in a row that found nothing, up to
  :data:`~wsfleet.leases.RECONCILE_BACKOFF_CAP` times, and is back to one as soon as a
  scan finds something or a hint says there is work (:meth:`Takeover.note_work`).
  Worst case for a lost hint, while the free entries fit in a scanner's room: found by
  every worker with room within ``RECONCILE_BACKOFF_CAP x RECONCILE_SECONDS`` plus one
  scan.
"""

from __future__ import annotations

import asyncio
import random
from itertools import islice
from typing import Any, Awaitable, Callable, Iterable

from .. import clock, schema, tracing
from .. import metrics_names as names
from ..balance import SUMMARY_EVERY, drain_share, drain_targets, is_summarizer
from ..crash_loop import Suspect
from ..leases import EndFailure, SessionTiming, Watched, takeover_jitter_s, watch_plan, watch_reach
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import ConnectionsStore, SessionsStore, TransientError, now_ms
from .acquisition import Acquisition
from .decide import DrainSplit, fresh_hints, split_drain
from .hints import Hints
from .holdings import Holdings
from .moves import Mover
from .session import SessionKeeper
from .summary import FleetSummary

WATCH_K = 2  # successors each worker watches: a death is seen while either predecessor lives
# The ring changes only when workers come and go. A newcomer announces itself to its
# watchers (they re-read at once); this periodic read is the backstop.
RING_REFRESH_S = 15.0
EMPTY_DRAINS_TO_LEAVE = 2  # the owner index is eventually consistent: see it empty twice
STRIKE_TRIES = 3  # a strike's tries through transient faults, before the drain goes on without it
SCAN_POINTS = 64  # connection ids kept from the free scans, to start the next ones at

Call = Callable[..., Awaitable[Any]]


class Takeover:
    def __init__(
        self,
        *,
        sessions: SessionsStore,
        connections: ConnectionsStore,
        keeper: SessionKeeper,
        timing: SessionTiming,
        state_shards: int,
        call: Call,
        log: JsonLogger,
        acquisition: Acquisition,
        hints: Hints,
        mover: Mover,
        holdings: Holdings,
        summary: FleetSummary,
        counters: Counters,
        quarantine_after: int,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        """``quarantine_after``: the consecutive strikes that quarantine a connection
        (:mod:`wsfleet.crash_loop`); each dead session this worker ends strikes its suspect."""
        self.watched: dict[str, Watched] = {}
        self._end_traces: dict[str, object] = {}  # ENDED watched sessions' end_trace, as read
        self.sessions_ended = 0
        self._sessions = sessions
        self._connections = connections
        self._keeper = keeper
        self._timing = timing
        self._shards = state_shards
        self._call = call
        self._log = log
        self._acquisition = acquisition
        self._hints = hints
        self._mover = mover
        self._holdings = holdings
        self._summary = summary
        self._counters = counters
        self._quarantine_after = quarantine_after
        # which of every SUMMARY_EVERY passes reads the summary: drawn, so that workers
        # started together (a fleet started at once, a deploy's round) do not all read it,
        # and so act on it, in the same pass
        self._passes = random.randrange(SUMMARY_EVERY)
        self._clock_ms = clock_ms
        self._ring: list[str] = []
        self._reach = WATCH_K  # successors read: more while some of them look dead (watch_reach)
        self._ring_for = ""
        self._ring_at = float("-inf")
        self._ring_changes = 0
        self._ending: dict[str, asyncio.TimerHandle] = {}
        self._draining: set[str] = set()
        self.suspect_at = float("-inf")  # clock.now() when a watched session last looked dead (its end planned) or came due
        self._empty: dict[str, int] = {}
        self._hinted: dict[str, float] = {}  # a dead session's connections hinted here, when (fresh_hints)
        self._tasks: set[asyncio.Task] = set()
        self._free_seen: set[str] = set()  # FREE# at the previous count_unowned
        # Free scans in a row that found nothing (the pause doubles with each); and set
        # when a hint says there is work, to cut a long pause short.
        self.idle_scans = 0
        self.work_noted = asyncio.Event()
        self._scan_points: list[str] = []

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._report)

    def _report(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self._log.warning("takeover_step_failed", task=task.get_name(), error=f"{type(exc).__name__}: {exc}")

    def cancel(self) -> None:
        for handle in self._ending.values():
            handle.cancel()
        self._ending.clear()
        for task in self._tasks:
            task.cancel()

    # --- watching --------------------------------------------------------------------

    def successors(self) -> list[str] | None:
        """The sessions this one watches, from its last ring read; None before the
        first read for its session."""
        return list(self._ring) if self._ring_for == self._keeper.session_id else None

    def recovering(self) -> bool:
        """A watched session is ENDED or expired: a takeover is under way. (One that only
        looks late on a renewal is not: on a busy machine that is common, and it must not
        hold rebalancing back.)"""
        now = self._clock_ms()
        return any(w.state == schema.ENDED or w.expires_at_ms < now for w in self.watched.values())

    async def watch_once(self) -> int:
        """Read the watched sessions; schedule the end of suspect ones at their expiry and
        drain ENDED ones. Returns how many sessions it read."""
        me = self._keeper.session_id
        if not self._keeper.live():
            return 0
        changes = self._keeper.ring_changes
        if self._ring_for != me or changes != self._ring_changes or clock.now() - self._ring_at > RING_REFRESH_S:
            await self._read_ring(me, changes)
        self._passes += 1
        # The summarizer has the summary it writes: only the others read it.
        summary = self._passes % SUMMARY_EVERY == 1 and not is_summarizer(me, self._ring)
        items = await self._call(self._sessions.get_many, [*self._ring, *([schema.FLEET_SUMMARY_ID] if summary else [])])
        for item in items:
            if item[schema.SESSION_ID] == schema.FLEET_SUMMARY_ID:
                self._summary.on_item(item)
        items = [i for i in items if i[schema.SESSION_ID] != schema.FLEET_SUMMARY_ID]
        reach = watch_reach(map(_watched, items), k=WATCH_K, now_ms=self._clock_ms(), timing=self._timing)
        if reach < self._reach:
            self._reach = reach  # the ring's next read is the shorter one
        while reach > self._reach and len(self._ring) >= self._reach:
            # some look dead: read past them now, not at the next pass (a pause later),
            # and on past those that look dead too
            self._reach = reach
            read = set(self._ring)
            await self._read_ring(me, changes)
            further = [sid for sid in self._ring if sid not in read]
            if not further:
                break
            items += await self._call(self._sessions.get_many, further)
            reach = watch_reach(map(_watched, items), k=WATCH_K, now_ms=self._clock_ms(), timing=self._timing)
        self.watched = {i[schema.SESSION_ID]: _watched(i) for i in items}
        self._end_traces = {i[schema.SESSION_ID]: i[schema.END_TRACE] for i in items if schema.END_TRACE in i}
        if len(self.watched) < len(self._ring):
            self._ring_at = float("-inf")  # one is gone (TTL, or deleted by hand): look again
        now = self._clock_ms()
        drain, end = watch_plan(self.watched.values(), now_ms=now, timing=self._timing)
        if end:  # not drain: an ENDED session in the ring is mostly a leaver's, handing over by hints
            self.suspect_at = clock.now()
        for session_id in drain:
            if session_id not in self._draining:
                trace = tracing.valid_header(self._end_traces.get(session_id), where="session")
                self._spawn(self.drain(session_id, trace_parent=trace), f"drain:{session_id}")
        loop = asyncio.get_running_loop()
        for session_id, at_ms in end:
            if session_id not in self._ending:
                delay = max(0.0, (at_ms - now) / 1000) + takeover_jitter_s(self._holdings.load())
                self._ending[session_id] = loop.call_later(delay, self._end_due, session_id)
                self._log.info("session_suspect", suspect=session_id, end_in_s=round(delay, 3))
        return len(items)

    async def _read_ring(self, me: str, changes: int) -> None:
        self._ring = await self._call(self._sessions.ring_after, me, limit=self._reach)
        self._ring_for, self._ring_at, self._ring_changes = me, clock.now(), changes

    async def announce(self) -> int:
        """Tell the sessions that watch ours (its predecessors in the ring) that their
        successors changed, so a newcomer is watched from their next renewal on, not
        from their next periodic ring read. Returns how many were told."""
        told = 0
        for session_id in await self._call(self._sessions.ring_before, self._keeper.session_id, limit=WATCH_K):
            try:
                told += bool(await self._call(self._sessions.announce, session_id))
            except TransientError as exc:
                self._log.warning("announce_failed", to=session_id, error=str(exc))
        return told

    def _end_due(self, session_id: str) -> None:
        self._ending.pop(session_id, None)
        self.suspect_at = clock.now()
        self._spawn(self.end_session(session_id), f"end:{session_id}")

    async def end_session(self, session_id: str) -> bool:
        """End a dead session (conditional: LIVE and expired beyond the skew margin) and
        drain it, in an ``end_session`` span whose trace header the ending write stores
        on the session (``end_trace``): the drain, every acquisition and every new socket
        of its connections, here or at a peer, continue that trace. True if this worker
        ended it."""
        if not self._keeper.live():
            return False
        with tracing.segment("end_session", session=session_id) as span:
            ended = await self._end_session(session_id, span.header)
            span.annotate(outcome="ended" if ended else "not_ended")
        return ended

    async def _end_session(self, session_id: str, trace: str | None) -> bool:
        # Its connections are read while the end is written: a dead worker's set is
        # frozen (only a STOP changes a row, and every acquire is conditional), so this
        # saves a round trip between the end and the first acquisition.
        rows = asyncio.ensure_future(self._call(self._connections.owned_by, session_id))
        rows.add_done_callback(lambda f: f.cancelled() or f.exception())  # read, or retried by drain()
        for attempt in range(5):
            try:
                result = await self._call(
                    self._sessions.end_expired,
                    session_id,
                    ended_by=self._keeper.session_id,
                    max_clock_skew_ms=self._timing.max_clock_skew_ms,
                    trace_header=trace,
                )
                break
            except TransientError as exc:
                self._log.warning("session_end_retry", ended=session_id, error=str(exc), attempt=attempt)
                await asyncio.sleep(0.1 + 0.2 * random.random())
        else:
            rows.cancel()
            return False  # the next watch pass tries again
        if isinstance(result, EndFailure):
            rows.cancel()
            self._log.info("session_end_lost", ended=session_id, why=result.value)
            if result is EndFailure.GONE:
                self._ring_at = float("-inf")
            return False
        self.sessions_ended += 1
        self._log.info("session_ended_dead", ended=session_id, worker=result.get(schema.SESSION_WORKER_ID))
        suspect = Suspect.from_item(result.get(schema.SUSPECT))
        if suspect is not None:
            # Not when our own renewals failed within a lease: the table's trouble (an
            # outage longer than the lease ends every session at once) is no connection's.
            troubled_s = clock.now() - self._keeper.troubled_at
            if troubled_s * 1000 < self._timing.lease_ms + self._timing.max_clock_skew_ms:
                self._log.info("strike_skipped", connection_id=suspect.connection_id, dead_session=session_id,
                               why=f"our own renewals failed {troubled_s:.1f} s ago")
            else:
                await self._strike(session_id, suspect)
        try:
            read = await rows
        except Exception:  # noqa: BLE001 - drain() reads it again
            read = None
        await self.drain(session_id, rows=read, trace_parent=trace)
        return True

    async def _strike(self, session_id: str, suspect: Suspect) -> None:
        """Count the death of ``session_id`` (just ended by us) against the suspect it
        named, before its drain takes it (a strike that quarantines it sets it aside
        there and then). A transient fault is tried again (a strike that landed with
        its answer lost finds itself and counts nothing more). Best effort: one that
        cannot be written is logged and missed (the run starts again later), never a
        reason to hold the takeover back."""
        for attempt in range(STRIKE_TRIES):
            try:
                struck = await self._call(
                    self._connections.strike,
                    suspect.connection_id,
                    suspect,
                    dead_session=session_id,
                    quarantine_after=self._quarantine_after,
                )
                break
            except Exception as exc:  # noqa: BLE001 - the drain goes on without it
                self._log.warning(
                    "strike_failed", connection_id=suspect.connection_id, error=f"{type(exc).__name__}: {exc}", attempt=attempt
                )
                if not isinstance(exc, TransientError) or attempt == STRIKE_TRIES - 1:
                    return
                await asyncio.sleep(0.1 + 0.2 * random.random())
        if struck is None:
            return
        self._log.warning(
            "connection_struck",
            connection_id=suspect.connection_id,
            dead_session=session_id,
            strikes=struck.strikes,
            why=suspect.why,
            quarantined=struck.quarantined is not None,
        )
        if struck.quarantined is not None:
            self._counters.add(names.QUARANTINED_CONNECTIONS)

    def announce_soon(self) -> None:
        self._spawn(self.announce(), "announce")

    def drain_soon(self, session_id: str) -> None:
        self._spawn(self.drain(session_id), f"drain:{session_id}")

    async def drain(self, session_id: str, *, rows: list | None = None, trace_parent: str | None = None) -> int:
        """Take an ENDED session's connections: acquire this worker's part of the plan
        (:meth:`_drain_plan`; conditional on that session), move each of the rest the
        plan names a survivor for to that survivor's session (one write each, conditional
        on the dead session and the fence read: :mod:`.moves`), and hint the others for
        anyone naming the session, so that a peer's acquire is conditional on it too;
        STOPPED ones are just freed. What a lost hint leaves attached is found by the next
        drain: the session stays in the ring until its owner index reads empty twice.
        ``rows``: its connections, if just read. ``trace_parent``: the trace header of the
        span that ended the session (its ``end_trace``): the drain's span, and so its
        acquisitions and hints, continue that trace. Returns how many this worker acquired."""
        if session_id in self._draining or not self._keeper.live():
            return 0
        self._draining.add(session_id)
        try:
            with tracing.segment("drain", parent=trace_parent, session=session_id) as span:
                return await self._drain(session_id, rows, span.header)
        finally:
            self._draining.discard(session_id)

    async def _drain(self, session_id: str, rows: list | None, trace: str | None) -> int:
        if rows is None:
            rows = await self._call(self._connections.owned_by, session_id)
        if not rows:
            self._empty[session_id] = self._empty.get(session_id, 0) + 1
            if self._empty[session_id] >= EMPTY_DRAINS_TO_LEAVE and self._keeper.live():
                await self._call(self._sessions.leave_ring, session_id)
                self._empty.pop(session_id, None)
                self._ring_at = float("-inf")
                self._log.info("session_drained", drained=session_id)
            return 0
        self._empty.pop(session_id, None)
        started = [r.connection_id for r in rows if r.desired_state == schema.STARTED and not self._holdings.busy(r.connection_id)]
        stopped = [r.connection_id for r in rows if r.desired_state != schema.STARTED]
        split = self._drain_plan(session_id, started)
        mine, named, anyone = split.mine, split.named, split.anyone
        results = await asyncio.gather(
            *(self._acquisition.try_acquire(cid, source="orphan", expected_session=session_id, trace_parent=trace) for cid in mine),
            self._move_or_hint(session_id, named),
            *(self._hints.hint(cid, from_session=session_id) for cid in fresh_hints(anyone, self._hinted, clock.now())),
            *(self._free(cid, session_id) for cid in stopped),
            return_exceptions=True,
        )
        acquired = sum(1 for r in results[: len(mine)] if r is not None and not isinstance(r, BaseException))
        self._log.info(
            "session_drain",
            drained=session_id,
            found=len(rows),
            acquired=acquired,
            hinted=len(anyone),
            named=len(named),
            freed=len(stopped),
        )
        return acquired

    async def _move_or_hint(self, session_id: str, named: list[tuple[str, str]]) -> None:
        """Move each planned connection to its survivor (:meth:`.moves.Mover.move_drained`);
        hint what did not move for anyone, conditional on the dead session."""
        left = await self._mover.move_drained(session_id, named)
        await asyncio.gather(*(self._hints.hint(cid, from_session=session_id) for cid in fresh_hints(left, self._hinted, clock.now())))

    def _drain_plan(self, session_id: str, started: list[str]) -> DrainSplit:
        """Split a dead session's STARTED connections (:func:`.decide.split_drain`) by the
        fleet's plan (:func:`wsfleet.balance.drain_targets`, from the fleet summary this
        worker holds: no read at all, whatever the fleet's size): this worker takes its
        own deficit (as far as its room goes: the rest goes to anyone) and names a
        survivor under its target for each of the rest, so that the crash ends within
        about one of fair share with nothing left to rebalance. A hint its target cannot
        take goes to anyone after a moment (``declines_shed_hint``): never one left
        unowned. Without a plan (a fleet too large for the summary to list every taker, no
        survivor with room): its own part here (:func:`wsfleet.balance.drain_share`), the
        rest to anyone; with no fresh summary at all, half its room."""
        fleet, me, room = self._summary.fresh(), self._keeper.session_id, self._holdings.free()
        if not started or fleet is None:
            return split_drain(started, None, me=me, room=room)
        plan = drain_targets(fleet, dead_session=session_id, count=len(started))
        take = drain_share(
            fleet, count=len(started), active=self._holdings.taken(), max_connections=self._holdings.max_connections, me=me
        )
        return split_drain(started, plan, me=me, room=room, take=take)

    async def _free(self, connection_id: str, dead_session: str) -> None:
        if not self._keeper.live():
            return  # past our deadline nothing is written, not even on a dead session's behalf
        await self._call(self._connections.free_orphan, connection_id, dead_session=dead_session)

    # --- free scan ---------------------------------------------------------------------

    def note_work(self) -> None:
        """A hint (a START, a handoff, a drain) says connections move: the free scan's
        pause is back to one RECONCILE_SECONDS."""
        self.idle_scans = 0
        self.work_noted.set()

    def _start_point(self) -> str:
        """Where a free scan starts in a partition: just after a connection id drawn from
        those earlier scans read and one this worker holds (connection ids are the
        users': a point drawn from ids seen falls among the entries wherever they
        cluster), else after a random one."""
        held = self._holdings.held_ids()
        points = self._scan_points + ([random.choice(held)] if held else [])
        return random.choice(points) if points else f"{random.getrandbits(64):016x}"

    def _keep_points(self, ids: list[str]) -> None:
        self._scan_points = (self._scan_points + ids)[-SCAN_POINTS:] if ids else self._scan_points

    async def reconcile_once(self) -> int:
        """Query the FREE# shards (a random one first, each from a random point, round
        to it) for STARTED connections nobody owns and try to take as many as there is
        room for (:meth:`.decide.Standing.scan_room`: none while this worker is at its
        fair share and another is under theirs, so that what a peer shed goes to that
        one), each after a little load-weighted jitter so that the least loaded worker
        tends to win. Counts the scans in a row that found nothing (``idle_scans``).
        Returns how many it tried."""
        room = self._holdings.standing(self._keeper.session_id).scan_room()
        if room <= 0 or not self._keeper.live():
            return 0
        shards = list(range(self._shards))
        random.shuffle(shards)
        found: list[str] = []
        for shard in shards:
            ids = await self._call(
                _take, self._connections.free(shard, limit=min(100, room + 10), start_after=self._start_point()), room + 10
            )
            self._keep_points(ids)
            found.extend(c for c in ids if not self._holdings.busy(c) and not self._holdings.shed_recently(c))
            if len(found) >= room:
                break
        found = list(dict.fromkeys(found))[:room]
        self.idle_scans = 0 if found else self.idle_scans + 1
        if found:
            self._log.info("unowned_found", count=len(found))
            await asyncio.gather(*(self._jittered_acquire(c) for c in found), return_exceptions=True)
        return len(found)

    async def _jittered_acquire(self, connection_id: str) -> None:
        await asyncio.sleep(takeover_jitter_s(self._holdings.load()))
        await self._acquisition.try_acquire(connection_id, source="unowned")

    async def count_unowned(self, dead: Iterable[str]) -> int:
        """STARTED connections that nobody owns: those in the FREE# shards now that were
        there at this worker's previous count too (one METRICS_SECONDS earlier), plus
        those attached to the ``dead`` sessions (ENDED, or past their expiry and the skew
        margin, and not drained yet). A connection passes through FREE# for a moment on
        every START (a handoff only when nobody claimed it: worker.handoffs), so a busy
        fleet always has a few there: counting those
        would hold the alarm up on a steady START rate; one still there a sample later
        has been missed by the hints and the free scans. One worker counts for the fleet
        (the summarizer, which reads every session anyway)."""
        listed = await asyncio.gather(*(self._call(self._connections.free_ids, s) for s in range(self._shards)))
        free_now = set().union(*listed)
        stuck, self._free_seen = free_now & self._free_seen, free_now
        owned = await asyncio.gather(*(self._call(self._connections.count_owned_by, s) for s in dead))
        return len(stuck) + sum(owned)


def _watched(item: dict) -> Watched:
    return Watched(item[schema.SESSION_ID], item.get(schema.SESSION_STATE, ""), int(item.get(schema.EXPIRES_AT_MS, 0)))


def _take(iterable: Any, n: int) -> list:
    return list(islice(iterable, n))
