"""One writer per worker: message batches filled across connections.

Every held connection hands its accepted frames to the :class:`Writer`, which fills
BatchWriteItem requests (25 items) from the pending frames of all connections: as soon as
25 are pending, or ``flush_interval_s`` after the oldest pending frame arrived. At the
rates most streams have, that turns one request per frame into one per batch.

What stays per connection:

* frames are stored keyed by seq, in seq order relative to that connection's earlier
  batches: a connection has at most one batch in flight, and its items are taken from
  the front of its queue;
* the checkpoint only covers a gap-free prefix: ``on_stored`` is called with the last seq
  of a connection's items once all of them are stored (UnprocessedItems are retried by the
  store, with jittered backoff, before that);
* nothing is sent past the worker's deadline (checked by ``send_deadline`` as each
  request leaves).

Fairness: queues are served oldest-first-frame first, and a batch takes at most its fair
share from each connection before filling the rest, so a chatty connection cannot starve
quiet ones of batch slots. Memory is bounded by a per-connection and a per-worker cap on
pending frames: when one is reached the receive loop waits (backpressure, counted in
``BackpressureWaits``), nothing is dropped.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .. import metrics_names as names
from ..aws import send_deadline
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import MAX_BATCH, MessagesStore
from ..stream import Frame
from .retry import LeaseExpired, call_until, first_of

Call = Callable[..., Awaitable[Any]]


@dataclass
class _Queue:
    connection_id: str
    fence_token: int
    deadline: Callable[[], float]
    on_stored: Callable[[int, int], None]  # (last seq stored, how many)
    frames: deque[tuple[Frame, float]] = field(default_factory=deque)  # (frame, arrival, monotonic)
    in_flight: bool = False
    flushing: int = 0  # callers waiting for this queue to empty
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # room freed, or emptied


class Writer:
    def __init__(
        self,
        *,
        messages: MessagesStore,
        call: Call,
        worker_id: str,
        counters: Counters,
        log: JsonLogger,
        flush_interval_s: float = 0.1,
        max_pending_per_connection: int = 1000,
        max_pending: int = 20_000,
        concurrency: int = 4,
    ) -> None:
        self._messages = messages
        self._call = call
        self._worker_id = worker_id
        self._counters = counters
        self._log = log
        self._interval = flush_interval_s
        self._cap_one = max_pending_per_connection
        self._cap_all = max_pending
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._queues: dict[str, _Queue] = {}
        # Queues with pending frames, in the order their first pending frame arrived.
        self._waiting: OrderedDict[str, _Queue] = OrderedDict()
        self._pending = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._sends: set[asyncio.Task] = set()
        self.batches = 0
        self.items = 0

    # --- what a connection calls ------------------------------------------------------

    def open(self, connection_id: str, *, fence_token: int, deadline: Callable[[], float], on_stored: Callable[[int, int], None]) -> None:
        self._queues[connection_id] = _Queue(connection_id, fence_token, deadline, on_stored)

    async def put(self, connection_id: str, frame: Frame) -> None:
        """Queue one frame; waits while the connection's or the worker's cap is reached."""
        q = self._queues[connection_id]
        waited = False
        while len(q.frames) >= self._cap_one or self._pending >= self._cap_all:
            if not waited:
                self._counters.add(names.BACKPRESSURE_WAITS)
                waited = True
            q.changed.clear()
            self._room.clear()
            await first_of(q.changed.wait(), self._room.wait())
            if connection_id not in self._queues:
                return  # closed while waiting: the connection is being dropped
        q.frames.append((frame, time.monotonic()))
        self._pending += 1
        if connection_id not in self._waiting:
            self._waiting[connection_id] = q
        if self._pending >= MAX_BATCH or len(self._waiting) == 1:
            self._wake.set()

    async def flush(self, connection_id: str) -> None:
        """Return once every frame queued so far for the connection is stored (sent at once,
        not after the flush interval). Raises :class:`LeaseExpired` if the deadline passes."""
        q = self._queues.get(connection_id)
        if q is None:
            return
        q.flushing += 1
        try:
            while q.frames or q.in_flight:
                left = q.deadline() - time.monotonic()
                if left <= 0:
                    raise LeaseExpired()
                q.changed.clear()
                self._wake.set()
                try:
                    await asyncio.wait_for(q.changed.wait(), timeout=left)
                except TimeoutError:
                    raise LeaseExpired() from None
        finally:
            q.flushing -= 1

    def close(self, connection_id: str) -> int:
        """Forget a connection; returns how many of its frames were still unwritten."""
        q = self._queues.pop(connection_id, None)
        if q is None:
            return 0
        self._waiting.pop(connection_id, None)
        dropped = len(q.frames)
        self._pending -= dropped
        q.frames.clear()
        q.changed.set()
        self._room.set()
        return dropped

    def stats(self) -> dict[str, Any]:
        return {
            "pending": self._pending,
            "batches": self.batches,
            "items_per_batch": round(self.items / self.batches, 2) if self.batches else None,
        }

    # --- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Send batches until cancelled."""
        try:
            while True:
                delay = self._due_in()
                if delay is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if delay > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=delay)
                    except TimeoutError:
                        pass
                    continue
                await self._slots.acquire()
                batch = self._take()
                if not batch:
                    self._slots.release()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                task = asyncio.create_task(self._send(batch))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)
        finally:
            for task in self._sends:
                task.cancel()

    def _ready(self) -> list[_Queue]:
        return [q for q in self._waiting.values() if not q.in_flight and q.frames]

    def _due_in(self) -> float | None:
        """Seconds until a batch is due (0: now), or None when nothing can be sent."""
        ready = self._ready()
        if not ready:
            return None
        if sum(len(q.frames) for q in ready) >= MAX_BATCH or any(q.flushing for q in ready):
            return 0.0
        oldest = min(q.frames[0][1] for q in ready)
        return max(0.0, oldest + self._interval - time.monotonic())

    def _take(self) -> list[tuple[_Queue, list[Frame]]]:
        """Up to MAX_BATCH items from the queues whose first frame is oldest. When more
        is pending than one batch holds, the ready queues are spread over as many
        concurrent batches as the pending frames fill (a connection has one batch in
        flight at a time, so one batch holding every busy connection would serialise
        them all); within a batch, each queue's fair share first, then the rest from the
        front. A queue served goes to the back."""
        ready = self._ready()
        if not ready:
            return []
        batches = min(self._concurrency, math.ceil(sum(len(q.frames) for q in ready) / MAX_BATCH))
        ready = ready[: max(1, math.ceil(len(ready) / max(1, batches)))]
        share = max(1, MAX_BATCH // len(ready))
        taken: dict[str, list[Frame]] = {}
        room = MAX_BATCH
        for limit in (share, MAX_BATCH):
            for q in ready:
                if room == 0:
                    break
                have = taken.setdefault(q.connection_id, [])
                n = min(limit - len(have), len(q.frames), room)
                for _ in range(max(0, n)):
                    have.append(q.frames.popleft()[0])
                room -= max(0, n)
        batch = []
        for q in ready:
            frames = taken.get(q.connection_id) or []
            if not frames:
                continue
            q.in_flight = True
            self._pending -= len(frames)
            self._waiting.pop(q.connection_id, None)
            if q.frames:
                self._waiting[q.connection_id] = q  # its next frame is younger: to the back
            batch.append((q, frames))
        self._room.set()
        for q, _ in batch:
            q.changed.set()
        return batch

    async def _send(self, batch: list[tuple[_Queue, list[Frame]]]) -> None:
        entries = [(q.connection_id, q.fence_token, f) for q, frames in batch for f in frames]
        try:
            # The deadline is read afresh at every retry: renewals extend it meanwhile.
            await call_until(
                self._call, lambda: min(q.deadline() for q, _ in batch), self._put, log=self._log, entries=entries
            )
        except LeaseExpired:
            # Past the deadline: these frames are never written by us, and their
            # connections are being dropped with the session (the next owner replays
            # them). Any whose deadline has moved on (it cannot, once passed, but a
            # frame is never dropped on a guess) gets its frames back, in front.
            self._log.warning("deadline_passed_while_writing", items=len(entries))
            now = time.monotonic()
            for q, frames in batch:
                q.in_flight = False
                if q.connection_id in self._queues and q.deadline() > now:
                    q.frames.extendleft((f, now) for f in reversed(frames))
                    self._pending += len(frames)
                    self._waiting[q.connection_id] = q
                    self._waiting.move_to_end(q.connection_id, last=False)
                q.changed.set()
            self._wake.set()
            return
        finally:
            self._slots.release()
        self.batches += 1
        self.items += len(entries)
        self._counters.add(names.MESSAGES_STORED, len(entries))
        for q, frames in batch:
            q.in_flight = False
            if q.connection_id in self._queues:
                q.on_stored(frames[-1].seq, len(frames))
            q.changed.set()
        self._wake.set()

    def _put(self, *, entries: list[tuple[str, int, Frame]]) -> None:
        # Runs in a pool thread, possibly long after it was queued (or after a freeze):
        # the deadline is checked as each request leaves, not when the write was decided.
        deadline = min(self._queues[c].deadline() if c in self._queues else 0.0 for c, _, _ in entries)
        with send_deadline(deadline):
            self._messages.put_many(entries, worker_id=self._worker_id)

