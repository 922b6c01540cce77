"""What this worker handed off and nobody has taken yet.

A graceful release (a SHUTDOWN or a SHED) hands a connection to a peer instead of
passing it through ``FREE#``: the release writes the checkpoint and marks it released at
its fence (``released_fence``) while it stays attached to our session (no index key
moves), and the hint names our session and carries that state, so the taker sends one
transaction pinned to session, fence and mark (:meth:`ConnectionsStore.acquire_many`);
a shed meant for one worker is moved to its session instead (:mod:`.moves`), and
forgotten here once moved.
From then on this worker never writes that connection again, except to give it up the
old way when the handoff failed:

* nobody took it within :data:`HANDOFF_CLAIM_S` (a hint lost, or declined by everyone):
  :meth:`Handoffs.check_once` reads it consistently and, if it is still attached to our
  session and released at that fence, frees it into its ``FREE#`` partition
  (conditional on both) and hints it as free: counted in ``HandoffsUnclaimed``;
* at shutdown, what is still unclaimed a moment after the hints is hinted once more
  (:meth:`Handoffs.hint_again`);
* a STOP arrives for it in our session's inbox (the router posts a STOP to the session a
  connection is attached to): :meth:`Handoffs.stop` frees it, STOPPED, out of the index.

Either write is conditional on session, fence and mark, so it races a taker safely:
exactly one lands. At shutdown what is left handed off stays attached to the ended
session, in the ring, for its watchers to drain like any ENDED session's (and for the
takers of the hints, whose acquisitions need no LIVE session of the releaser). A worker
that dies before either loses only this memory: the sweep repairs what a LIVE session
leaves handed off for longer than :data:`~wsfleet.leases.HANDOFF_UNREACHABLE_MS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .. import clock, schema
from .. import metrics_names as names
from ..balance import SHED_ANYONE_AFTER_S
from ..leases import released_at_fence
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import ConnectionsStore, Released
from .attached import Attachments
from .hints import Hints

# A shed hint is for anyone after SHED_ANYONE_AFTER_S; a hint comes back from a declining
# poll within a second or two more. Past this, nobody is taking it.
HANDOFF_CLAIM_S = SHED_ANYONE_AFTER_S + 4.0
CHECK_EVERY_S = 2.0  # how often what is past its claim time is looked at

Call = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Handoff:
    session_id: str
    fence_token: int
    released: dict  # the hint's state (schema.released_state), for a hint as free
    at: float  # clock.now() of the release


class Handoffs:
    def __init__(
        self,
        *,
        connections: ConnectionsStore,
        call: Call,
        hints: Hints,
        attachments: Attachments,
        counters: Counters,
        log: JsonLogger,
        claim_s: float = HANDOFF_CLAIM_S,
        clock: Callable[[], float] = clock.now,
    ) -> None:
        """``attachments``: what may be attached to our session; a handoff known to be no
        longer attached to its session (taken by another, freed, gone) is dropped from it,
        as a release that detached would have been."""
        self.last_at = float("-inf")  # clock() of our last handoff
        self._pending: dict[str, Handoff] = {}
        self._connections = connections
        self._call = call
        self._hints = hints
        self._attachments = attachments
        self._counters = counters
        self._log = log
        self._claim_s = claim_s
        self._clock = clock

    def handed(self, connection_id: str, *, session_id: str, fence_token: int, released: dict) -> None:
        """A release of ours landed as a handoff (Released.HANDED)."""
        self.last_at = self._clock()
        self._pending[connection_id] = Handoff(session_id, fence_token, dict(released), self.last_at)

    def moved(self, connection_id: str) -> None:
        """A handoff of ours was moved to its target's session (:mod:`.moves`): no longer
        attached to ours, nothing more to check."""
        handoff = self._pending.pop(connection_id, None)
        if handoff is not None:
            self._attachments.detached(connection_id, handoff.session_id)

    def pending(self, connection_id: str) -> bool:
        """Handed off by us and not known to be taken or freed."""
        return connection_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    async def _still_handed(self, connection_ids: list[str]) -> tuple[list[str], list[str]]:
        """Of these pending handoffs: those a consistent read finds still attached to
        their session and released at their fence; and those it finds free at their
        fence, STARTED (given back by us, and their hint perhaps never sent: a give-up
        whose hint failed, or was cancelled with the handoffs loop at SIGTERM), for the
        caller to hint as free and forget. The others are forgotten (taken, stopped or
        gone)."""
        handed: list[str] = []
        given_back: list[str] = []
        items = await self._call(self._connections.get_many, connection_ids) if connection_ids else {}
        for connection_id, item in items.items():
            handoff = self._pending.get(connection_id)
            if handoff is None:
                continue
            if item is not None and _still_handed(item, handoff):
                handed.append(connection_id)
                continue
            if item is None or item.get(schema.LEASE_SESSION) != handoff.session_id:
                self._attachments.detached(connection_id, handoff.session_id)
            if item is not None and _free_at_fence(item, handoff):
                given_back.append(connection_id)
            else:
                self._pending.pop(connection_id, None)
        return handed, given_back

    async def _hint_given_back(self, connection_ids: list[str]) -> None:
        """Hint as free, then forget, what we gave back (its first hint perhaps lost)."""
        for connection_id in connection_ids:
            await self._hints.hint(connection_id, released=_free_state(self._pending[connection_id]))
            self._pending.pop(connection_id, None)
        if connection_ids:
            self._log.info("handoffs_given_back_hinted", count=len(connection_ids))

    async def hint_again(self) -> int:
        """Hint once more, as before, every pending handoff still unclaimed: a leaving
        worker's last step, a moment after its handoffs' hints (a hint can be lost: taken
        by the in-flight poll of a worker that was just killed, say; its watchers would
        find it only at their next read of its ended session); and, as free, one we gave
        back whose hint may not have been sent. A taker that finds it taken meanwhile is
        refused at no write. Returns how many it hinted as handed off."""
        unclaimed, given_back = await self._still_handed(sorted(self._pending))
        await self._hint_given_back(given_back)
        for connection_id in unclaimed:
            await self._hints.hint(connection_id, released=self._pending[connection_id].released)
        if unclaimed:
            self._log.info("handoffs_hinted_again", count=len(unclaimed))
        return len(unclaimed)

    async def check_once(self) -> int:
        """Free (and hint as free) what was handed off over ``claim_s`` ago and is still
        attached to its session, released at its fence; hint as free again what we gave
        back and may not have hinted; forget what was taken. Returns how many it freed."""
        now = self._clock()
        due = sorted(c for c, h in self._pending.items() if now - h.at >= self._claim_s)
        handed, given_back = await self._still_handed(due)
        await self._hint_given_back(given_back)
        freed = 0
        for connection_id in handed:  # nobody claimed it: give it up
            freed += await self._free(connection_id, self._pending[connection_id]) is Released.FREE
        return freed

    async def stop(self, connection_id: str, fence_token: int) -> bool:
        """A STOP for a connection we handed off at ``fence_token`` came to our session's
        inbox before anyone took it: free it (STOPPED, conditional on our session, the
        fence and the mark). True when we freed it; False when it is not one of ours
        (nothing written) or was taken first (its taker's inbox gets the STOP)."""
        handoff = self._pending.get(connection_id)
        if handoff is None or handoff.fence_token != fence_token:
            return False
        landed = await self._free(connection_id, handoff, stopped=True)
        self._log.info("handoff_stopped", connection_id=connection_id, landed=landed.value)
        return landed is not Released.LOST

    async def _free(self, connection_id: str, handoff: Handoff, *, stopped: bool = False) -> Released:
        """Free a handoff (:meth:`ConnectionsStore.free_released`; ``stopped``: for a
        STOP) and, when it lands free and STARTED, hint it as free: a give-up, counted
        unclaimed, or a STOP's that a START followed (the START hinted nothing: it found
        it attached). Taken meanwhile (LOST), or STOPPED: nothing to hint. It is
        forgotten only once the hint is sent: one cancelled or failed in between is
        found free at its fence by the next :meth:`check_once` or :meth:`hint_again`,
        which hint it."""
        landed = await self._call(
            self._connections.free_released,
            connection_id,
            session_id=handoff.session_id,
            fence_token=handoff.fence_token,
            stopped=stopped,
        )
        if landed:
            self._attachments.detached(connection_id, handoff.session_id)
        if landed is Released.FREE:
            if not stopped:
                self._counters.add(names.HANDOFFS_UNCLAIMED)
                self._log.warning("handoff_unclaimed", connection_id=connection_id, fence_token=handoff.fence_token)
            await self._hints.hint(connection_id, released=_free_state(handoff))
        self._pending.pop(connection_id, None)
        return landed


def _still_handed(item: dict, handoff: Handoff) -> bool:
    return (
        item.get(schema.LEASE_SESSION) == handoff.session_id
        and int(item.get(schema.FENCE_TOKEN, -1)) == handoff.fence_token
        and released_at_fence(item)
    )


def _free_at_fence(item: dict, handoff: Handoff) -> bool:
    """Free and STARTED at the handoff's fence: given back, and taken by nobody since."""
    return (
        item.get(schema.DESIRED_STATE) == schema.STARTED
        and item.get(schema.LEASE_SESSION, "") == ""
        and int(item.get(schema.FENCE_TOKEN, -1)) == handoff.fence_token
    )


def _free_state(handoff: Handoff) -> dict:
    """The hint's state for the handoff given back: free (no session)."""
    return {k: v for k, v in handoff.released.items() if k != schema.LEASE_SESSION}
