"""Leaving gracefully: every connection handed over, then the session ended and taken
out of the ring once nothing is left attached to it.

A handoff not yet taken, and whatever is not done within the budget, stays attached to
the ended session, still in the ring: its hint's taker (the worker hints it again before
it exits: :meth:`Departure.hint_handoffs_again`), else its watchers, take it.
"""

from __future__ import annotations

import asyncio

from .. import clock
from ..logs import JsonLogger
from .attached import Attachments
from .handoffs import Handoffs
from .holdings import Holdings
from .session import SessionKeeper

# At shutdown, connections are handed over this many at a time: each socket stays open
# (its frames stored) until its own close, flush, release and hint, so a connection is
# without a socket only for its own handoff, not for everyone's. Closing them all at once
# left each waiting for every release ahead of it (p99 1.7 s without a socket for 39
# connections on the embedded emulator); 8 at a time still queued each behind the others'
# releases and the takers' acquisitions (p99 0.8-1.3 s), 4 at a time does not (p99 0.4 s,
# and the whole handoff of 39 ends sooner: bench failover, BENCHMARKS.md). After
# HANDOFF_PACED_SHARE of the budget the rest go at once, so a worker holding thousands
# still leaves inside it.
HANDOFF_CONCURRENCY = 4
HANDOFF_PACED_SHARE = 0.4


class Departure:
    def __init__(
        self,
        *,
        holdings: Holdings,
        keeper: SessionKeeper,
        handoffs: Handoffs,
        attachments: Attachments,
        log: JsonLogger,
    ) -> None:
        self._holdings = holdings
        self._keeper = keeper
        self._handoffs = handoffs
        self._attachments = attachments
        self._log = log

    async def hand_over(self, *, paced_until: float) -> None:
        """Ask every runner to shut down (close, flush, hand off with checkpoint, hint),
        ``HANDOFF_CONCURRENCY`` at a time until ``paced_until`` (:func:`wsfleet.clock.now`),
        then all the rest at once. Returns when the last one has been asked."""
        in_flight: set[asyncio.Task] = set()
        for runner in list(self._holdings.runners.values()):
            while len(in_flight) >= HANDOFF_CONCURRENCY and clock.now() < paced_until:
                _, in_flight = await asyncio.wait(
                    in_flight, timeout=paced_until - clock.now(), return_when=asyncio.FIRST_COMPLETED
                )
            holder = self._holdings.holder(runner)
            if holder is None:
                continue  # ended meanwhile (a STOP, a lost session)
            runner.request_shutdown()
            in_flight.add(holder)

    async def leave(self, *, budget_s: float) -> None:
        """Hand every connection over (:meth:`hand_over`: close, flush, checkpoint, hand
        off, hint, a few at a time) while the session is still renewed; then end the
        session, free what is still attached to it with no runner and no handoff, and take
        it out of the ring if nothing is left attached
        (:meth:`.attached.Attachments.leave_ring_when_clear`), within ``budget_s``."""
        started = clock.now()
        early = asyncio.ensure_future(self._free_early(self._keeper.session_id))
        await self.hand_over(paced_until=started + HANDOFF_PACED_SHARE * budget_s)
        pending = self._holdings.holders()
        if pending:
            left = budget_s - (clock.now() - started)
            _, late = await asyncio.wait(pending, timeout=max(0.1, left))
            if late:
                self._log.warning("shutdown_budget_exceeded", unfinished=len(late))
        await asyncio.wait([early], timeout=max(0.1, budget_s - (clock.now() - started)))
        session_id = self._keeper.session_id
        if session_id and self._keeper.lost_reason is None and await self._keeper.end():
            left = budget_s - (clock.now() - started)
            try:
                await asyncio.wait_for(
                    # What is handed off and not taken stays attached to the ended session, in
                    # the ring: its hints' takers, else its watchers, take it (worker.handoffs).
                    self._attachments.leave_ring_when_clear(
                        session_id, held=self._holdings.holds, handed=self._handoffs.pending
                    ),
                    timeout=max(0.1, left),
                )
            except Exception as exc:  # noqa: BLE001 - the session stays in the ring: its watchers drain it
                self._log.warning("session_left_in_ring", session_id=session_id, error=f"{type(exc).__name__}: {exc}")

    async def _free_early(self, session_id: str) -> None:
        """The first step of leaving, beside the handovers: free and hint what is attached to
        us that no runner holds or is taking (what a drain of ours attached before the
        SIGTERM cut it short, moves we will not pick up), not after every handover: a runner
        slow to flush took the whole budget once (a peer faster than its partition takes),
        and three connections a drain had attached waited 9 s behind it."""
        if not session_id or self._keeper.lost_reason is not None:
            return
        try:
            await self._attachments.free_unheld(session_id, held=self._holdings.busy, handed=self._handoffs.pending)
        except Exception as exc:  # noqa: BLE001 - the last step (leave_ring_when_clear) tries again
            self._log.warning("early_free_failed", session_id=session_id, error=f"{type(exc).__name__}: {exc}")

    async def hint_handoffs_again(self, *, until: float, after: float) -> None:
        """The leaving worker's last step: ``after`` seconds past its last handoff's hint
        (within the budget, ``until``), hint again what is still unclaimed
        (:meth:`.handoffs.Handoffs.hint_again`), so that a lost hint costs that moment,
        not its watchers' next read of its ended session."""
        if not len(self._handoffs):
            return
        await asyncio.sleep(max(0.0, min(self._handoffs.last_at + after, until) - clock.now()))
        try:
            await asyncio.wait_for(self._handoffs.hint_again(), timeout=max(0.1, until - clock.now()))
        except Exception as exc:  # noqa: BLE001 - its watchers drain what is left
            self._log.warning("handoffs_hint_again_failed", error=f"{type(exc).__name__}: {exc}")
