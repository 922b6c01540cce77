"""Checkpoints of many connections, written together.

A held connection stores its checkpoint (``last_seq``, the gap-free prefix of what is
stored) at least every ``CHECKPOINT_SECONDS`` while frames arrive, so that after a crash
the next owner reads little past it. One conditional UpdateItem per checkpoint is one
request per connection every 120 s: at 1,000 connections x 0.5 msg/s that is 0.017
requests per message, a third of issue 9's budget of 0.05. :class:`Checkpoints` writes
them up to 25 at a time in one TransactWriteItems, each Update conditional on its
connection's session and fence exactly as a lone checkpoint is. What it writes is each
runner's :class:`~wsfleet.checkpoint.Checkpoint`, as given: that value is where the rule
that a checkpoint never goes back is kept, not here.

When. A connection asks ``gather_s`` before its checkpoint is due, and says by when it
must be written; a transaction leaves as soon as 25 are waiting, or when the earliest
of them reaches its time. So a connection's checkpoints are between ``checkpoint_s -
gather_s`` and ``checkpoint_s`` apart, never further.

Outcomes. A transaction is all or nothing. Cancelled, it says per item why: an item
whose condition failed belongs to a connection that is no longer ours (its runner ends
as LOST, as after a lone checkpoint); the others were not written only because of it
and go again at once without it. A conflict with another write to one of the items, or
throttling, cancels the whole group: it goes again after a jittered backoff, until the
worker's deadline (then :class:`~wsfleet.worker.retry.LeaseExpired`, as for any write).
Any other failure (AccessDenied during a deploy, a bug) is logged, counted in
``LoopErrors`` and the group sent again after a capped backoff, until the deadline
(:class:`~wsfleet.worker.supervision.Supervisor`): every checkpoint asked for is
answered or asked again, and the loop never ends but by cancellation.

Cost. A transactional write costs 2 write units per item where UpdateItem costs 1: at one
checkpoint per connection every 120 s, 0.017 WRU per connection-second against the 0.5
of its 0.5 msg/s of messages.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .. import clock
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import MAX_TRANSACTION, CheckpointEntry, ConnectionsStore
from .retry import LeaseExpired, call_until, woken_or_timeout
from .supervision import Supervisor

Call = Callable[..., Awaitable[Any]]


@dataclass
class _Ask:
    entry: CheckpointEntry
    by: float  # clock.now() seconds: written by then at the latest
    deadline: Callable[[], float]
    abandoned: bool = False  # its writer stopped waiting (the runner is ending): not sent again
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Checkpoints:
    def __init__(
        self,
        *,
        connections: ConnectionsStore,
        call: Call,
        counters: Counters,
        log: JsonLogger,
        batch: int = MAX_TRANSACTION,
    ) -> None:
        self._connections = connections
        self._call = call
        self._log = log
        self._supervisor = Supervisor(log=log, counters=counters)
        self._batch = batch
        self._waiting: dict[tuple[str, int], _Ask] = {}  # by (connection id, fence)
        self._wake = asyncio.Event()
        self.transactions = 0
        self.written = 0

    async def write(self, entry: CheckpointEntry, *, by: float, deadline: Callable[[], float]) -> bool:
        """Have ``entry`` written, with others, by the time ``by`` (:func:`wsfleet.clock.now`) (or sooner).
        True once written, False if the connection is no longer ours. Raises
        :class:`LeaseExpired` once the deadline has passed unwritten. Cancelled before its
        transaction left, the checkpoint is not written. A connection (one fence) has one
        checkpoint waiting at a time: its runner waits for each."""
        key = (entry.connection_id, entry.fence_token)
        if key in self._waiting:
            raise RuntimeError(f"a checkpoint of {key} is already waiting")
        ask = _Ask(entry, by, deadline)
        self._waiting[key] = ask
        self._wake.set()
        try:
            ok = await asyncio.shield(ask.answer)
        finally:
            ask.abandoned = not ask.answer.done()
            if self._waiting.get(key) is ask:
                del self._waiting[key]  # cancelled before it left: not sent
        if ok is None:
            raise LeaseExpired()
        return ok

    async def run(self) -> None:
        """Send transactions until cancelled."""
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            left = min(a.by for a in self._waiting.values()) - clock.now()
            if len(self._waiting) < self._batch and left > 0:
                await woken_or_timeout(self._wake, left)
                continue
            group = sorted(self._waiting.values(), key=lambda a: a.by)[: self._batch]
            for ask in group:
                del self._waiting[(ask.entry.connection_id, ask.entry.fence_token)]
            try:
                await self._send(group)
            finally:
                for ask in group:  # not answered (cancelled, or a bug past the retries): asked again
                    if not ask.answer.done() and not ask.abandoned:
                        self._waiting.setdefault((ask.entry.connection_id, ask.entry.fence_token), ask)

    async def _send(self, group: list[_Ask]) -> None:
        while group:
            try:
                outcomes = await self._transact(group)
            except LeaseExpired:
                for ask in group:
                    if not ask.answer.done():
                        ask.answer.set_result(None)  # the deadline passed: LeaseExpired to its writer
                return
            self.transactions += 1
            again = []
            for ask, ok in zip(group, outcomes, strict=True):
                if ok is None:
                    again.append(ask)
                elif not ask.answer.done():
                    self.written += ok
                    ask.answer.set_result(ok)
            group = [a for a in again if not a.abandoned]

    async def _transact(self, group: list[_Ask]) -> list[bool | None]:
        """One transaction of the group's checkpoints, sent until it gets an answer or the
        earliest deadline among them passes: per checkpoint, True (written), False (not
        ours) or None (not written because of another item)."""

        def deadline() -> float:
            return min(a.deadline() for a in group)

        async def once() -> list[bool | None]:
            entries = [a.entry for a in group]
            checkpoint_many = self._connections.checkpoint_many
            outcomes = await call_until(self._call, deadline, checkpoint_many, log=self._log, entries=entries)
            if len(outcomes) != len(entries):
                raise RuntimeError(f"{len(outcomes)} outcomes for {len(entries)} checkpoints")
            return outcomes

        return await self._supervisor.retry("checkpoints", once, deadline=deadline)

    def stats(self) -> dict[str, Any]:
        return {"waiting": len(self._waiting), "transactions": self.transactions, "written": self.written}
