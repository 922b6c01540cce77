"""The worker's lifecycle: wires the roles together and runs them.

* :class:`~.session.SessionKeeper` keeps the worker's one session alive (its deadline
  governs every write) and brings back the STOPs posted to it;
* :class:`~.takeover.Takeover` watches the ring, ends dead sessions and drains them, and
  scans for STARTED connections nobody owns;
* :class:`~.intake.Intake` takes START hints from SQS and hints peers;
* one :class:`~.connection.ConnectionRunner` per held connection.

This module owns what ties them: acquiring a connection into a runner, the audit of what
the owner index says we hold, losing the session (drop everything, open a new one),
metrics, and graceful shutdown. ``Worker.try_acquire``, ``audit_once``, the keeper's
``renew_once`` and the takeover's ``watch_once`` / ``reconcile_once`` are the run-once
steps tests can drive one at a time.
"""

from __future__ import annotations

import asyncio
import functools
import resource
from collections import deque
from typing import Any, Awaitable, Callable

from .. import clock
from .. import metrics_names as names
from .. import schema, tracing
from ..aws import Aws
from ..config import WorkerConfig
from ..balance import declines_shed_hint, hints_per_poll, is_summarizer, under_target
from ..leases import SessionTiming, reconcile_pause_s
from ..logs import JsonLogger
from ..metrics import Counters, metric_data
from ..sinks import ObjectsStore
from ..store import (
    MAX_TRANSACTION,
    Acquired,
    ConnectionsStore,
    NotAcquired,
    SessionsStore,
    TransientError,
    now_ms,
)
from ..validation import Allowlist
from .acquirer import Acquirer
from .attached import Attachments
from .balancer import Balancer
from .budget import MemoryBudget
from .checkpoints import Checkpoints
from .connection import ConnectionRunner, EndReason, Settings
from .gate import ReceiveGate
from .handoffs import CHECK_EVERY_S, Handoffs
from .intake import HINT_POLLERS, Intake
from .retry import LeaseExpired, call_until, first_of
from .secrets import Secrets
from .session import Lost, SessionKeeper
from ..sinks.build import build_sink
from .supervision import Supervisor
from .sweep import PAGE_PAUSE_S, Sweeper
from .takeover import Takeover
from .writer import Writer

SHUTDOWN_MARGIN_S = 1.0  # kept back from the budget for the final log line and exit
HINT_GRACE_S = 0.5  # at shutdown, how long our in-flight polls get to return our own hints
LAG_PROBE_S = 0.25  # how often the event-loop lag probe wakes up
FULL_RECHECK_S = 1.0  # a full worker's hint pollers look again at least this often
AUDIT_EVERY = 3  # the owner-index audit runs every AUDIT_EVERY reconcile intervals
AUDIT_GRACE_S = 15.0  # a connection acquired this recently may not be in the index yet
# Acquisitions in flight at once: a burst of thousands (a START storm, a big takeover) is
# taken at the pace the table answers instead of flooding the request pool. Those asked
# for together leave in transactions of MAX_TRANSACTION (worker.acquirer): four of them.
ACQUIRE_CONCURRENCY = 4 * MAX_TRANSACTION
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
HANDING_OFF = (EndReason.SHUTDOWN, EndReason.SHED)  # a release that leaves it attached to us (worker.handoffs)
HANDOFF_PACED_SHARE = 0.4


