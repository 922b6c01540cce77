"""One writer per worker: message batches filled across connections.

Every held connection hands its accepted frames to the :class:`Writer`, which fills
batches from the pending frames of all connections and stores them through its sink
(:mod:`wsfleet.sinks.sink`: BatchWriteItem requests of 25 items for the messages table,
PutRecords of up to 500 records for a Kinesis stream): as soon as a batch is pending, or
``flush_interval_s`` after the oldest pending frame arrived. At the rates most streams
have, that turns one request per frame into one per batch.

With a stream, the checkpoint rules below hold as they are: ``on_stored`` is called once
the sink acknowledged every record of the batch (a partly refused PutRecords is sent
again by the sink before it returns), so the checkpoint is never ahead of the stream.

What stays per connection:

* frames are stored keyed by seq, in seq order relative to that connection's earlier
  batches: a connection has at most one batch in flight, and its items are taken from
  the front of its queue;
* the checkpoint only covers a gap-free prefix: ``on_stored`` is called with the last seq
  a connection's items stand for (a range marker's ``skip_to``) once all of them are
  stored (UnprocessedItems are retried by the store, with jittered backoff, before that),
  and the connection's :class:`~wsfleet.checkpoint.Checkpoint` advances to it;
* nothing is sent past the worker's deadline (checked by ``send_deadline`` as each
  request leaves).

Data too large for an item (over ``stream.MAX_MESSAGE_BYTES``) goes to an S3 object
first (:mod:`wsfleet.sinks.objects`), and its item, which points at the object, is
written only once the object is stored:

* the upload starts as soon as the frame is queued, worker-wide at most
  ``upload_concurrency`` at a time, in a task of its own, not in a batch: a 32 MiB upload
  holds no batch slot, so the small frames of other connections go on being written
  while it runs, and once it is stored the frame's small item joins an ordinary batch;
* a connection's queue is sent from its front only up to its first frame whose object is
  not stored yet: its later frames wait behind it, so its seq order and the gap-free
  checkpoint are as for any frame;
* the frame stays in its queue until its item is stored: an upload that fails is retried
  like a batch (until the deadline), and a cancelled one is started again when the loop
  runs again; a stored object is kept for the item's retries and never uploaded twice by
  one owner (a replay after a takeover rewrites the same key);
* data over ``max_data_bytes`` (the frame limit: re-encoding can grow data that was
  escaped) is stored as an ``over_frame_limit`` skip marker instead.

Whatever the store answers, no batch holds up the others and no queue stays in flight:

* a batch the store refuses as invalid (a ValidationException, or a value the client
  cannot serialise) is split in halves until the item is found; that item is stored as a
  skip marker instead (counted in ``MalformedFrames``), and a marker refused too is
  dropped, counted in ``FramesDropped`` and logged as an error;
* every skip marker stored, whoever made it (the parser, the stream, that split), is
  counted in ``SkippedFrames`` once the store has it;
* any other failure that is not transient (AccessDenied or ResourceNotFound during a
  deploy, a bug) is logged, counted in ``LoopErrors`` and the batch sent again after a
  capped backoff, until the deadline: its queues wait, nothing is dropped;
* a connection's queue leaves ``in_flight`` and the batch frees its slot whatever
  happened; frames not stored (the deadline passed, or the send was cancelled) go back
  to the front of their queue.

Fairness: queues are served oldest-first-frame first, and a batch takes at most its fair
share from each connection before filling the rest, so a chatty connection cannot starve
quiet ones of batch slots; a connection with a whole batch pending goes in a batch of its
own, so that its partition's throttling (it is written faster than the store takes it)
keeps no other connection's frames waiting in flight.

Memory is bounded by a per-connection and a per-worker cap on pending frames, and by a
cap on the bytes of data held (``max_pending_bytes``, the
writer's share of the worker's budget, :mod:`wsfleet.budget`): counted from the
hand-over until the frame is stored or given up, in flight included, so that large data
being uploaded still counts. When a cap is reached the receive loop waits (backpressure,
counted in ``BackpressureWaits``), nothing is dropped; a frame is always taken when the
writer holds no bytes, so one larger than the cap cannot wedge it.

Received to stored: each pending frame keeps the time (:func:`wsfleet.clock.now`) it was
handed to the writer, and when its batch is stored, ``now - handed`` goes into a
:class:`~wsfleet.worker.latency.Latency` histogram; the ``stats`` line shows p50 / p99 /
max over a rolling window (the last 50-60 s by default) and the cumulative histogram.

What goes into a batch and what becomes of it is decided in :mod:`.batches` (no I/O);
this module drives it: the tasks, the events receive loops wait on, the store's calls.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from .. import clock
from .. import metrics_names as names
from ..aws import send_deadline
from ..checkpoint import Tally
from ..logs import JsonLogger
from ..metrics import Counters
from ..config import DEFAULT_MAX_FRAME_BYTES
from ..sinks import InvalidItem, ObjectsStore, Sink, StoredObject, data_size, needs_object
from ..stream import Frame
from . import batches
from .batches import Batch, Entry, Lane, Pending, frame_bytes, within_limit
from .latency import Latency
from .retry import DEADLINE_POLL_S, LeaseExpired, call_until, first_of, woken_or_timeout
from .supervision import Supervisor

Call = Callable[..., Awaitable[Any]]
T = TypeVar("T")

# Pending frames a connection, and the whole worker, may have before receive loops wait.
MAX_PENDING_PER_CONNECTION = 1000
MAX_PENDING = 20_000
# Large-data uploads in flight at once, worker-wide: each holds a pool thread.
UPLOAD_CONCURRENCY = 4


@dataclass(kw_only=True)
class _Queue(Lane):
    """A connection's lane, with what the driver keeps for it."""

    deadline: Callable[[], float]
    on_stored: Callable[[int, Tally], None]  # (last seq stored, what it adds to the connection's counts)
    uploads: dict[int, asyncio.Task] = field(default_factory=dict)  # by seq: large data being stored
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # room freed, or emptied


