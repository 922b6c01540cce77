"""What this worker holds: its connections' runners, the connections it is acquiring,
the tasks that hold them, and what follows from those counts (its room, its load, where
it stands against the fleet summary).

One object, read and changed through the methods below by the roles that take and give
up connections (:mod:`.acquisition`, :mod:`.intake`, :mod:`.takeover`, :mod:`.balancer`,
:mod:`.stops`, :mod:`.shutdown`). It does no I/O.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Callable

from .. import clock
from ..store import now_ms
from .connection import ConnectionRunner
from .decide import Held, Standing
from .summary import FleetSummary

SHED_COOLDOWN_S = 60.0  # the shedder's free scan leaves what it shed alone this long


class Holdings:
    def __init__(
        self, *, max_connections: int, summary: FleetSummary, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        self.max_connections = max_connections
        self.runners: dict[str, ConnectionRunner] = {}  # by connection id
        self.last_acquired_ms = 0  # clock_ms() of the latest acquisition
        # Set when a connection ends or an acquisition finishes: a full worker's hint
        # pollers look at the room again.
        self.capacity_freed = asyncio.Event()
        self._acquiring: set[str] = set()
        self._holders: set[asyncio.Task] = set()
        self._holding: dict[str, asyncio.Task] = {}  # connection id -> its holder task
        self._shed_at: dict[str, float] = {}  # connection id -> clock.now() when we shed it
        self._summary = summary
        self._clock_ms = clock_ms

    # --- counts ------------------------------------------------------------------------

    def count(self) -> int:
        """Connections held here (what the session's renewals report)."""
        return len(self.runners)

    def taken(self) -> int:
        """Connections held here and being acquired: this worker's load."""
        return len(self.runners) + len(self._acquiring)

    def free(self) -> int:
        return self.max_connections - self.taken()

    def load(self) -> float:
        return 1 - self.free() / self.max_connections

    def standing(self, me: str) -> Standing:
        """Where this worker (session ``me``) stands against the fresh fleet summary now."""
        return Standing(self.taken(), self.max_connections, self._summary.fresh(), me)

    # --- one connection ------------------------------------------------------------------

    def holds(self, connection_id: str) -> bool:
        """A runner of ours holds it."""
        return connection_id in self.runners

    def busy(self, connection_id: str) -> bool:
        """Held here or being acquired."""
        return connection_id in self.runners or connection_id in self._acquiring

    def acquiring(self, connection_id: str) -> bool:
        return connection_id in self._acquiring

    def ending(self, connection_id: str) -> bool:
        """Held here but being released (a STOP, a shed, a shutdown)."""
        runner = self.runners.get(connection_id)
        return runner is not None and runner.end_reason is not None

    def held_ids(self) -> list[str]:
        return list(self.runners)

    def costs(self) -> dict[tuple[str, int], tuple[int, float]]:
        """What each ownership held here (connection id, fence) cost so far: bytes its
        sockets received, loop seconds its frames took (:class:`.socket_budget.BudgetStats`).
        :class:`wsfleet.crash_loop.SuspectWatch` names a suspect from them."""
        return {(r.connection_id, r.fence_token): (r.budget.received_bytes, r.budget.loop_s) for r in self.runners.values()}

    def held(self) -> list[Held]:
        """What the balancer may move, as :func:`.decide.choose_shed` reads it."""
        return [Held(r.connection_id, r.acquired_mono, r.end_reason is not None) for r in self.runners.values()]

    # --- taking and letting go --------------------------------------------------------------

    def begin_acquiring(self, connection_id: str) -> None:
        self._acquiring.add(connection_id)

    def end_acquiring(self, connection_id: str) -> None:
        self._acquiring.discard(connection_id)
        self.capacity_freed.set()

    def hold(self, runner: ConnectionRunner, task: asyncio.Task) -> None:
        """``runner`` is ours, held by ``task`` (which calls :meth:`let_go` at its end)."""
        self.runners[runner.connection_id] = runner
        self.last_acquired_ms = self._clock_ms()
        self._holders.add(task)
        self._holding[runner.connection_id] = task
        task.add_done_callback(self._holders.discard)
        task.add_done_callback(functools.partial(self._holder_done, runner.connection_id))

    def let_go(self, runner: ConnectionRunner) -> None:
        """``runner``'s connection is no longer held here."""
        self.runners.pop(runner.connection_id, None)
        self.capacity_freed.set()

    def _holder_done(self, connection_id: str, task: asyncio.Task) -> None:
        if self._holding.get(connection_id) is task:
            del self._holding[connection_id]

    def holder(self, runner: ConnectionRunner) -> asyncio.Task | None:
        """The task still holding ``runner``; None once it ended (a STOP, a lost session)."""
        task = self._holding.get(runner.connection_id)
        if task is None or task.done() or self.runners.get(runner.connection_id) is not runner:
            return None
        return task

    def holders(self) -> list[asyncio.Task]:
        """The holder tasks still running."""
        return [t for t in self._holders if not t.done()]

    # --- what we shed ------------------------------------------------------------------------

    def shed(self, connection_id: str) -> None:
        now = clock.now()
        self._shed_at = {c: t for c, t in self._shed_at.items() if now - t < SHED_COOLDOWN_S}
        self._shed_at[connection_id] = now

    def shed_recently(self, connection_id: str) -> bool:
        """Shed by us less than ``SHED_COOLDOWN_S`` ago: our free scan leaves it alone."""
        at = self._shed_at.get(connection_id)
        return at is not None and clock.now() - at < SHED_COOLDOWN_S
