"""Moving connections to named workers: assign, then notify.

A move to one worker (a shed to a worker under its share, a dead session's connection
planned for a survivor) is one conditional write (:meth:`ConnectionsStore.move`): the
connection is attached to the target's session at the next fence and posted to that
session's inbox of assignments, conditional on the source (session, fence, and for a
handoff of ours its release mark) and on the target being LIVE, not leaving and with
room in its inbox. The target learns of it at its next renewal and picks it up
(:mod:`.assignments`). SQS carries only hints for anyone: a hint named for one worker
was put back by every other receiver and, past a few workers, reached the dead-letter
queue before its worker saw it.

A move refused (the target ended, is leaving, its inbox is full) or that could not be
sent goes the anonymous way instead: a hint for anyone, pinned as before. A move lost
(the connection was taken, stopped or moved meanwhile) needs nothing more.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Awaitable, Callable

from .. import schema
from ..leases import released_at_fence
from ..logs import JsonLogger
from ..store import ConnectionsStore, Moved, TransientError
from .handoffs import Handoffs
from .hints import Hints

MOVE_TRIES = 3  # a move's tries through transient faults (one that landed answers MOVED when retried)
REFUSED_TRIES, REFUSED_WAIT_S = 3, 1.5  # a refused handoff's move (an inbox full until a renewal), 0.75-2.25 s apart

Call = Callable[..., Awaitable[Any]]


class Mover:
    def __init__(
        self, *, connections: ConnectionsStore, call: Call, hints: Hints, handoffs: Handoffs, log: JsonLogger
    ) -> None:
        self.moved = 0
        self._connections = connections
        self._call = call
        self._hints = hints
        self._handoffs = handoffs
        self._log = log

    async def _move(self, connection_id: str, **kwargs: Any) -> Moved | None:
        """:meth:`ConnectionsStore.move`, tried again through transient faults; None when
        every try failed (nothing known: the caller hints it, pinned, for anyone)."""
        for attempt in range(MOVE_TRIES):
            try:
                landed = await self._call(self._connections.move, connection_id, **kwargs)
            except TransientError as exc:
                self._log.warning("move_retry", connection_id=connection_id, error=str(exc), attempt=attempt)
                await asyncio.sleep(0.1 + 0.2 * random.random())
                continue
            self.moved += landed is Moved.MOVED
            return landed
        return None

    async def move_handed(
        self, connection_id: str, *, session_id: str, fence_token: int, to: str, released: dict, trace: str | None
    ) -> Moved | None:
        """Give a connection we just handed off (released at ``fence_token``, still attached
        to ``session_id``) to the session ``to``. Moved: forgotten as a handoff (its
        target holds it now). Refused (after ``REFUSED_TRIES``) or unsent: hinted for anyone, as a leaving worker's
        handoff is (the hint pins the release), and left to the handoff's claim check.
        Lost: taken or stopped meanwhile (the claim check forgets it)."""
        for attempt in range(REFUSED_TRIES):
            await asyncio.sleep(REFUSED_WAIT_S * (0.5 + random.random()) if attempt else 0)
            landed = await self._move(
                connection_id, from_session=session_id, fence_token=fence_token, to_session=to, released=True
            )
            if landed is not Moved.REFUSED:
                break
        self._log.info("connection_moved", connection_id=connection_id, to=to, outcome=getattr(landed, "value", "unsent"))
        if landed is Moved.MOVED:
            self._handoffs.moved(connection_id)
        elif landed is not Moved.LOST:
            await self._hints.hint(connection_id, released=released, trace=trace)
        return landed

    async def move_drained(self, session_id: str, named: list[tuple[str, str]]) -> list[str]:
        """Give each of a dead session's connections (``named``: connection id, target
        session) to its target, from one consistent read of them (the move is pinned to
        the fence read). Returns those still attached to ``session_id`` that did not move
        (refused, unsent), for the caller to hint for anyone; one no longer attached to it
        (taken by another drainer, stopped and freed) is nobody's to hint."""
        if not named:
            return []
        items = await self._call(self._connections.get_many, [cid for cid, _ in named])

        async def one(connection_id: str, to: str) -> str | None:
            item = items.get(connection_id)
            if item is None or item.get(schema.LEASE_SESSION) != session_id:
                return None
            if schema.QUARANTINED in item:
                return connection_id  # never moved: a taker of its hint sets it aside
            landed = await self._move(
                connection_id,
                from_session=session_id,
                fence_token=int(item.get(schema.FENCE_TOKEN, 0)),
                to_session=to,
                released=released_at_fence(item),
            )
            return None if landed in (Moved.MOVED, Moved.LOST) else connection_id

        left = await asyncio.gather(*(one(cid, to) for cid, to in named))
        return [cid for cid in left if cid is not None]
