"""A connection held by a simulated worker, and the books that judge the run.

:class:`SimRunner` takes the place of :class:`wsfleet.worker.connection.ConnectionRunner`
(the part that opens a socket and streams frames): it "opens" after a connect time,
holds until one end reason, then does what the real runner's teardown does to the table
(the release through the product's store, after the shared flush: a handoff for a
shutdown or a shed, a free for a STOP; nothing for a lost session) and reports it the same way (``freed``, ``handed``,
``detached``), so the worker's own roles carry on from there.

:class:`Books` is the upstream's side of the story, the evidence the report trusts: when
each connection's socket opened and closed, from the runners and from ECS's kills (a
killed process's sockets close with it), never from what the workers claim. A socket
opened while another is open for the same connection is a double owner.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from wsfleet import clock
from wsfleet.store import Released, TransientError
from wsfleet.worker.runner_checkpoints import EndReason

CONNECT_S = (0.03, 0.12)  # a socket's open (TLS handshake to the upstream), uniform
# A release waits for the shared flush of what the socket received (FLUSH_INTERVAL_MS, 100
# ms by default: the next one comes 0-100 ms on) and that flush's write, as the worker's does.
FLUSH_S = 0.1
FLUSH_WRITE_S = 0.006


@dataclass
class Gap:
    reason: str  # why the socket closed: crash, shutdown, shed, stopped, lost, expired
    closed_at: float
    opened_at: float | None = None  # None: not open again yet


@dataclass
class Books:
    open: dict[str, str] = field(default_factory=dict)  # connection id -> worker holding its socket
    closed: dict[str, tuple[str, float]] = field(default_factory=dict)  # connection id -> (reason, when)
    gaps: list[Gap] = field(default_factory=list)
    doubled: int = 0  # sockets opened while another was open for the same connection
    opens: int = 0

    def opened(self, connection_id: str, worker: str, now: float) -> None:
        self.opens += 1
        if connection_id in self.open:
            self.doubled += 1
        self.open[connection_id] = worker
        shut = self.closed.pop(connection_id, None)
        if shut is not None:
            self.gaps.append(Gap(shut[0], shut[1], now))

    def close(self, connection_id: str, worker: str, reason: str, now: float) -> None:
        if self.open.get(connection_id) == worker:
            del self.open[connection_id]
            self.closed[connection_id] = (reason, now)


class Budget:
    """What a socket's frames cost (none flow here)."""

    received_bytes = 0
    loop_s = 0.0


BUDGET = Budget()


class Tracker:
    __slots__ = ("checkpoint", "next_seq")

    def __init__(self, checkpoint: int) -> None:
        self.checkpoint = checkpoint
        self.next_seq = checkpoint + 1


class SimRunner:
    """Built by the worker's :class:`~wsfleet.worker.acquisition.Acquisition` with the
    real runner's arguments (those it has no use for are ignored)."""

    books: Books  # set by the simulation before any worker starts
    rng: random.Random
    budget = BUDGET
    # A fleet holds hundreds of thousands of these: no per-instance dict.
    __slots__ = ("connection_id", "ws_url", "session_id", "fence_token", "upstream_item", "last_error", "tracker",
                 "acquired_mono", "end_reason", "shed_to", "release_trace", "detached", "freed", "handed", "worker",
                 "_deadline", "_call", "_connections", "_log", "_ended", "_open")

    def __init__(self, *, connection_id: str, ws_url: str, session_id: str, fence_token: int, checkpoint: int,
                 deadline: Any, call: Any, connections: Any, log: Any, upstream: dict | None = None,
                 last_error: str | None = None, **_: Any) -> None:
        self.connection_id, self.ws_url, self.session_id, self.fence_token = connection_id, ws_url, session_id, fence_token
        self.upstream_item = upstream or {}
        self.last_error = last_error
        self.tracker = Tracker(checkpoint)
        self.acquired_mono = clock.now()
        self.end_reason: EndReason | None = None
        self.shed_to = ""
        self.release_trace: str | None = None
        self.detached = self.freed = self.handed = False
        self.worker = session_id.rpartition("#")[0]
        self._deadline, self._call, self._connections, self._log = deadline, call, connections, log
        self._ended = asyncio.Event()
        self._open = False

    @property
    def deadline_mono(self) -> float:
        return self._deadline()

    def live(self) -> bool:
        return clock.now() < self._deadline()

    def _end(self, reason: EndReason) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            self._ended.set()

    def request_shutdown(self) -> None:
        self._end(EndReason.SHUTDOWN)

    def request_shed(self, to: str = "") -> None:
        self.shed_to = to
        self._end(EndReason.SHED)

    def request_stop(self) -> None:
        self._end(EndReason.STOPPED)

    def drop(self, reason: EndReason) -> None:
        self._end(reason)

    async def run(self) -> EndReason:
        try:
            await asyncio.wait_for(self._ended.wait(), timeout=self.rng.uniform(*CONNECT_S))
        except TimeoutError:
            self._open = True
            self.books.opened(self.connection_id, self.worker, clock.now())
            await self._ended.wait()
        reason = self.end_reason or EndReason.SHUTDOWN
        if self._open:  # the socket closes before anything is written
            self.books.close(self.connection_id, self.worker, reason.value, clock.now())
        if reason in (EndReason.STOPPED, EndReason.SHUTDOWN, EndReason.SHED):
            if self._open:
                await asyncio.sleep(self.rng.uniform(0, FLUSH_S) + FLUSH_WRITE_S)
            await self._release(reason)
        return reason

    async def _release(self, reason: EndReason) -> None:
        while self.live():
            try:
                released = await self._call(
                    self._connections.release,
                    connection_id=self.connection_id,
                    session_id=self.session_id,
                    fence_token=self.fence_token,
                    last_seq=self.tracker.checkpoint,
                    stopped=reason is EndReason.STOPPED,
                    handoff=reason in (EndReason.SHUTDOWN, EndReason.SHED),
                )
            except TransientError:
                await asyncio.sleep(0.05 + 0.1 * self.rng.random())
                continue
            self.freed = released is Released.FREE
            self.handed = released is Released.HANDED
            self.detached = not self.handed
            return
