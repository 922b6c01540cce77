"""A connection runner's checkpoints (:class:`Checkpointing`, a part of
:class:`~.connection.ConnectionRunner`): what the writer stored, counted, and written to
the connection item at most ``checkpoint_s`` after the last one, conditional on the
runner's session and fence; and why a runner ends (:class:`EndReason`)."""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any

from .. import clock
from ..checkpoint import Tally
from ..store import CheckpointEntry
from .retry import LeaseExpired

if TYPE_CHECKING:
    from ..logs import JsonLogger
    from ..stream import SeqTracker
    from .checkpoints import Checkpoints
    from .frames import CheckpointTimer


class EndReason(enum.Enum):
    STOPPED = "stopped"  # desired state STOPPED: close, flush, release
    LOST = "lost"  # our session was ENDED, or the connection is no longer ours: close, write nothing
    EXPIRED = "expired"  # the worker's deadline passed before a renewal got through: close, write nothing
    SHUTDOWN = "shutdown"  # this worker is leaving: close, flush, hand off (release at our fence), hint a peer
    SHED = "shed"  # moved to a worker under its fair share: close, flush, hand off, hint


class Checkpointing:
    """The checkpoint half of a runner; the runner provides what is declared here."""

    connection_id: str
    session_id: str
    fence_token: int
    end_reason: EndReason | None
    tracker: SeqTracker
    _timer: CheckpointTimer
    _stored: asyncio.Event
    _checkpoints: Checkpoints
    _deadline: Any
    _log: JsonLogger

    def _end(self, reason: EndReason) -> None:  # (the runner's)
        raise NotImplementedError

    async def _pause(self, delay: float) -> None:  # (the runner's)
        raise NotImplementedError

    def _on_stored(self, seq: int, counts: Tally) -> None:
        """The writer stored seqs up to ``seq`` (a gap-free prefix), adding ``counts``."""
        self.tracker.stored(seq)
        self._timer.stored(seq, counts)
        self._stored.set()  # the checkpointer waits from there until one may be due

    async def _checkpointer(self) -> None:
        # The end reason, not cancellation alone, stops this loop: on Python 3.11,
        # asyncio.wait_for (in call_until) swallows a cancel that arrives in the loop
        # iteration its call completes.
        while self.end_reason is None:
            await self._stored.wait()
            await self._pause(self._timer.wait_s(clock.now()))  # the last frames of a burst too
            self._stored.clear()
            if self.end_reason is not None or not self._timer.due(self.tracker.checkpoint, clock.now()):
                continue
            try:
                await self._write_checkpoint()
            except LeaseExpired:
                self._log.warning("deadline_passed_before_checkpoint", checkpoint=self.tracker.checkpoint)
                return self._end(EndReason.EXPIRED)

    async def _write_checkpoint(self) -> None:
        """Store the checkpoint while holding the connection (conditional on our session
        and fence), written by ``checkpoint_s`` after the last one at the latest: after a
        crash the next owner reads less past it."""
        seq = self.tracker.checkpoint  # stored gap-free: the value written (frames stored meanwhile wait for the next)
        ours = await self._checkpoints.write(
            CheckpointEntry(self.connection_id, self.session_id, self.fence_token, seq, self._timer.uncounted()),
            by=self._timer.by,
            deadline=self._deadline,
        )
        if not ours:
            self._log.warning("checkpoint_found_connection_gone", checkpoint=seq)
            return self._end(EndReason.LOST)
        self._timer.wrote(seq, clock.now())
