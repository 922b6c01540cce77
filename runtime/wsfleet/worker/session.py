"""Keeping the worker's one session alive.

One :class:`SessionKeeper` per worker process opens a session, renews it every heartbeat
with one conditional write that also reports the worker's load and brings back the
STOPs and the assignments (connections moved to it by others) posted to it, and keeps
the worker's single deadline: the send time of the last successful renewal
(:func:`wsfleet.clock.now`, which counts suspended time), plus the lease, less the skew
margin. Past the deadline, or once the session is found ENDED, the session is *lost*:
every connection attached to it is gone, and nothing may be written for any of them.

A failed renewal is retried every ~0.1 s until the deadline (one cheap request per
worker, so there is no reason to back off further): throttling or an outage shorter than
``lease - heartbeat - skew`` costs nothing.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Awaitable, Callable

from .. import clock, schema
from ..leases import RenewFailure, SessionTiming, backoff_s, new_session_id
from ..logs import JsonLogger
from ..store import SessionsStore, TransientError, now_ms

Call = Callable[..., Awaitable[Any]]
RENEW_TIMEOUT_S = 1.0  # a renewal not answered by then gets a second try beside it (it is idempotent)
RENEW_IN_FLIGHT = 3  # tries at once, within the lane's URGENT_THREADS (4)


def _quiet(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: an abandoned try's failure is not news


class Lost(enum.Enum):
    ENDED = "ended"  # someone ended the session (it had expired by their clock)
    EXPIRED = "expired"  # our own deadline passed before a renewal got through


class SessionKeeper:
    def __init__(
        self,
        *,
        sessions: SessionsStore,
        worker_id: str,
        timing: SessionTiming,
        max_connections: int,
        call: Call,
        log: JsonLogger,
        active: Callable[[], int],
        on_stops: Callable[[set[str]], set[str]],
        on_assigned: Callable[[set[str]], set[str]] = lambda entries: set(),
        suspect: Callable[[], dict | None] = lambda: None,
        on_drain: Callable[[dict], None] = lambda request: None,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        """``active``: how many connections the worker holds (each renewal reports it);
        ``on_stops``: the STOPs a renewal brought back, not yet acted on; returns those it
        acted on (the next renewal removes them from the inbox); ``on_assigned``: likewise
        the connections other workers moved to us (:meth:`ConnectionsStore.move`), before
        the STOPs (a STOP for one being picked up waits for the pickup); ``suspect``: the
        worker's prime suspect now (:mod:`wsfleet.crash_loop`), asked once a renewal,
        which stores it for whoever ends the session if the worker dies; ``on_drain``: an
        operator asked this session to leave (``drain_requested``, as a renewal or a read
        of the item found it), called once."""
        self.worker_id = worker_id
        self.timing = timing
        self.session_id = ""
        self.deadline_mono = 0.0
        self.lost_reason: Lost | None = None
        self.renewals = 0
        self.draining = False  # set at shutdown: the renewal tells the fleet we take nothing more
        self.ring_changes = 0  # bumped by newcomers right after us in the ring (see Takeover)
        self.read_at = float("-inf")  # clock.now() when the last renewal that answered was sent
        # clock.now() of our last failed renewal or lost session: the table in trouble for
        # us too, so a death we see then may be its doing (no strike: worker.takeover)
        self.troubled_at = float("-inf")
        self._sessions = sessions
        self._max = max_connections
        self._call = call
        self._log = log
        self._active = active
        self._on_stops = on_stops
        self._on_assigned = on_assigned
        self._suspect = suspect
        self._on_drain = on_drain
        self.drain_request: dict | None = None  # the first drain_requested seen: acted on once
        self._clock_ms = clock_ms
        self._stops_done: set[str] = set()
        self._assigned_done: set[str] = set()
        self._lost = asyncio.Event()

    # --- the one deadline ----------------------------------------------------------------

    def live(self) -> bool:
        return self.lost_reason is None and clock.now() < self.deadline_mono

    def deadline_for(self, session_id: str) -> float:
        """The deadline that governs writes for a connection acquired under
        ``session_id``: ours while that session is the current one and not lost, else 0."""
        if session_id != self.session_id or self.lost_reason is not None:
            return 0.0
        return self.deadline_mono

    async def wait_lost(self) -> Lost:
        await self._lost.wait()
        assert self.lost_reason is not None
        return self.lost_reason

    def lose(self, reason: Lost, *, quiet: bool = False) -> None:
        """The session is lost: nothing more may be written under it."""
        if self.lost_reason is None:
            self.lost_reason = reason
            self.deadline_mono, self.troubled_at = 0.0, clock.now()
            self._lost.set()
            if not quiet:
                self._log.warning("session_lost", session_id=self.session_id, why=reason.value)

    # --- grant, keep-alive, revoke ------------------------------------------------------

    async def open(self, stopping: asyncio.Event) -> bool:
        """Open a new session (retrying transient faults with backoff); False if
        ``stopping`` was set first."""
        attempt = 0
        while not stopping.is_set():
            session_id = new_session_id(self.worker_id, self._clock_ms())
            sent = clock.now()
            try:
                await self._call(
                    self._sessions.open,
                    session_id,
                    worker_id=self.worker_id,
                    lease_ms=self.timing.lease_ms,
                    max_connections=self._max,
                )
            except TransientError as exc:
                self._log.warning("session_open_failed", error=str(exc), attempt=attempt)
                await asyncio.sleep(backoff_s(attempt, base=0.2, cap=2.0))
                attempt += 1
                continue
            self.session_id = session_id
            self.deadline_mono = self.timing.deadline_mono(sent)
            self.lost_reason = None
            self._lost = asyncio.Event()
            self._stops_done.clear()
            self._assigned_done.clear()
            self._log.info("session_opened", session_id=session_id, lease_ms=self.timing.lease_ms)
            return True
        return False

    async def renew_once(self) -> bool:
        """One renewal, retried until it lands or the deadline passes. True if renewed;
        False if the session is lost (see :attr:`lost_reason`).

        A try that fails fast (throttling, a 5xx) is sent again after a short pause. A
        try not answered within ``RENEW_TIMEOUT_S`` is not given up: another is sent
        beside it (at most ``RENEW_IN_FLIGHT`` at once) and the first answer wins, its
        send time setting the deadline. Abandoning slow tries lost every session when the
        table answered in 1.3 s for a few seconds (chaos, seed 208702 #59): each answer
        came after its try had been given up, while the retries queued behind them."""
        pending: dict[asyncio.Future, float] = {}  # try -> its send time (clock.now())
        done = set(self._stops_done)
        assigned_done = set(self._assigned_done)
        suspect = self._suspect()
        next_try = clock.now()
        try:
            while self.lost_reason is None:
                now = clock.now()
                left = self.deadline_mono - now
                if left <= 0:
                    self.lose(Lost.EXPIRED)
                    break
                if now >= next_try:
                    # the next try is a hedge, if this one is slow; with RENEW_IN_FLIGHT out
                    # none is sent, and the loop waits a whole RENEW_TIMEOUT_S for an answer
                    # (it used to spin, logging renew_slow at every turn, while the table
                    # was slow: the moment a worker has least CPU to spare)
                    if len(pending) < RENEW_IN_FLIGHT:
                        if pending:
                            self._log.warning("renew_slow", in_flight=len(pending), left_s=round(left, 3))
                        pending[asyncio.ensure_future(self._renew_try(done, assigned_done, suspect))] = now
                    next_try = now + RENEW_TIMEOUT_S
                wait = max(0.0, min(left, next_try - clock.now()))
                if not pending:  # the last try failed fast: pause before the next
                    await asyncio.sleep(wait)
                    continue
                finished, _ = await asyncio.wait(list(pending), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for attempt in finished:
                    sent = pending.pop(attempt)
                    exc = attempt.exception()
                    if exc is not None:
                        self.troubled_at = clock.now()
                        level = self._log.warning if isinstance(exc, TransientError) else self._log.error
                        level(
                            "renew_retry" if isinstance(exc, TransientError) else "renew_error",
                            error=f"{type(exc).__name__}: {exc}",
                            left_s=round(self.deadline_mono - clock.now(), 3),
                        )
                        # it proves neither renewal nor loss: try again soon, to the deadline
                        next_try = min(next_try, clock.now() + self.timing.renew_retry_s())
                        continue
                    result = attempt.result()
                    if isinstance(result, RenewFailure):
                        self.lose(Lost.ENDED)
                        return False
                    self.deadline_mono = max(self.deadline_mono, self.timing.deadline_mono(sent))
                    self.read_at = max(self.read_at, sent)
                    self.renewals += 1
                    self.ring_changes = int(result.get(schema.RING_CHANGES, 0))
                    self._stops_done -= done
                    self._assigned_done -= assigned_done
                    self.note_drain(result)  # first: a worker that leaves picks up no assignment
                    self.take_assigned(result.get(schema.ASSIGNED) or ())
                    stops = set(result.get(schema.STOP_INBOX) or ()) - self._stops_done
                    if stops:
                        self._stops_done |= self._on_stops(stops)
                    return True
            return False
        finally:
            for attempt in pending:  # still in flight: their answers no longer matter
                attempt.add_done_callback(_quiet)

    def take_assigned(self, entries: Any) -> None:
        """Hand the assignments (inbox entries, as a renewal returned them or a read of
        the session item found them) not yet acted on to ``on_assigned``; the next
        renewal removes those it acted on. One handed over again (a read older than the
        renewal that removed it) finds its connection held, or no longer ours: nothing
        is done twice."""
        fresh = set(entries) - self._assigned_done
        if fresh:
            self._assigned_done |= self._on_assigned(fresh)

    def note_drain(self, item: Any) -> None:
        """Our session item (a renewal's answer, or a read of it): if an operator asked
        it to leave (``wsfleet drain``), tell ``on_drain``, the first time only."""
        request = item.get(schema.DRAIN_REQUESTED)
        if request is not None and self.drain_request is None:
            request = request if isinstance(request, dict) else {}
            at_ms = request.get(schema.DRAIN_AT_MS, 0)  # a Decimal, as a nested number is read
            self.drain_request = {
                schema.DRAIN_BY: str(request.get(schema.DRAIN_BY, "")),
                schema.DRAIN_AT_MS: int(at_ms) if str(at_ms).isdigit() else 0,
            }
            self._on_drain(self.drain_request)

    async def _renew_try(self, stops_done: set[str], assigned_done: set[str], suspect: dict | None) -> Any:
        return await self._call(
            self._sessions.renew,
            self.session_id,
            lease_ms=self.timing.lease_ms,
            active=self._active(),
            max_connections=self._max,
            stops_done=stops_done,
            assigned_done=assigned_done,
            draining=self.draining,
            suspect=suspect,
        )

    async def run(self) -> Lost:
        """Renew every heartbeat until the session is lost; returns why. Cancel it to stop
        renewing (at shutdown, after everything is released)."""
        heartbeat = self.timing.heartbeat_ms / 1000
        while True:
            sent = clock.now()
            if not await self.renew_once():
                assert self.lost_reason is not None
                return self.lost_reason
            await asyncio.sleep(max(0.0, heartbeat - (clock.now() - sent)))

    async def end(self) -> bool:
        """End our own session (clean exit, or after our deadline passed): it can never
        be renewed again, and no acquisition can land on it any more. It stays in the
        watch ring, so that whatever is still attached is drained (see
        :mod:`.attached`). Best effort: if it fails, the session simply expires. True if
        it is ENDED now."""
        for attempt in range(3):
            try:
                ended = await self._call(
                    self._sessions.end_own, self.session_id, worker_id=self.worker_id, active=self._active()
                )
                break
            except TransientError as exc:
                self._log.warning("session_end_failed", session_id=self.session_id, error=str(exc), attempt=attempt)
                await asyncio.sleep(backoff_s(attempt))
        else:
            return False
        self._log.info("session_ended", session_id=self.session_id, by_us=ended)
        self.lose(Lost.ENDED, quiet=True)
        return True
