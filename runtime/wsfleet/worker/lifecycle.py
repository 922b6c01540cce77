"""The worker's lifecycle: builds the roles and starts and stops them.

* :class:`~.holdings.Holdings` is what the worker holds (its runners, what it is
  acquiring) and where it stands against the fleet summary
  (:class:`~.summary.FleetSummary`); the roles below read and change it;
* :class:`~.session.SessionKeeper` keeps the worker's one session alive (its deadline
  governs every write) and brings back the STOPs posted to it (:class:`~.stops.Stops`);
* :class:`~.acquisition.Acquisition` takes a connection and holds it in a
  :class:`~.connection.ConnectionRunner`, and audits what the owner index says we hold;
* :class:`~.takeover.Takeover` watches the ring, ends dead sessions and drains them, and
  scans for STARTED connections nobody owns;
* :class:`~.intake.Intake` takes START hints from SQS (:class:`~.hints.Hints` sends them);
* :class:`~.balancer.Balancer` summarizes the fleet and sheds what is above our share;
* :class:`~.shutdown.Departure` hands everything over at shutdown;
* :class:`~.report.Report` publishes the metrics and the ``stats`` line.

This module runs their loops, reopens a lost session, and shuts down within the budget.
``Acquisition.try_acquire`` and ``audit_once``, the keeper's ``renew_once`` and the
takeover's ``watch_once`` / ``reconcile_once`` are the run-once steps tests can drive
one at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .. import clock, schema
from ..aws import Aws
from ..config import WorkerConfig
from ..crash_loop import SuspectWatch
from ..leases import SWEEP_PAGE_PAUSE_S, SessionTiming, reconcile_pause_s
from ..logs import JsonLogger
from ..metrics import Counters
from ..sinks import ObjectsStore
from ..store import ConnectionsStore, SessionsStore, now_ms
from ..validation import Allowlist
from .acquirer import Acquirer
from .acquisition import Acquisition
from .assignments import POLL_S as ASSIGNED_POLL_S
from .assignments import Assignments
from .attached import Attachments
from .balancer import Balancer
from ..budget import MemoryBudget
from .checkpoints import Checkpoints
from .connection import EndReason, Settings
from .decoder import FrameDecoder
from .gate import ReceiveGate
from .handoffs import CHECK_EVERY_S, Handoffs
from .hints import Hints
from .holdings import Holdings
from .intake import HINT_POLLERS, Intake
from .moves import Mover
from .retry import first_of
from .secrets import Secrets
from .session import Lost, SessionKeeper
from ..sinks.build import build_sink
from .shutdown import Departure
from .stops import Stops
from .summary import FleetSummary
from .supervision import Supervisor
from .report import Report
from .sweep import Sweeper
from .takeover import Takeover
from .writer import Writer

SHUTDOWN_MARGIN_S = 1.0  # kept back from the budget for the final log line and exit
HINT_GRACE_S = 0.5  # at shutdown, how long our in-flight polls get to return our own hints
FULL_RECHECK_S = 1.0  # a full worker's hint pollers look again at least this often
AUDIT_EVERY = 3  # the owner-index audit runs every AUDIT_EVERY reconcile intervals


class Worker:
    def __init__(
        self, config: WorkerConfig, worker_id: str, *, aws: Aws, log: JsonLogger, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.timing = SessionTiming(config.lease_ms, config.heartbeat_ms, config.max_clock_skew_ms)
        self.counters = Counters()
        self.aws = aws
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
        # Frame bytes held at once (wsfleet.budget): the sockets' share through the
        # receive gate, the writer's as its byte cap. None: unbounded (a comparison only).
        self.budget = (
            MemoryBudget(config.max_buffered_bytes, config.max_frame_bytes) if config.max_buffered_bytes else None
        )
        self.gate = (
            ReceiveGate(slots=self.budget.receive_slots, allowance=self.budget.allowance_bytes) if self.budget else None
        )
        # Large frames are parsed in a child process, within a memory budget (.decoder).
        self.decoder = FrameDecoder(max_frame_bytes=config.max_frame_bytes, log=self._log)
        settings = Settings(
            worker_id=worker_id,
            checkpoint_s=config.checkpoint_ms / 1000,
            max_frame_bytes=config.max_frame_bytes,
            allowlist=Allowlist.of(config.allowed_ws_hosts),
            gate=self.gate,
            decoder=self.decoder,
            upstream_secret_prefix=config.upstream_secret_prefix,
            region=config.region,
            proxy=config.upstream_proxy,
        )
        # Secret header values, one cache for every connection of the worker.
        self.secrets = Secrets(
            client=aws.secretsmanager, call=aws.call, counters=self.counters, hosts_required=config.secret_hosts_required
        )
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
        self.stopping = asyncio.Event()  # set once: the worker shuts down
        self.drained_by: dict | None = None  # the operator's request that started it (wsfleet drain)
        self.session_ready = asyncio.Event()  # set while a session is open
        self.summary = FleetSummary(clock_ms=clock_ms)
        self.holdings = Holdings(max_connections=config.max_connections, summary=self.summary, clock_ms=clock_ms)
        self._suspects = SuspectWatch()
        self._named: str | None = None  # the prime suspect the last renewal named
        self.hints = Hints(aws=aws, queue_url=config.queue_url, log=self._log)
        self.attachments = Attachments(
            connections=self._connections, sessions=self._sessions, call=aws.call, hints=self.hints, log=self._log
        )
        self.handoffs = Handoffs(
            connections=self._connections,
            call=aws.call,
            hints=self.hints,
            attachments=self.attachments,
            counters=self.counters,
            log=self._log,
        )
        self.stops = Stops(holdings=self.holdings, handoffs=self.handoffs, log=self._log)
        self.mover = Mover(
            connections=self._connections, call=aws.call, hints=self.hints, handoffs=self.handoffs, log=self._log
        )
        self.keeper = SessionKeeper(
            sessions=self._sessions,
            worker_id=worker_id,
            timing=self.timing,
            max_connections=config.max_connections,
            call=aws.call_urgent,
            log=self._log,
            active=self.holdings.count,
            on_stops=self.stops.on_stops,
            on_assigned=self._on_assigned,
            suspect=self._prime_suspect,
            on_drain=lambda request: self.request_shutdown(drain=request),
            clock_ms=clock_ms,
        )
        self.acquisition = Acquisition(
            settings=settings,
            holdings=self.holdings,
            keeper=self.keeper,
            stopping=self.stopping,
            acquirer=self.acquirer,
            attachments=self.attachments,
            handoffs=self.handoffs,
            hints=self.hints,
            mover=self.mover,
            connections=self._connections,
            messages=self._messages,
            writer=self.writer,
            checkpoints=self.checkpoints,
            secrets=self.secrets,
            aws=aws,
            counters=self.counters,
            log=self._log,
        )
        self.takeover = Takeover(
            sessions=self._sessions,
            connections=self._connections,
            keeper=self.keeper,
            timing=self.timing,
            state_shards=config.state_shards,
            call=aws.call,
            log=self._log,
            acquisition=self.acquisition,
            hints=self.hints,
            mover=self.mover,
            holdings=self.holdings,
            summary=self.summary,
            counters=self.counters,
            quarantine_after=config.quarantine_after,
            clock_ms=clock_ms,
        )
        self.assignments = Assignments(
            acquisition=self.acquisition,
            holdings=self.holdings,
            keeper=self.keeper,
            connections=self._connections,
            sessions=self._sessions,
            attachments=self.attachments,
            hints=self.hints,
            call=aws.call,
            log=self._log,
            suspect_at=lambda: self.takeover.suspect_at,
        )
        self.intake = Intake(
            aws=aws,
            queue_url=config.queue_url,
            log=self._log,
            holdings=self.holdings,
            acquisition=self.acquisition,
            keeper=self.keeper,
            takeover=self.takeover,
        )
        self.balancer = Balancer(
            sessions=self._sessions,
            keeper=self.keeper,
            timing=self.timing,
            enabled=config.rebalance,
            tolerance=config.rebalance_tolerance,
            call=aws.call,
            log=self._log,
            holdings=self.holdings,
            summary=self.summary,
            takeover=self.takeover,
            clock_ms=clock_ms,
        )
        self.sweeper = Sweeper(
            connections=self._connections,
            sessions=self._sessions,
            keeper=self.keeper,
            takeover=self.takeover,
            call=aws.call,
            hints=self.hints,
            counters=self.counters,
            log=self._log,
            sweep_s=config.sweep_ms / 1000,
            connections_known=lambda: self.summary.fleet.active if self.summary.fleet else 0,
            clock_ms=clock_ms,
        )
        self.departure = Departure(
            holdings=self.holdings, keeper=self.keeper, handoffs=self.handoffs, attachments=self.attachments, log=self._log
        )
        self.report = Report(
            config=config,
            worker_id=worker_id,
            aws=aws,
            counters=self.counters,
            log=self._log,
            holdings=self.holdings,
            keeper=self.keeper,
            takeover=self.takeover,
            balancer=self.balancer,
            sweeper=self.sweeper,
            writer=self.writer,
            checkpoints=self.checkpoints,
            budget=self.budget,
            gate=self.gate,
            decoder=self.decoder,
        )

    async def _keep_session(self) -> None:
        """Open a session and keep it. When it is lost: drop every connection (close the
        sockets, write nothing), end it ourselves if our deadline passed while it is still
        LIVE, open a new session, and take our old connections back by draining the old
        session like any dead one (peers watching it may take some first)."""
        previous = ""
        while not self.stopping.is_set():
            if not await self.keeper.open(self.stopping):
                return
            self.attachments.reset(self.keeper.session_id)
            self.session_ready.set()
            self.takeover.announce_soon()
            if previous:
                self.takeover.drain_soon(previous)
            # A renewal loop that raises runs again: the deadline alone says when the session is lost.
            reason = await self.supervisor.keep("session", self.keeper.run)
            self.session_ready.clear()
            previous = self.keeper.session_id
            drop = EndReason.LOST if reason is Lost.ENDED else EndReason.EXPIRED
            for runner in list(self.holdings.runners.values()):
                runner.drop(drop)
            pending = self.holdings.holders()
            if pending:
                await asyncio.wait(pending, timeout=5)
            if reason is Lost.EXPIRED and not await self.keeper.end():
                previous = ""  # still LIVE for all we know: its watchers end it at expiry

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
        while not self.stopping.is_set():
            if not self.session_ready.is_set():
                await first_of(self.session_ready.wait(), self.stopping.wait())
                continue
            if not (first and wait_first) and self.keeper.live():
                await step()  # one that raises is run again by the supervisor (see run())
            first = False
            await (pause or self._pause)(pause_s())

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _reconcile_pause(self, seconds: float) -> None:
        """The free scan's pause: RECONCILE_SECONDS (jittered) doubled after each scan in a
        row that found nothing (``Takeover.idle_scans``, at most RECONCILE_BACKOFF_CAP
        times: ``seconds``); a hint meanwhile (``Takeover.note_work``) cuts what is left
        of a long pause to at most one RECONCILE_SECONDS."""
        self.takeover.work_noted.clear()
        deadline = clock.now() + seconds
        while not self.stopping.is_set() and (left := deadline - clock.now()) > 0:
            try:
                await asyncio.wait_for(first_of(self.takeover.work_noted.wait(), self.stopping.wait()), timeout=left)
            except TimeoutError:
                break
            if self.takeover.work_noted.is_set():
                self.takeover.work_noted.clear()
                deadline = min(deadline, clock.now() + reconcile_pause_s(self.config.reconcile_ms))

    async def _balance_loop(self) -> None:
        """A balance pass after each fleet summary a watch read brings (every
        ``SUMMARY_EVERY`` watch reads)."""
        while not self.stopping.is_set():
            await first_of(self.summary.arrived.wait(), self.stopping.wait())
            self.summary.arrived.clear()
            if self.stopping.is_set() or not self.keeper.live():
                continue
            await self.balancer.balance_once()

    async def poll_loop(self) -> None:
        while not self.stopping.is_set():
            if not self.session_ready.is_set():
                await first_of(self.session_ready.wait(), self.stopping.wait())
                continue
            if self.holdings.free() <= 0:
                # Full: wait for a connection to end or an acquisition to fail (a
                # backstop re-check every FULL_RECHECK_S). Waking on the session being
                # ready, as this once did, spun the pollers 20 times a second each.
                self.holdings.capacity_freed.clear()  # no await since free() looked: nothing was missed
                try:
                    await asyncio.wait_for(
                        first_of(self.holdings.capacity_freed.wait(), self.stopping.wait()), timeout=FULL_RECHECK_S
                    )
                except TimeoutError:
                    pass
                continue
            await self.intake.poll_once()

    def _prime_suspect(self) -> dict | None:
        """The prime suspect each renewal stores (:mod:`wsfleet.crash_loop`), logged when
        it changes."""
        found = self._suspects.look(self.holdings.costs())
        named = None if found is None else found.connection_id
        if named != self._named:
            self._named = named
            self._log.info("prime_suspect", suspect=named, why=None if found is None else found.why)
        return None if found is None else found.item()

    def _on_assigned(self, entries: set[str]) -> set[str]:
        """The keeper's renewals bring the assignments; they are picked up by
        :class:`~.assignments.Assignments`, made after the keeper (it acquires)."""
        return self.assignments.on_assigned(entries)

    def _supervised(self, name: str, loop: Callable[[], Any]) -> asyncio.Task:
        """A task running ``loop`` under the supervisor: an exception it raises is logged
        and counted, and the loop runs again after a backoff."""
        return asyncio.create_task(self.supervisor.keep(name, loop), name=name)

    def request_shutdown(self, drain: dict | None = None) -> None:
        """SIGTERM's, or ``drain``: an operator's request (``wsfleet drain``: who and when)
        that a renewal brought. The same shutdown, started once: a second changes nothing."""
        if not self.stopping.is_set():
            self.drained_by = drain
            why = {} if drain is None else {"why": "drain_requested", "requested": drain}
            self._log.info("shutdown_requested", active=self.holdings.count(), **why)
            self.keeper.draining = True
            self.stopping.set()

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
        polls = [self._supervised(f"poll-{n}", self.poll_loop) for n in range(HINT_POLLERS)]
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
            self._supervised("assignments", lambda: self._every(lambda: ASSIGNED_POLL_S, self.assignments.poll_once)),
            self._supervised("summary", lambda: self._every(watch, self.balancer.summarize_once)),
            self._supervised("balance", self._balance_loop),
            self._supervised("sweep", lambda: self._every(lambda: SWEEP_PAGE_PAUSE_S, self.sweeper.step)),
            self._supervised("audit", lambda: self._every(audit, self.acquisition.audit_once, wait_first=True)),
            self._supervised("metrics", lambda: self._every(metrics, self.report.publish_metrics_once, wait_first=True)),
            self._supervised("lag-probe", self.report.probe_lag),
        ]
        await self.stopping.wait()
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
        if self.hints.sent and in_flight:
            # Our own long polls, still in flight, may receive some of the hints we just
            # sent, and SQS hands a new message to a waiting poll at once: give them a
            # moment to return, so that the intake puts those hints straight back for a
            # peer instead of leaving them invisible for a visibility timeout.
            left = budget - (clock.now() - started)
            await asyncio.wait(in_flight, timeout=max(0.0, min(HINT_GRACE_S, left)))
        for p in polls:
            p.cancel()
        await self.departure.hint_handoffs_again(until=started + budget, after=HINT_GRACE_S)
        await asyncio.gather(keeper, writer, checkpoints, *polls, *loops, return_exceptions=True)
        self.decoder.close()
        self._log.info(
            "shutdown_complete",
            took_s=round(clock.now() - started, 3),
            left=self.holdings.count(),
            **self.counters.totals(),
        )
        if self.drained_by is not None:
            request = self.drained_by
            self._log.info(
                "drained_by_request",
                session_id=self.keeper.session_id,
                requested_by=request.get(schema.DRAIN_BY),
                requested_at_ms=request.get(schema.DRAIN_AT_MS),
                took_s=round(clock.now() - started, 3),
                left=self.holdings.count(),
            )

    async def shutdown(self, *, budget_s: float) -> None:
        """Stop taking connections, leave (:meth:`.shutdown.Departure.leave`: every
        connection handed over, the session ended and out of the ring once clear), then
        publish the last counters, all within ``budget_s``."""
        started = clock.now()
        self.stopping.set()
        await self.departure.leave(budget_s=budget_s)
        # The last counters and ActiveConnections, within what is left of the budget.
        left = budget_s - (clock.now() - started)
        try:
            await asyncio.wait_for(self.report.publish_metrics_once(count_unowned=False), timeout=max(0.1, left))
        except TimeoutError:
            self._log.warning("final_metrics_timed_out")
