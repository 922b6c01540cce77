"""One owned connection: hold its socket, store its frames, checkpoint them.

The connection is attached to the worker's session; keeping that alive is the
:class:`~wsfleet.worker.session.SessionKeeper`'s job, and this runner only reads the
worker's one deadline (``deadline()``): past it, nothing is written. Two tasks per
connection, driven by one :class:`ConnectionRunner`:

* stream: connect as the connection's upstream asks (:mod:`.upstream_socket`: the URL
  with ``from_seq`` or not, headers, secret headers, subprotocols; its open message sent
  right after), receive frames (read where its pointers say) and hand them to the
  worker's shared :class:`~wsfleet.worker.writer.Writer` (which batches them with other
  connections' frames), reconnect with backoff while the session holds. A refused
  handshake (or a close over budget, :mod:`.socket_budget`) waits ``refused_retry_s``
  instead, shown in ``last_error`` until a frame is accepted again. What to do with
  each frame is :mod:`.frames`' decision (the frame rules are there); whatever goes
  wrong handling one costs only that frame, and an unexpected error in the loop itself
  costs a reconnect under the same ownership, never the lease;
* checkpointer: store the checkpoint at least every ``checkpoint_s`` while frames are
  stored (never for a quiet connection), through the worker's shared
  :class:`~wsfleet.worker.checkpoints.Checkpoints`: it asks a tenth of that early, and
  its checkpoint leaves in a transaction with other connections' ones.

Both run under a :class:`~wsfleet.worker.supervision.Supervisor` (an exception is
logged, counted in ``LoopErrors``, and the task goes on). The runner ends for exactly one
reason (:class:`EndReason`: a STOP, a lost session, shutdown, a shed); its teardown closes
the socket before it releases, so a stream never has two sockets.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Awaitable, Callable

from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidHandshake, InvalidURI, PayloadTooBig

from .. import clock
from .. import metrics_names as names
from .. import tracing, upstream_spec
from ..checkpoint import Checkpoint
from ..leases import backoff_s
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import ConnectionsStore, Released
from ..stream import Problem, SeqTracker
from . import numbering
from .checkpoints import Checkpoints
from .runner_checkpoints import Checkpointing, EndReason
from .feed_health import FeedHealth, Silent
from .frame_log import UNEXPECTED, FrameLog
from .frames import CheckpointTimer
from .retry import LeaseExpired, call_until
from .runner_settings import Settings
from .secrets import Secrets, SecretUnavailable
from .socket_budget import BudgetedConnection, OverBudget, over_budget
from .supervision import Supervisor
from .upstream_socket import Dialer, Refused, close_socket, refused_pause_s
from .writer import Writer

RECONNECT_CAP_S = 10.0
HANDSHAKE_TIMEOUT = "handshake_timeout"  # last_error's first word when the open timed out


Call = Callable[..., Awaitable[Any]]


class ConnectionRunner(Checkpointing):
    def __init__(
        self,
        *,
        connection_id: str,
        ws_url: str,
        session_id: str,
        fence_token: int,
        checkpoint: int,
        stored_end: int,
        reserved: int = 0,  # an assigned-seq feed's seq_reserved, taken from a crashed owner (.numbering)
        deadline: Callable[[], float],
        settings: Settings,
        call: Call,
        connections: ConnectionsStore,
        writer: Writer,
        checkpoints: Checkpoints,
        counters: Counters,
        log: JsonLogger,
        secrets: Secrets,
        upstream: dict | None = None,
        last_error: str | None = None,
        trace_parent: str | None = None,
    ) -> None:
        self.connection_id = connection_id
        # The acquire span's trace header: the first connect continues that trace; the
        # release's, for the hint that hands the connection on.
        self._trace_parent = trace_parent
        self.release_trace: str | None = None
        self.ws_url = ws_url
        # The stored upstream item (for the release's hint) and what it says.
        self.upstream_item: dict = upstream or {}
        self._dialer = Dialer(
            ws_url,
            upstream,
            options=settings.socket_options,
            secret_prefix=settings.upstream_secret_prefix,
            region=settings.region,
            secrets=secrets,
            log=log.bind(connection_id=connection_id, fence_token=fence_token),
        )
        self.upstream = self._dialer.upstream
        self.budget = self._dialer.budget  # what its sockets measured (worker.socket_budget)
        self._shape = self.upstream.shape()
        self.health = FeedHealth(self.upstream.max_silence_seconds, clock.now())  # silence, a malformed feed
        # Its first ownership ever (fence 1) of an upstream that cannot replay (see .frames).
        self._fresh = self.upstream.resume is upstream_spec.Resume.NONE and fence_token == 1
        self.refused = False  # the last connect was refused (the RefusedConnections gauge)
        self.last_error = last_error  # the item's last_error, as far as this ownership knows
        self.session_id = session_id
        self.fence_token = fence_token
        self.acquired_mono = clock.now()
        self.shed_to = ""
        self._deadline = deadline
        # Resume after what is stored gap-free (a crashed owner may have stored past its
        # last checkpoint; an assigned-seq feed: after its reservation); the next checkpoint records it.
        assigned = self.upstream.assigned
        begin = numbering.start(assigned=assigned, checkpoint=checkpoint, stored_end=stored_end, reserved=reserved)
        self.tracker = SeqTracker(begin, assigned=assigned, fresh=fence_token == 1)
        key = dict(connection_id=connection_id, session_id=session_id, fence_token=fence_token)
        reserve = functools.partial(self._until_deadline, connections.reserve_seqs, **key)
        self._reservation = numbering.Reservation(begin, reserve) if assigned else None
        self._timer = CheckpointTimer.after(
            settings.checkpoint_s, settings.checkpoint_gather_share, Checkpoint(checkpoint), clock.now(), stored_end
        )
        self.connected = asyncio.Event()
        self.end_reason: EndReason | None = None
        self.detached = False  # the release answered: it is no longer attached to our session
        self.freed = False  # released STARTED: free for anyone, in its FREE# partition (hinted with its state)
        # Handed off (a SHUTDOWN or SHED): STARTED, still attached to our session, released
        # at our fence, for the peer its hint names (hinted with its state and our session).
        self.handed = False
        self._s = settings
        self._call = call
        self._connections = connections
        self._writer = writer
        self._checkpoints = checkpoints
        self._counters = counters
        self._log = log.bind(connection_id=connection_id, fence_token=fence_token)
        self._supervisor = Supervisor(log=self._log, counters=counters)
        self._frame_log = FrameLog(self._log)
        # Reconnect backoff: grows until a frame is accepted (not merely until a connect
        # succeeds), so an upstream that closes each socket at once is not hammered.
        self._attempt = 0
        self._stored = asyncio.Event()
        self._ended = asyncio.Event()
        self._ws: BudgetedConnection | None = None
        writer.open(connection_id, fence_token=fence_token, deadline=deadline, on_stored=self._on_stored)

    # --- ownership ----------------------------------------------------------------------

    @property
    def deadline_mono(self) -> float:
        return self._deadline()

    def live(self) -> bool:
        return clock.now() < self._deadline()

    def _end(self, reason: EndReason) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            self._ended.set()

    async def _until_deadline(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        return await call_until(self._call, self._deadline, fn, log=self._log, **kwargs)

    # --- the socket --------------------------------------------------------------------

    async def _stream(self) -> None:
        while self.live() and self.end_reason is None:
            over_limit: PayloadTooBig | None = None
            refused: Refused | OverBudget | None = None
            silent: Silent | None = None
            timed_out = False  # the handshake did not complete within the open timeout
            from_seq = self.tracker.next_seq
            try:
                parent, self._trace_parent = self._trace_parent, None
                with tracing.segment(
                    "connect",
                    parent=parent,
                    connection_id=self.connection_id,
                    session=self.session_id,
                    fence=self.fence_token,
                    from_seq=from_seq,
                ) as span:
                    ws = await self._dialer.open(from_seq)
                async with ws:
                    self._ws = ws
                    self.connected.set()
                    self.tracker.opened()
                    self.health.connected(clock.now())
                    self.refused = False
                    self._log.info("connected", from_seq=from_seq, attempt=self._attempt, **tracing.log_fields(span.header))
                    opening = self.upstream.opening(from_seq=from_seq, connection_id=self.connection_id)
                    if opening is not None:
                        await ws.send(opening)
                    try:
                        while True:
                            # Bytes, text frames too: decoding them, the socket would fail the
                            # connection (1007) on invalid UTF-8, a bad frame for the parser.
                            await self._receive(await self.health.recv(ws))
                    except ConnectionClosedOK:
                        pass
                    except Silent as exc:  # the feed stopped, the socket did not: a new one
                        silent = exc
                        ws.transport.abort()
                code = ws.close_code
            except Refused as exc:
                code, refused = None, exc
            except (OSError, TimeoutError, InvalidURI, InvalidHandshake, ConnectionClosed, SecretUnavailable) as exc:
                code = None
                if isinstance(exc, ConnectionClosed) and isinstance(exc.__cause__, PayloadTooBig):
                    over_limit = exc.__cause__  # we closed it (1009): a frame over max_frame_bytes
                refused = over_budget(exc)  # we closed it over a budget: waited out as a refusal
                timed_out = isinstance(exc, TimeoutError)
                self._log.warning("socket_error", error=f"{type(exc).__name__}: {exc}", attempt=self._attempt)
            except Exception as exc:  # noqa: BLE001 - a bug costs a reconnect, never the lease
                code = None
                self._supervisor.report("stream", exc, attempt=self._attempt)
            finally:
                self._ws = None
                self.connected.clear()
            if self.end_reason is not None:
                return
            if refused is not None:
                await self._wait_out(refused)
                continue
            if over_limit is not None:
                await self._closed_over_limit(over_limit)
            if timed_out:  # a slow or hostile handshake: GET says why the connection does not open
                await self._noted(f"{HANDSHAKE_TIMEOUT}: the upstream did not complete the WebSocket handshake in time")
            if silent is not None:
                self._counters.add(names.SILENCE_RECONNECTS)
                self._log.warning("silent_reconnect", reason=str(silent), from_seq=self.tracker.next_seq)
            delay = min(RECONNECT_CAP_S, backoff_s(self._attempt, base=0.2, cap=RECONNECT_CAP_S) + 0.05)
            self._counters.add(names.RECONNECTS)
            self._log.info("reconnecting", close_code=code, in_s=round(delay, 3), from_seq=self.tracker.next_seq)
            self._attempt += 1
            await self._pause(delay)

    async def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds, or less if the connection ends meanwhile (a STOP,
        shutdown, a shed, a lost session)."""
        try:
            await asyncio.wait_for(self._ended.wait(), timeout=delay)
        except TimeoutError:
            pass

    async def _wait_out(self, refused: Refused | OverBudget) -> None:
        """A refusal (or a close over budget): counted, shown in ``last_error`` (when its text changes),
        then ``refused_retry_s`` (jittered), cut short only by the connection's end. Never a storm."""
        self.refused = isinstance(refused, Refused)  # the RefusedConnections gauge: handshakes only
        self._counters.add(refused.counter)
        delay = refused_pause_s(self._s.refused_retry_s)
        self._log.warning(refused.event, error=refused.text, retry_in_s=round(delay, 1), attempt=self._attempt)
        self._attempt += 1
        await self._noted(refused.text)
        await self._pause(delay)

    async def _noted(self, text: str) -> None:
        """:meth:`_note_error`, whatever it meets (reported, never raised: a wait follows)."""
        try:
            await self._note_error(text)
        except Exception as exc:  # noqa: BLE001
            self._supervisor.report("last_error", exc)

    async def _note_error(self, text: str | None) -> None:
        """Write ``last_error`` (None: remove it), conditional on our session and fence,
        unless the item has it already as far as this ownership knows."""
        if text == self.last_error:
            return
        key = dict(connection_id=self.connection_id, session_id=self.session_id, fence_token=self.fence_token)
        try:
            if text is None:
                ours = await self._until_deadline(self._connections.clear_error, **key)
            else:
                ours = await self._until_deadline(self._connections.note_error, text=text, **key)
        except LeaseExpired:
            return  # the session's loss is the worker's to handle
        if not ours:
            self._log.warning("last_error_found_connection_gone")
            return self._end(EndReason.LOST)
        self.last_error = text

    async def _closed_over_limit(self, exc: PayloadTooBig) -> None:
        """The socket closed for a frame over its limit: counted toward giving up the seq
        at the resume point (:meth:`SeqTracker.closed_over_limit`); once given up, its
        marker is queued and the next connect asks for the seq after it. The backoff is
        left growing: a marker is not a frame accepted."""
        # The frame's length from its header, plus the message's earlier fragments if any.
        size = exc.size + (exc.current_size or 0) if exc.size is not None else None
        marker = self.tracker.closed_over_limit(int(time.time() * 1000), size)
        if marker is None:
            return
        self._frame_log.skip(marker, size=size)
        await self._writer.put(self.connection_id, marker)
        self.tracker.skip_over_limit(marker)

    async def _receive(self, message: bytes) -> None:
        """Hand one frame to the writer (or count it and skip it), after a gap marker if
        it jumps ahead (:func:`.frames.receive` decides). Nothing it meets ends the
        socket: an error of ours costs this frame only, logged and counted, and the next
        frame's gap marker covers its seq."""
        size = len(message)
        try:
            now_ms = int(time.time() * 1000)
            got = await self._s.decoder.receive(message, now_ms, self.tracker, self._shape, may_start_fresh=self._fresh,
                                                meter=self._ws)
            # Past parsing, not held while the put below waits for the writer (32 MiB a socket at the limit).
            del message
            if got.problem is Problem.IGNORED:
                return self._counters.add(names.IGNORED_FRAMES)  # a heartbeat, an ack: no trace
            self.health.received(clock.now(), malformed=got.problem is not None)
            if got.problem is not None:
                self._counters.add(names.MALFORMED_FRAMES)
                self._frame_log.problem(got.problem, **got.problem_fields())
            if got.start_at is not None and not await self._start_at(got.start_at):
                return
            if not got.frames:
                return  # rejected, or a replay of a frame already in hand
            if self._reservation is not None and (why := await self._reservation.cover(got.frames[-1].seq)):
                return self._end(EndReason(why))
            if got.gap is not None:
                self._frame_log.skip(got.gap)
            await self._writer.put(self.connection_id, *got.frames)  # waits while the writer is full
            self.tracker.accept(got.frames[-1].seq)  # in hand once queued (see SeqTracker)
            if got.problem is Problem.OVER_DECODE_BUDGET and self._ws is not None:
                return self._ws.close_over_decode_budget()  # its marker in hand: resumed after it
            self.health.accepted(clock.now())
            self._attempt = 0
            if got.gap is not None:
                self._counters.add(names.MISSED_SEQS, got.gap.end - got.gap.seq + 1)
            if self.last_error is not None:
                await self._note_error(None)  # connecting works again: GET stops saying otherwise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one frame never costs the connection
            self._counters.add(names.LOOP_ERRORS)
            self._frame_log.problem(UNEXPECTED, size=size, error=f"{type(exc).__name__}: {exc}", exc=exc)

    async def _start_at(self, end: int) -> bool:
        """Checkpoint ``end`` (the first frame's seq less one) before that frame is
        queued (conditional on our session and fence, as every checkpoint): a later owner
        then finds the stream's start in the item, so that a seq missing after it is a
        gap to mark, never read as "nothing stored yet". False when the connection is no
        longer ours."""
        try:
            ours = await self._until_deadline(
                self._connections.checkpoint,
                connection_id=self.connection_id,
                session_id=self.session_id,
                fence_token=self.fence_token,
                last_seq=end,
            )
        except LeaseExpired:
            self._end(EndReason.EXPIRED)
            return False
        if not ours:
            self._end(EndReason.LOST)
            return False
        self.tracker.start_at(end)
        self._timer.started(self.tracker.checkpoint)
        self._log.info("stream_starts_where_the_upstream_is", seq=end + 1)
        return True

    async def flush(self) -> None:
        """Return once every accepted frame is stored (the writer sends this connection's
        frames at once). Raises :class:`LeaseExpired` once the deadline has passed."""
        await self._writer.flush(self.connection_id)

    # --- lifecycle ---------------------------------------------------------------------

    def request_shutdown(self) -> None:
        self._end(EndReason.SHUTDOWN)

    def request_shed(self, to: str = "") -> None:
        """Hand it over to rebalance the fleet: the graceful handoff; ``to``: the session
        under its share it is meant for ("" for any)."""
        self.shed_to = to
        self._end(EndReason.SHED)

    def request_stop(self) -> None:
        """Its STOP arrived (through the session inbox or the owner index)."""
        self._end(EndReason.STOPPED)

    def drop(self, reason: EndReason) -> None:
        """The session is lost (LOST or EXPIRED): close the socket and write nothing."""
        self._end(reason)

    async def run(self) -> EndReason:
        """Hold the connection until one end reason, then tear down accordingly."""
        keep = self._supervisor.keep
        tasks = [
            asyncio.create_task(keep("stream", self._stream), name=f"stream:{self.connection_id}"),
            asyncio.create_task(keep("checkpointer", self._checkpointer), name=f"checkpointer:{self.connection_id}"),
        ]
        try:
            await self._ended.wait()
        finally:
            # Close the socket before anything else: the lease may be released (or
            # already taken) next, and a stream must never have two sockets. The
            # stream task sees end_reason and does not reconnect. A lost or expired
            # session's sockets are aborted at once: the next owner may connect any
            # moment now, and a close handshake would keep ours open meanwhile.
            abort = self.end_reason in (EndReason.LOST, EndReason.EXPIRED)
            if self._ws is not None:
                await close_socket(self._ws, abort=abort)
            self._log.info("socket_closed", aborted=abort)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        reason = self.end_reason or EndReason.SHUTDOWN
        try:
            if reason in (EndReason.STOPPED, EndReason.SHUTDOWN, EndReason.SHED):
                await self._flush_and_release()
            else:
                self._counters.add(names.LEASES_LOST)
                self._log.warning("connection_dropped", why=reason.value, unwritten=self._writer.close(self.connection_id))
        finally:
            self._writer.close(self.connection_id)
        return reason

    async def _flush_and_release(self) -> None:
        why = self.end_reason.value
        segment = dict(connection_id=self.connection_id, session=self.session_id, fence=self.fence_token, why=why)
        with tracing.segment("release", **segment) as span:
            self.release_trace = span.header
            try:
                await self.flush()
                # An error that says nothing about ownership (AccessDenied mid-deploy) is tried
                # again until the deadline: a connection we hold is never left unreleased early.
                released = await self._supervisor.retry(
                    "release",
                    lambda: self._until_deadline(
                        self._connections.release,
                        connection_id=self.connection_id,
                        session_id=self.session_id,
                        fence_token=self.fence_token,
                        last_seq=self.tracker.checkpoint, uncounted=self._timer.uncounted(),
                        stopped=self.end_reason is EndReason.STOPPED,
                        handoff=self.end_reason in (EndReason.SHUTDOWN, EndReason.SHED),
                    ),
                    deadline=self._deadline,
                )
            except LeaseExpired:
                self._counters.add(names.LEASES_LOST)
                self._log.warning("deadline_passed_before_release", unwritten=self._writer.close(self.connection_id))
                return
            self.freed = released is Released.FREE
            self.handed = released is Released.HANDED
            self.detached = not self.handed  # released now, or found no longer ours (a handoff stays attached)
            if released:
                self._counters.add(names.LEASES_RELEASED)
                self._log.info("lease_released", checkpoint=self.tracker.checkpoint, why=why)
            else:
                self._counters.add(names.LEASES_LOST)
                self._log.warning("release_found_lease_gone", checkpoint=self.tracker.checkpoint)