class Worker:
    def __init__(
        self, config: WorkerConfig, worker_id: str, *, aws: Aws, log: JsonLogger, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.timing = SessionTiming(config.lease_ms, config.heartbeat_ms, config.max_clock_skew_ms)
        self.counters = Counters()
        self.runners: dict[str, ConnectionRunner] = {}
        self._aws = aws
        self._log = log.bind(worker_id=worker_id)
        self.supervisor = Supervisor(log=self._log, counters=self.counters)
        self._sessions = SessionsStore(aws.dynamodb, config.sessions_table_name, clock_ms=clock_ms)
        self._connections = ConnectionsStore(
            aws.dynamodb,
            config.table_name,
            state_shards=config.state_shards,
            sessions_table_name=config.sessions_table_name,
            clock_ms=clock_ms,
        )
        self._messages = build_sink(config, aws, self.counters)
        # Frame bytes held at once (worker.budget): the sockets' share through the
        # receive gate, the writer's as its byte cap. None: unbounded (a comparison only).
        self.budget = (
            MemoryBudget(config.max_buffered_bytes, config.max_frame_bytes) if config.max_buffered_bytes else None
        )
        self.gate = (
            ReceiveGate(slots=self.budget.receive_slots, allowance=self.budget.allowance_bytes) if self.budget else None
        )
        self._settings = Settings(
            worker_id=worker_id,
            checkpoint_s=config.checkpoint_ms / 1000,
            max_frame_bytes=config.max_frame_bytes,
            allowlist=Allowlist.of(config.allowed_ws_hosts),
            gate=self.gate,
            upstream_secret_prefix=config.upstream_secret_prefix,
            region=config.region,
        )
        # Secret header values, one cache for every connection of the worker.
        self.secrets = Secrets(client=aws.secretsmanager, call=aws.call, counters=self.counters)
        self.writer = Writer(
            messages=self._messages,
            objects=ObjectsStore(aws.s3, config.messages_bucket_name),
            max_data_bytes=config.max_frame_bytes,
            call=aws.call,
            worker_id=worker_id,
            counters=self.counters,
            log=self._log,
            flush_interval_s=config.flush_interval_ms / 1000,
            max_pending_bytes=self.budget.writer_bytes if self.budget else None,
        )
        self.acquirer = Acquirer(connections=self._connections, call=aws.call, worker_id=worker_id)
        self.checkpoints = Checkpoints(
            connections=self._connections, call=aws.call, counters=self.counters, log=self._log
        )
        self.keeper = SessionKeeper(
            sessions=self._sessions,
            worker_id=worker_id,
            timing=self.timing,
            max_connections=config.max_connections,
            call=aws.call_urgent,
            log=self._log,
            active=lambda: len(self.runners),
            on_stops=self._on_stops,
            clock_ms=clock_ms,
        )
        self.intake = Intake(
            aws=aws,
            queue_url=config.queue_url,
            log=self._log,
            acquire=self.try_acquire,
            room=self.free,
            load=self.load,
            busy=self._busy,
            accepting=self._accepting,
            declines_shed=self._declines_shed,
            ending=lambda cid: cid in self.runners and self.runners[cid].end_reason is not None,
            on_hints=lambda: self.takeover.note_work(),
            me=lambda: self.keeper.session_id,
            under_target=lambda: under_target(
                active=self.taken(),
                max_connections=self.config.max_connections,
                fleet=self.balancer.fresh_fleet(),
                me=self.keeper.session_id,
            ),
            batch=lambda: hints_per_poll(
                active=self.taken(),
                max_connections=self.config.max_connections,
                room=self.free(),
                fleet=self.balancer.fresh_fleet(),
                me=self.keeper.session_id,
            ),
        )
        self.attachments = Attachments(
            connections=self._connections, sessions=self._sessions, call=aws.call, hint=self.intake.hint, log=self._log
        )
        self.handoffs = Handoffs(
            connections=self._connections,
            call=aws.call,
            hint=self.intake.hint,
            counters=self.counters,
            log=self._log,
            settled=self._handoff_settled,
        )
        self.takeover = Takeover(
            sessions=self._sessions,
            connections=self._connections,
            keeper=self.keeper,
            timing=self.timing,
            state_shards=config.state_shards,
            call=aws.call,
            log=self._log,
            acquire=self.try_acquire,
            hint=self.intake.hint,
            room=self.free,
            scan_room=lambda: 0 if self._declines_shed("") else self.free(),
            load=self.load,
            busy=self._busy,
            avoid=lambda cid: self.balancer.shed_recently(cid),
            held=lambda: list(self.runners),
            on_summary=lambda item: self.balancer.on_summary(item),
            clock_ms=clock_ms,
        )
        self.balancer = Balancer(
            sessions=self._sessions,
            keeper=self.keeper,
            timing=self.timing,
            max_connections=config.max_connections,
            enabled=config.rebalance,
            tolerance=config.rebalance_tolerance,
            call=aws.call,
            log=self._log,
            successors=self.takeover.successors,
            recovering=self.takeover.recovering,
            runners=lambda: self.runners,
            last_acquired_ms=lambda: self._last_acquired_ms,
            watched=lambda: self.takeover.watched,
            clock_ms=clock_ms,
        )
        self.sweeper = Sweeper(
            connections=self._connections,
            sessions=self._sessions,
            keeper=self.keeper,
            successors=self.takeover.successors,
            call=aws.call,
            hint=self.intake.hint,
            counters=self.counters,
            log=self._log,
            sweep_s=config.sweep_ms / 1000,
            clock_ms=clock_ms,
        )
        self._last_acquired_ms = 0
        self._clock_ms = clock_ms
        self._acquiring: set[str] = set()
        self._acquire_slots = asyncio.Semaphore(ACQUIRE_CONCURRENCY)
        self._holders: set[asyncio.Task] = set()
        self._holding: dict[str, asyncio.Task] = {}  # connection id -> its holder task
        self._handoff_stops: set[asyncio.Task] = set()  # STOPs of connections we handed off
        self._stopping = asyncio.Event()
        self._session_ready = asyncio.Event()
        self._capacity_freed = asyncio.Event()
        self._lag_ms: deque[float] = deque(maxlen=480)  # the last two minutes of probes

    # --- capacity ----------------------------------------------------------------------

    def taken(self) -> int:
        """Connections held here and being acquired: this worker's load."""
        return len(self.runners) + len(self._acquiring)

    def free(self) -> int:
        return self.config.max_connections - self.taken()

    def load(self) -> float:
        return 1 - self.free() / self.config.max_connections

    def _busy(self, connection_id: str) -> bool:
        return connection_id in self.runners or connection_id in self._acquiring

    def _accepting(self) -> bool:
        return not self._stopping.is_set() and self.keeper.live()

    def _declines_shed(self, shed_by: str, shed_to: str = "", age_s: float = 0.0, from_session: str = "") -> bool:
        return declines_shed_hint(
            active=self.taken(),
            max_connections=self.config.max_connections,
            fleet=self.balancer.fresh_fleet(),
            shed_by_me=shed_by == self.keeper.session_id,
            age_s=age_s,
            shed_to=shed_to,
            me=self.keeper.session_id,
            drained=bool(from_session),
        )

    # --- taking connections ------------------------------------------------------------

    async def try_acquire(
        self,
        connection_id: str,
        *,
        source: str,
        expected_session: str = "",
        known: dict | None = None,
        trace_parent: str | None = None,
    ) -> ConnectionRunner | None:
        """Attach the connection to our session if we have room (conditional on it being
        free, or on the ENDED session ``expected_session`` it is attached to), find where
        its stored messages end, then hold it in a task of its own. Returns the runner,
        or None if we lost the race, had no room or no live session. ``trace_parent``:
        the checked trace header of what asked for it (a hint's, a drain's): the acquire
        span, and the runner's first connect span, continue that trace."""
        if not self._accepting() or self._busy(connection_id) or self.free() <= 0:
            return None
        session_id = self.keeper.session_id
        deadline = lambda: self.keeper.deadline_for(session_id)  # noqa: E731
        self._acquiring.add(connection_id)
        self.attachments.trying(connection_id)
        try:
            async with self._acquire_slots:
                result, checkpoint, stored_end, sent, trace = await self._acquire(
                    connection_id, session_id, expected_session, source, known, trace_parent
                )
        except LeaseExpired:
            self._log.warning("acquire_gave_up", connection_id=connection_id, source=source)
            return None
        finally:
            self._acquiring.discard(connection_id)
            self._capacity_freed.set()
        if isinstance(result, NotAcquired):
            if sent == 1:  # refused by the only request sent: none can land later
                self.attachments.settled(connection_id)
            self._log.info("acquire_lost", connection_id=connection_id, source=source, why=result.reason.value)
            return None
        item = result.item
        if not self._accepting() or self.keeper.session_id != session_id:
            # Won a race that finished after shutdown began or the session was lost.
            await self._release_unheld(connection_id, item, session_id)
            return None
        runner = ConnectionRunner(
            connection_id=connection_id,
            ws_url=item[schema.WS_URL],
            session_id=session_id,
            fence_token=int(item[schema.FENCE_TOKEN]),
            checkpoint=checkpoint,
            stored_end=stored_end,
            deadline=deadline,
            settings=self._settings,
            call=self._aws.call,
            connections=self._connections,
            writer=self.writer,
            checkpoints=self.checkpoints,
            counters=self.counters,
            log=self._log,
            secrets=self.secrets,
            upstream=item.get(schema.UPSTREAM),
            last_error=item.get(schema.LAST_ERROR),
            trace_parent=trace,
        )
        self.runners[connection_id] = runner
        self._last_acquired_ms = self._clock_ms()
        self.counters.add(names.LEASES_ACQUIRED)
        if source in ("orphan", "unowned"):
            self.counters.add(names.ORPHANS_RECOVERED)
        self._log.info(
            "lease_acquired",
            connection_id=connection_id,
            source=source,
            fence_token=runner.fence_token,
            checkpoint=checkpoint,
            from_seq=runner.tracker.next_seq,
            active=len(self.runners),
            **tracing.log_fields(trace),
        )
        # Its life is its own: none of it in the trace of what took it (a drain's, say).
        task = asyncio.create_task(self._hold(runner), name=f"hold:{connection_id}", context=tracing.untraced())
        self._holders.add(task)
        self._holding[connection_id] = task
        task.add_done_callback(self._holders.discard)
        task.add_done_callback(functools.partial(self._held, connection_id))
        return runner

    async def _acquire(
        self,
        connection_id: str,
        session_id: str,
        expected_session: str,
        source: str,
        known: dict | None = None,
        trace_parent: str | None = None,
    ) -> tuple[Acquired | NotAcquired, int, int, int, str | None]:
        """The conditional acquire, then where the stored messages end: past its last
        checkpoint for a connection taken from a crashed owner; no read when its last
        owner released it cleanly (a handoff, a shed, a STOP then START). Also returns
        how many acquire requests were sent (a retry follows an answer that was lost,
        whose request may yet land), and the acquire span's trace header."""
        deadline = lambda: self.keeper.deadline_for(session_id)  # noqa: E731
        checkpoint = stored_end = sent = 0

        async def acquire(**kwargs: Any) -> Acquired | NotAcquired:
            nonlocal sent
            sent += 1
            return await self.acquirer.acquire(**kwargs)

        with tracing.segment(
            "acquire", parent=trace_parent, connection_id=connection_id, source=source, session=session_id
        ) as span:
            result = await call_until(
                _direct,
                deadline,
                acquire,
                log=self._log,
                connection_id=connection_id,
                session_id=session_id,
                expected_session=expected_session,
                known=known,
            )
            span.annotate(outcome=result.reason.value if isinstance(result, NotAcquired) else "acquired")
            if isinstance(result, Acquired):
                checkpoint = stored_end = int(result.item.get(schema.LAST_SEQ, 0))
                span.annotate(fence=int(result.item.get(schema.FENCE_TOKEN, 0)))
            # A stream's tail is not read (Sink.reads_tail): from a crashed owner, the
            # frames since its checkpoint are delivered again, with our higher fence.
            if isinstance(result, Acquired) and not result.checkpoint_is_end and self._messages.reads_tail:
                stored_end = await call_until(
                    self._aws.call,
                    deadline,
                    self._messages.stored_end,
                    log=self._log,
                    connection_id=connection_id,
                    checkpoint=checkpoint,
                )
        return result, checkpoint, stored_end, sent, span.header

    async def _release_unheld(self, connection_id: str, item: dict, session_id: str) -> None:
        if self.keeper.deadline_for(session_id) > clock.now():
            try:
                if await self._aws.call(
                    self._connections.release,
                    connection_id=connection_id,
                    session_id=session_id,
                    fence_token=int(item[schema.FENCE_TOKEN]),
                    last_seq=int(item.get(schema.LAST_SEQ, 0)),
                ):
                    self.attachments.settled(connection_id)
            except TransientError:
                pass  # still attached: freed at our exit, or taken with the session when that ends
        await self.intake.hint(connection_id)

    def _held(self, connection_id: str, task: asyncio.Task) -> None:
        if self._holding.get(connection_id) is task:
            del self._holding[connection_id]

    async def _hold(self, runner: ConnectionRunner) -> None:
        try:
            reason = await runner.run()
        finally:
            self.runners.pop(runner.connection_id, None)
            self._capacity_freed.set()
            if runner.detached and self.attachments.session_id == runner.session_id:
                self.attachments.settled(runner.connection_id)
        self._log.info(
            "connection_ended", connection_id=runner.connection_id, why=reason.value, active=len(self.runners)
        )
        # The state the release left it in, when it landed free or handed off (attached
        # to our session, released at our fence): the taker needs no read.
        released = (
            schema.released_state(
                runner.fence_token,
                runner.ws_url,
                runner.tracker.checkpoint,
                runner.upstream_item,
                runner.last_error,
                session_id=runner.session_id if runner.handed else "",
            )
            if runner.freed or runner.handed
            else None
        )
        if runner.handed:
            self.handoffs.handed(
                runner.connection_id, session_id=runner.session_id, fence_token=runner.fence_token, released=released
            )
        # A STOP's release that landed free: a START came meanwhile, and its hint found us holding it.
        # The hints carry the release span's trace: the taker's acquire continues it.
        if reason is EndReason.SHUTDOWN or (reason is EndReason.STOPPED and runner.freed):
            await self.intake.hint(runner.connection_id, released=released, trace=runner.release_trace)
        elif reason is EndReason.SHED:
            await self.intake.hint(
                runner.connection_id,
                shed_by=runner.session_id,
                shed_to=runner.shed_to,
                released=released,
                trace=runner.release_trace,
            )

    # --- what the session tells us -----------------------------------------------------

    def _on_stops(self, stops: set[str]) -> None:
        """STOPs posted to our session's inbox, brought back by a renewal: each for one
        ownership (fence) of a connection."""
        for entry in stops:
            connection_id, fence = schema.parse_stop_entry(entry)
            if connection_id in self._acquiring:
                continue  # not held yet: it stays in the inbox until the next renewal
            runner = self.runners.get(connection_id)
            if runner is not None and runner.fence_token == fence:
                if runner.end_reason in HANDING_OFF:
                    continue  # being handed off: it stays in the inbox, for the next renewal to bring back
                self._log.info("stop_received", connection_id=connection_id)
                runner.request_stop()
            elif runner is None and self.handoffs.pending(connection_id):
                # Handed off and not taken yet: still attached to us, so its STOP came
                # here. Nobody holds a socket: free it (STOPPED), as its taker would have.
                task = asyncio.create_task(self._stop_handed(connection_id, fence), name=f"stop:{connection_id}")
                self._handoff_stops.add(task)
                task.add_done_callback(self._handoff_stops.discard)
            self.keeper.stop_handled(entry)

    def _handoff_settled(self, connection_id: str, session_id: str) -> None:
        """A handoff of ours was taken or freed: no longer attached to its session."""
        if self.attachments.session_id == session_id:
            self.attachments.settled(connection_id)

    async def _stop_handed(self, connection_id: str, fence: int) -> None:
        try:
            await self.handoffs.stop(connection_id, fence)  # settles it (_handoff_settled) when it lands
        except Exception as exc:  # noqa: BLE001 - the audit frees a STOPPED one still attached to us
            self._log.warning("handoff_stop_failed", connection_id=connection_id, error=f"{type(exc).__name__}: {exc}")

    async def audit_once(self) -> int:
        """Compare what the owner index says our session holds with what we hold: a
        STOP we missed is acted on, a connection attached to us that we do not hold
        (an acquire whose answer was lost) is adopted if STARTED and freed if STOPPED,
        one we hold that is no longer ours (checked with a read) is dropped. Returns how
        many it corrected."""
        session_id = self.keeper.session_id
        if not self.keeper.live():
            return 0
        rows = await self._aws.call(self._connections.owned_by, session_id)
        listed = {r.connection_id: r.desired_state for r in rows}
        fixed = 0
        for connection_id, state in listed.items():
            runner = self.runners.get(connection_id)
            if runner is not None and state == schema.STOPPED:
                self._log.warning("stop_found_by_audit", connection_id=connection_id)
                runner.request_stop()
                fixed += 1
            elif runner is None and connection_id not in self._acquiring and state == schema.STARTED:
                if self.handoffs.pending(connection_id):
                    continue  # handed off: for the peer its hint names (worker.handoffs)
                self._log.warning("adopting_attached_connection", connection_id=connection_id)
                await self.try_acquire(connection_id, source="audit", expected_session=session_id)
                fixed += 1
            elif runner is None and connection_id not in self._acquiring:
                # STOPPED and attached to us with no runner (an acquisition whose answer
                # was lost, then its STOP): nobody holds a socket, so free it, as its
                # release would have (conditional on it still being attached to us).
                self._log.warning("freeing_stopped_attached_connection", connection_id=connection_id)
                if await self._aws.call(self._connections.free_orphan, connection_id, dead_session=session_id):
                    self.attachments.settled(connection_id)
                fixed += 1
        now = clock.now()
        for connection_id, runner in list(self.runners.items()):
            if connection_id in listed or now - runner.acquired_mono < AUDIT_GRACE_S or runner.session_id != session_id:
                continue
            item = await self._aws.call(self._connections.get, connection_id)
            if item is None or item.get(schema.LEASE_SESSION) != session_id:
                self._log.warning("connection_no_longer_ours", connection_id=connection_id)
                self.attachments.settled(connection_id)
                runner.drop(EndReason.LOST)
                fixed += 1
        return fixed

    async def _keep_session(self) -> None:
        """Open a session and keep it. When it is lost: drop every connection (close the
        sockets, write nothing), end it ourselves if our deadline passed while it is still
        LIVE, open a new session, and take our old connections back by draining the old
        session like any dead one (peers watching it may take some first)."""
        previous = ""
        while not self._stopping.is_set():
            if not await self.keeper.open(self._stopping):
                return
            self.attachments.reset(self.keeper.session_id)
            self._session_ready.set()
            self.takeover.announce_soon()
            if previous:
                self.takeover.drain_soon(previous)
            # A renewal loop that raises runs again: the deadline alone says when the session is lost.
            reason = await self.supervisor.keep("session", self.keeper.run)
            self._session_ready.clear()
            previous = self.keeper.session_id
            drop = EndReason.LOST if reason is Lost.ENDED else EndReason.EXPIRED
            for runner in list(self.runners.values()):
                runner.drop(drop)
            pending = [t for t in self._holders if not t.done()]
            if pending:
                await asyncio.wait(pending, timeout=5)
            if reason is Lost.EXPIRED and not await self.keeper.end():
                previous = ""  # still LIVE for all we know: its watchers end it at expiry

    # --- metrics -------------------------------------------------------------------------

    async def count_unowned(self) -> int | None:
        """STARTED connections nobody owns, counted for the whole fleet by its summarizer
        (the last session of the ring, which reads every session); None from any other
        worker, and if the count failed (the alarm then sees a gap, not a false zero)."""
        if not is_summarizer(self.keeper.session_id, self.takeover.successors()):
            return None
        try:
            return await self.takeover.count_unowned(self.balancer.dead_sessions)
        except Exception as exc:  # noqa: BLE001 - metrics must never take the worker down
            self._log.warning("count_unowned_failed", error=str(exc))
            return None

    async def publish_metrics_once(self, *, count_unowned: bool = True) -> None:
        data = metric_data(
            service_name=self.config.service_name,
            active_connections=len(self.runners),
            deltas=self.counters.take_deltas(),
            unowned_connections=await self.count_unowned() if count_unowned else None,
            worker_id=self.worker_id,
            loop_lag_p99_ms=self.stats()["loop_lag_p99_ms"],
            refused_connections=sum(1 for r in list(self.runners.values()) if r.refused),
            trace_export_failures=tracing.take_export_failures(),
        )
        try:
            for start in range(0, len(data), 20):
                await self._aws.call(
                    self._aws.cloudwatch.put_metric_data,
                    Namespace=self.config.metrics_namespace,
                    MetricData=data[start : start + 20],
                )
        except Exception as exc:  # noqa: BLE001 - metrics must never take the worker down
            self._log.warning("metrics_failed", error=str(exc))
        self._log.info("stats", **self.stats())

    def stats(self) -> dict[str, Any]:
        """What the ``stats`` log line reports: session, connections, counters, AWS
        requests sent, event-loop lag and memory (for operators and the benchmarks)."""
        lags = sorted(self._lag_ms)
        return {
            "session_id": self.keeper.session_id,
            "renewals": self.keeper.renewals,
            "active": len(self.runners),
            "sessions_ended": self.takeover.sessions_ended,
            "shed": self.balancer.shed,
            "sweep": self.sweeper.stats(),
            **self.counters.totals(),
            "writer": self.writer.stats(),
            "budget": self.budget.describe() if self.budget else None,
            "gate": self.gate.stats() if self.gate else None,
            "checkpoints": self.checkpoints.stats(),
            "requests": dict(self._aws.requests),
            "loop_lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))], 2) if lags else None,
            "loop_lag_max_ms": round(lags[-1], 2) if lags else None,
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 3),
        }

    async def _probe_lag(self) -> None:
        """How late the loop wakes a sleeper: the delay every socket and the renewal see."""
        while True:
            before = clock.now()
            await asyncio.sleep(LAG_PROBE_S)
            self._lag_ms.append(max(0.0, (clock.now() - before - LAG_PROBE_S) * 1000))

    # --- the loops ---------------------------------------------------------------------

    async def _every(
        self,
        pause_s: Callable[[], float],
        step: Any,
        *,
        wait_first: bool = False,
        pause: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """``step`` while our session is live, then ``pause`` (by default until we stop)
        for ``pause_s()`` seconds, until the worker stops."""
        first = True
        while not self._stopping.is_set():
            if not self._session_ready.is_set():
                await first_of(self._session_ready.wait(), self._stopping.wait())
                continue
            if not (first and wait_first) and self.keeper.live():
                await step()  # one that raises is run again by the supervisor (see run())
            first = False
            await (pause or self._pause)(pause_s())

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _reconcile_pause(self, seconds: float) -> None:
        """The free scan's pause: RECONCILE_SECONDS (jittered) doubled after each scan in a
        row that found nothing (``Takeover.idle_scans``, at most RECONCILE_BACKOFF_CAP
        times: ``seconds``); a hint meanwhile (``Takeover.note_work``) cuts what is left
        of a long pause to at most one RECONCILE_SECONDS."""
        self.takeover.work_noted.clear()
        deadline = clock.now() + seconds
        while not self._stopping.is_set() and (left := deadline - clock.now()) > 0:
            try:
                await asyncio.wait_for(first_of(self.takeover.work_noted.wait(), self._stopping.wait()), timeout=left)
            except TimeoutError:
                break
            if self.takeover.work_noted.is_set():
                self.takeover.work_noted.clear()
                deadline = min(deadline, clock.now() + reconcile_pause_s(self.config.reconcile_ms))

    async def _balance_loop(self) -> None:
        """A balance pass after each fleet summary a watch read brings (every
        ``SUMMARY_EVERY`` watch reads)."""
        while not self._stopping.is_set():
            await first_of(self.balancer.summary_arrived.wait(), self._stopping.wait())
            self.balancer.summary_arrived.clear()
            if self._stopping.is_set() or not self.keeper.live():
                continue
            await self.balancer.balance_once()

    async def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            if not self._session_ready.is_set():
                await first_of(self._session_ready.wait(), self._stopping.wait())
                continue
            if self.free() <= 0:
                # Full: wait for a connection to end or an acquisition to fail (a
                # backstop re-check every FULL_RECHECK_S). Waking on the session being
                # ready, as this once did, spun the pollers 20 times a second each.
                self._capacity_freed.clear()  # no await since free() looked: nothing was missed
                try:
                    await asyncio.wait_for(
                        first_of(self._capacity_freed.wait(), self._stopping.wait()), timeout=FULL_RECHECK_S
                    )
                except TimeoutError:
                    pass
                continue
            await self.intake.poll_once()

    def _supervised(self, name: str, loop: Callable[[], Any]) -> asyncio.Task:
        """A task running ``loop`` under the supervisor: an exception it raises is logged
        and counted, and the loop runs again after a backoff."""
        return asyncio.create_task(self.supervisor.keep(name, loop), name=name)

    def request_shutdown(self) -> None:
        if not self._stopping.is_set():
            self._log.info("shutdown_requested", active=len(self.runners))
            self.keeper.draining = True
            self._stopping.set()

    async def run(self) -> None:
        """Run until :meth:`request_shutdown`, then shut down within the budget."""
        self._log.info(
            "worker_started",
            max_connections=self.config.max_connections,
            lease_ms=self.timing.lease_ms,
            heartbeat_ms=self.timing.heartbeat_ms,
            reconcile_ms=self.config.reconcile_ms,
            checkpoint_ms=self.config.checkpoint_ms,
            rebalance=self.config.rebalance,
            rebalance_tolerance=self.config.rebalance_tolerance,
        )
        keeper = asyncio.create_task(self._keep_session(), name="session")
        writer = self._supervised("writer", self.writer.run)
        checkpoints = self._supervised("checkpoints", self.checkpoints.run)
        polls = [self._supervised(f"poll-{n}", self._poll_loop) for n in range(HINT_POLLERS)]
        reconcile = lambda: reconcile_pause_s(self.config.reconcile_ms)  # noqa: E731
        watch = self.timing.watch_pause_s
        audit = lambda: AUDIT_EVERY * reconcile()  # noqa: E731
        scan = lambda: reconcile_pause_s(self.config.reconcile_ms, idle_scans=self.takeover.idle_scans)  # noqa: E731
        metrics = lambda: self.config.metrics_seconds  # noqa: E731
        loops = [
            self._supervised("watch", lambda: self._every(watch, self.takeover.watch_once)),
            self._supervised(
                "reconcile", lambda: self._every(scan, self.takeover.reconcile_once, pause=self._reconcile_pause)
            ),
            self._supervised("handoffs", lambda: self._every(lambda: CHECK_EVERY_S, self.handoffs.check_once)),
            self._supervised("summary", lambda: self._every(watch, self.balancer.summarize_once)),
            self._supervised("balance", self._balance_loop),
            self._supervised("sweep", lambda: self._every(lambda: PAGE_PAUSE_S, self.sweeper.step)),
            self._supervised("audit", lambda: self._every(audit, self.audit_once, wait_first=True)),
            self._supervised("metrics", lambda: self._every(metrics, self.publish_metrics_once, wait_first=True)),
            self._supervised("lag-probe", self._probe_lag),
        ]
        await self._stopping.wait()
        started = clock.now()
        for task in loops:
            task.cancel()
        self.takeover.cancel()
        budget = self.config.shutdown_seconds - SHUTDOWN_MARGIN_S
        await self.shutdown(budget_s=budget)
        keeper.cancel()
        writer.cancel()
        checkpoints.cancel()
        in_flight = [p for p in polls if not p.done()]
        if self.intake.hints_sent and in_flight:
            # Our own long polls, still in flight, may receive some of the hints we just
            # sent, and SQS hands a new message to a waiting poll at once: give them a
            # moment to return, so that the intake puts those hints straight back for a
            # peer instead of leaving them invisible for a visibility timeout.
            left = budget - (clock.now() - started)
            await asyncio.wait(in_flight, timeout=max(0.0, min(HINT_GRACE_S, left)))
        for p in polls:
            p.cancel()
        await self._hint_handoffs_again(until=started + budget, after=HINT_GRACE_S)
        await asyncio.gather(keeper, writer, checkpoints, *polls, *loops, return_exceptions=True)
        self._log.info(
            "shutdown_complete",
            took_s=round(clock.now() - started, 3),
            left=len(self.runners),
            **self.counters.totals(),
        )

    async def _hint_handoffs_again(self, *, until: float, after: float) -> None:
        """The leaving worker's last step: ``after`` seconds past its last handoff's hint
        (within the budget, ``until``), hint again what is still unclaimed
        (:meth:`.handoffs.Handoffs.hint_again`), so that a lost hint costs that moment,
        not its watchers' next read of its ended session."""
        if not len(self.handoffs):
            return
        await asyncio.sleep(max(0.0, min(self.handoffs.last_at + after, until) - clock.now()))
        try:
            await asyncio.wait_for(self.handoffs.hint_again(), timeout=max(0.1, until - clock.now()))
        except Exception as exc:  # noqa: BLE001 - its watchers drain what is left
            self._log.warning("handoffs_hint_again_failed", error=f"{type(exc).__name__}: {exc}")

    async def _hand_over(self, *, paced_until: float) -> None:
        """Ask every runner to shut down (close, flush, hand off with checkpoint, hint),
        ``HANDOFF_CONCURRENCY`` at a time until ``paced_until`` (:func:`wsfleet.clock.now`), then all the
        rest at once. Returns when the last one has been asked."""
        in_flight: set[asyncio.Task] = set()
        for connection_id, runner in list(self.runners.items()):
            while len(in_flight) >= HANDOFF_CONCURRENCY and clock.now() < paced_until:
                _, in_flight = await asyncio.wait(
                    in_flight, timeout=paced_until - clock.now(), return_when=asyncio.FIRST_COMPLETED
                )
            holder = self._holding.get(connection_id)
            if holder is None or holder.done() or self.runners.get(connection_id) is not runner:
                continue  # ended meanwhile (a STOP, a lost session)
            runner.request_shutdown()
            in_flight.add(holder)

    async def shutdown(self, *, budget_s: float) -> None:
        """Hand every connection over (:meth:`_hand_over`: close, flush, checkpoint,
        hand off, hint, a few at a time) while the session is still renewed; then end
        the session, free what is still attached to it with no runner and no handoff, and
        take it out of the ring if nothing is left attached
        (:meth:`.attached.Attachments.leave_ring_when_clear`). A handoff not yet taken, and
        whatever is not done within the budget, stays attached to the ended session, still
        in the ring: its hint's taker (the worker hints it again before it exits), else its
        watchers, take it."""
        started = clock.now()
        self._stopping.set()
        await self._hand_over(paced_until=started + HANDOFF_PACED_SHARE * budget_s)
        pending = [t for t in self._holders if not t.done()]
        if pending:
            left = budget_s - (clock.now() - started)
            _, late = await asyncio.wait(pending, timeout=max(0.1, left))
            if late:
                self._log.warning("shutdown_budget_exceeded", unfinished=len(late))
        session_id = self.keeper.session_id
        if session_id and self.keeper.lost_reason is None and await self.keeper.end():
            left = budget_s - (clock.now() - started)
            try:
                await asyncio.wait_for(
                    # What is handed off and not taken stays attached to the ended session, in
                    # the ring: its hints' takers, else its watchers, take it (worker.handoffs).
                    self.attachments.leave_ring_when_clear(
                        session_id, held=lambda c: c in self.runners, handed=self.handoffs.pending
                    ),
                    timeout=max(0.1, left),
                )
            except Exception as exc:  # noqa: BLE001 - the session stays in the ring: its watchers drain it
                self._log.warning("session_left_in_ring", session_id=session_id, error=f"{type(exc).__name__}: {exc}")
        # The last counters and ActiveConnections, within what is left of the budget.
        left = budget_s - (clock.now() - started)
        try:
            await asyncio.wait_for(self.publish_metrics_once(count_unowned=False), timeout=max(0.1, left))
        except TimeoutError:
            self._log.warning("final_metrics_timed_out")


def _direct(fn: Callable[..., Awaitable[Any]], /, **kwargs: Any) -> Awaitable[Any]:
    """``call_until``'s ``call`` for a step that is already async (no thread)."""
    return fn(**kwargs)