class Writer:
    def __init__(
        self,
        *,
        messages: Sink,
        objects: ObjectsStore,
        call: Call,
        worker_id: str,
        counters: Counters,
        log: JsonLogger,
        flush_interval_s: float = 0.1,
        max_pending_per_connection: int = MAX_PENDING_PER_CONNECTION,
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int | None = None,
        concurrency: int = 4,
        upload_concurrency: int = UPLOAD_CONCURRENCY,
        max_data_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        latency_window_s: float = 60.0,
    ) -> None:
        self._messages = messages
        self._objects = objects
        self._max_data_bytes = max_data_bytes
        self._upload_slots = asyncio.Semaphore(upload_concurrency)
        self._uploads: set[asyncio.Task] = set()
        self._call = call
        self._worker_id = worker_id
        self._counters = counters
        self._log = log
        self._supervisor = Supervisor(log=log, counters=counters)
        self._pending = Pending(
            # Entries per put_many: the table's BatchWriteItem (25), a stream's PutRecords (500).
            batch=messages.max_batch,
            concurrency=concurrency,
            interval_s=flush_interval_s,
            max_per_lane=max_pending_per_connection,
            max_frames=max_pending,
            max_bytes=max_pending_bytes,
        )
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._queues: dict[str, _Queue] = {}
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._sends: set[asyncio.Task] = set()
        self.batches = 0
        self.items = 0
        self.latency = Latency(latency_window_s)

    # --- what a connection calls ------------------------------------------------------

    def open(
        self, connection_id: str, *, fence_token: int, deadline: Callable[[], float], on_stored: Callable[[int, Tally], None]
    ) -> None:
        self._queues[connection_id] = _Queue(
            connection_id=connection_id, fence_token=fence_token, deadline=deadline, on_stored=on_stored
        )

    async def put(self, connection_id: str, *frames: Frame) -> None:
        """Queue frames of one connection, in seq order; waits while the connection's or
        the worker's cap is reached, then queues them all at once (no await between
        them: a cancelled put queues none). Large data starts its upload at once."""
        q = self._queues[connection_id]
        frames = tuple(self._within_limit(connection_id, f) for f in frames)
        size = sum(frame_bytes(f) for f in frames)
        waited = False
        while self._pending.full(q, size):
            if not waited:
                self._counters.add(names.BACKPRESSURE_WAITS)
                waited = True
            q.changed.clear()
            self._room.clear()
            await first_of(q.changed.wait(), self._room.wait())
            if connection_id not in self._queues:
                return  # closed while waiting: the connection is being dropped
        wake = self._pending.add(q, frames, size, clock.now())
        for frame in frames:
            self._upload(q, frame)
        if wake:
            self._wake.set()

    def _within_limit(self, connection_id: str, frame: Frame) -> Frame:
        checked = within_limit(frame, self._max_data_bytes)
        if checked is not frame:
            self._counters.add(names.MALFORMED_FRAMES)
            self._log.warning("frame_over_limit", connection_id=connection_id, seq=frame.seq, data_bytes=data_size(frame))
        return checked

    async def flush(self, connection_id: str) -> None:
        """Return once every frame queued so far for the connection is stored (sent at once,
        not after the flush interval). Raises :class:`LeaseExpired` if the deadline passes:
        read afresh at every step of the wait, as renewals move it meanwhile."""
        q = self._queues.get(connection_id)
        if q is None:
            return
        q.flushing += 1
        try:
            while q.frames or q.in_flight:
                left = q.deadline() - clock.now()
                if left <= 0:
                    raise LeaseExpired()
                self._wake.set()
                await woken_or_timeout(q.changed, min(left, DEADLINE_POLL_S))
        finally:
            q.flushing -= 1

    def close(self, connection_id: str) -> int:
        """Forget a connection; returns how many of its frames were still unwritten."""
        q = self._queues.pop(connection_id, None)
        if q is None:
            return 0
        dropped = self._pending.drop(q)
        for task in q.uploads.values():
            task.cancel()
        q.changed.set()
        self._room.set()
        return dropped

    def stats(self) -> dict[str, Any]:
        return {
            "pending": self._pending.count,
            "uploading": len(self._uploads),
            "pending_bytes": self._pending.bytes,
            "pending_bytes_max": self._pending.bytes_high_water,
            "batches": self.batches,
            "items_per_batch": round(self.items / self.batches, 2) if self.batches else None,
            "received_to_stored_ms": self.latency.summary(),
            "received_to_stored_hist": self.latency.cumulative(),
        }

    # --- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Send batches until cancelled, which cancels the batches in flight. An exception
        ends only this loop (the worker's supervisor runs it again): batches and uploads in
        flight go on. Uploads cancelled with an earlier run start again."""
        for q in self._queues.values():
            for frame, _ in q.frames:
                self._upload(q, frame)
        try:
            while True:
                delay = self._pending.due_in(clock.now())
                if delay is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if delay > 0:
                    await woken_or_timeout(self._wake, delay)
                    continue
                await self._slots.acquire()
                try:
                    batch = self._take()
                except BaseException:
                    self._slots.release()
                    raise
                if not batch:
                    self._slots.release()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                task = asyncio.create_task(self._send(batch))
                self._sends.add(task)
                task.add_done_callback(self._send_done)
        except asyncio.CancelledError:
            for task in (*self._sends, *self._uploads):
                task.cancel()
            raise

    def _send_done(self, task: asyncio.Task) -> None:
        self._sends.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._supervisor.report("writer", task.exception())

    def _take(self) -> Batch:
        """The next batch (:meth:`Pending.take`); its frames leave the caps' count."""
        batch = self._pending.take()
        self._room.set()
        for q, _ in batch:
            q.changed.set()
        return batch

    async def _send(self, batch: Batch) -> None:
        entries, objects = batches.entries(batch), batches.objects(batch)
        stored = False
        try:
            # The deadline is read afresh at every retry: renewals extend it meanwhile.
            await self._store(entries, lambda: min(q.deadline() for q, _ in batch), objects)
            stored = True
        except LeaseExpired:
            self._log.warning("deadline_passed_while_writing", items=len(entries))
        finally:
            self._slots.release()
            self._sent(batch, stored)

    def _sent(self, batch: Batch, stored: bool) -> None:
        """The batch is over (:meth:`Pending.settle` says what becomes of its frames):
        stored, each connection hears up to which seq; not stored, its frames are back
        in front of their queues."""
        now = clock.now()
        settled = self._pending.settle(
            batch,
            stored=stored,
            is_open=lambda lane: self._queues.get(lane.connection_id) is lane,
            # Once passed, a deadline cannot move on, but a frame is never dropped on a guess.
            is_live=lambda lane: lane.deadline() > now,
        )
        if stored:
            self.batches += 1
            self.items += sum(len(frames) for _, frames in batch)
            self.latency.record(now, (t for _, frames in batch for _, t in frames))
            self._counters.add(names.MESSAGES_STORED, sum(len(frames) for _, frames in batch))
            if settled.large:
                self._counters.add(names.LARGE_FRAMES, settled.large)
        for q, _ in batch:
            q.changed.set()
        if settled.freed:
            self._room.set()
        for q, end, counts in settled.stored:
            try:
                q.on_stored(end, counts)
            except Exception as exc:  # noqa: BLE001 - one runner's callback must not cost the others theirs
                self._supervisor.report("writer", exc, connection_id=q.connection_id)
        self._wake.set()

    async def _store(
        self,
        entries: list[Entry],
        deadline: Callable[[], float],
        objects: Mapping[tuple[str, int], StoredObject],
    ) -> None:
        """Store the entries whatever the store answers (see the module docstring): raises
        only :class:`LeaseExpired`, once the deadline has passed. ``objects``: the stored
        objects of the large ones."""
        try:
            await self._until_done(self._put, deadline, passes=(InvalidItem,), entries=entries, objects=objects)
        except InvalidItem as exc:
            refused = exc
        else:
            if markers := sum(1 for _, _, f in entries if f.is_marker):
                self._counters.add(names.SKIPPED_FRAMES, markers)
            return
        then = batches.refusal(entries)
        if then.dropped is not None:
            connection_id, _, frame = then.dropped
            self._counters.add(names.FRAMES_DROPPED)
            self._log.error("frame_dropped", connection_id=connection_id, seq=frame.seq, error=str(refused))
        if then.malformed is not None:
            connection_id, _, frame = then.malformed
            self._counters.add(names.MALFORMED_FRAMES)
            self._log.warning("frame_refused_by_store", connection_id=connection_id, seq=frame.seq, error=str(refused))
        for part in then.again:
            await self._store(part, deadline, objects)

    async def _until_done(
        self,
        fn: Callable[..., T],
        deadline: Callable[[], float],
        /,
        *,
        passes: tuple[type[Exception], ...] = (),
        **kwargs: Any,
    ) -> T:
        """``fn(**kwargs)`` in the pool until it returns, for items and objects alike: a
        transient fault retried with jittered backoff (:func:`call_until`), any other
        reported and retried after a capped backoff (the supervisor), until the
        deadline, then :class:`LeaseExpired`. The ``passes`` exceptions go to the caller."""
        return await self._supervisor.retry(
            "writer",
            lambda: call_until(self._call, deadline, fn, log=self._log, **kwargs),
            deadline=deadline,
            passes=passes,
        )

    def _put(self, *, entries: list[Entry], objects: Mapping[tuple[str, int], StoredObject]) -> None:
        # Runs in a pool thread, possibly long after it was queued (or after a freeze):
        # the deadline is checked as each request leaves, not when the write was decided,
        # and read afresh at each: a sink's own retries inside one call (the stream's
        # rounds, the table's unprocessed items) follow the renewals, so a slow store is
        # not refused for a deadline the worker has long since moved on. A queue closed
        # meanwhile (a new owner may have the connection) has none left, even if this
        # worker has opened the connection again since (queued before this thread ran):
        # the queue must be the one of the entries' fence, not the next acquisition's.
        queues: dict[str, _Queue | None] = {}
        for c, fence, _ in entries:  # (a connection's entries share its fence)
            q = self._queues.get(c)
            queues[c] = q if q is not None and q.fence_token == fence else None

        def deadline() -> float:
            return min(q.deadline() if q is not None and self._queues.get(c) is q else 0.0 for c, q in queues.items())

        with send_deadline(deadline):
            self._messages.put_many(entries, worker_id=self._worker_id, objects=objects)

    # --- large data ---------------------------------------------------------------------

    def _upload(self, q: _Queue, frame: Frame) -> None:
        """Start storing a large frame's object, unless it needs none, or it is stored or
        on its way."""
        if not needs_object(frame) or frame.seq in q.objects or frame.seq in q.uploads:
            return
        task = asyncio.create_task(self._store_object(q, frame))
        q.uploads[frame.seq] = task
        self._uploads.add(task)
        task.add_done_callback(functools.partial(self._upload_done, q, frame.seq))

    async def _store_object(self, q: _Queue, frame: Frame) -> None:
        """Upload until stored, whatever S3 answers, as :meth:`_store` does for items.
        Past the connection's deadline it sends nothing; the frame stays queued, and the
        connection is being dropped with the session (the next owner replays it), which
        cancels this. Should the deadline move on after all (a renewal answered late),
        it goes on: a frame is never left without its upload on a guess."""
        while True:
            try:
                async with self._upload_slots:
                    stored = await self._until_done(self._put_object, q.deadline, q=q, frame=frame)
                break
            except LeaseExpired:
                self._log.warning("deadline_passed_while_uploading", connection_id=q.connection_id, seq=frame.seq)
                while q.deadline() <= clock.now():
                    await asyncio.sleep(DEADLINE_POLL_S)
        q.objects[frame.seq] = stored
        self._wake.set()

    def _put_object(self, *, q: _Queue, frame: Frame) -> StoredObject:
        # In a pool thread, as _put: a connection closed meanwhile (a new owner may have
        # it) has no deadline left.
        assert frame.data_json is not None
        with send_deadline(q.deadline() if self._queues.get(q.connection_id) is q else 0.0):
            return self._objects.put(q.connection_id, frame.seq, frame.data_json)

    def _upload_done(self, q: _Queue, seq: int, task: asyncio.Task) -> None:
        self._uploads.discard(task)
        if q.uploads.get(seq) is task:
            del q.uploads[seq]
        if not task.cancelled() and task.exception() is not None:
            self._supervisor.report("writer", task.exception(), connection_id=q.connection_id)

