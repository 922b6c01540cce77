"""One simulated worker: the product's own roles, wired as :class:`wsfleet.worker.lifecycle.Worker`
wires them, and its own loops (the session keeper, hint polls, watch, free scan,
handoff checks, assignments, summary, balance, sweep, audit), in virtual time.

Left out are the parts that move frames (the writer, checkpoints, the sink, the frame
decoder, secrets) and the metrics: a held connection is a :class:`~.runner.SimRunner`.
Everything that decides who holds what, and every request it makes to the table and
the queue, is the product's.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from wsfleet.config import WorkerConfig
from wsfleet.crash_loop import SuspectWatch
from wsfleet.leases import SessionTiming, reconcile_pause_s
from wsfleet.metrics import Counters
from wsfleet.store import ConnectionsStore, SessionsStore
from wsfleet.worker.acquirer import Acquirer
from wsfleet.worker.acquisition import Acquisition
from wsfleet.worker.assignments import POLL_S as ASSIGNED_POLL_S
from wsfleet.worker.assignments import Assignments
from wsfleet.worker.attached import Attachments
from wsfleet.worker.balancer import Balancer
from wsfleet.worker.handoffs import CHECK_EVERY_S, Handoffs
from wsfleet.worker.hints import Hints
from wsfleet.worker.holdings import Holdings
from wsfleet.worker.intake import HINT_POLLERS, Intake
from wsfleet.worker.lifecycle import AUDIT_EVERY, HINT_GRACE_S, SHUTDOWN_MARGIN_S, Worker
from wsfleet.worker.moves import Mover
from wsfleet.worker.session import SessionKeeper
from wsfleet.worker.shutdown import Departure
from wsfleet.worker.stops import Stops
from wsfleet.worker.summary import FleetSummary
from wsfleet.worker.supervision import Supervisor
from wsfleet.leases import SWEEP_PAGE_PAUSE_S as PAGE_PAUSE_S
from wsfleet.worker.sweep import Sweeper
from wsfleet.worker.takeover import Takeover

from .aws import SimAws
from .runner import SimRunner

CONNECTIONS_TABLE, SESSIONS_TABLE, QUEUE_URL = "connections", "sessions", "sim://start-hints"


class QuietLog:
    """The worker's logger, silent: a run of thousands of workers logs millions of lines."""

    def bind(self, **_: Any) -> "QuietLog":
        return self

    def info(self, event: str, **_: Any) -> None:
        pass

    warning = error = debug = info


class _NoTail:
    """The sink as the acquisition asks it: nothing past a checkpoint to look for."""

    reads_tail = False


def config(*, max_connections: int, lease_s: float, heartbeat_s: float, skew_ms: int, reconcile_s: float,
           shards: int, sweep_s: float, shutdown_s: float) -> WorkerConfig:
    return WorkerConfig(
        table_name=CONNECTIONS_TABLE, sessions_table_name=SESSIONS_TABLE, messages_table_name="", messages_bucket_name="",
        queue_url=QUEUE_URL, region="us-east-1", endpoint_url=None, worker_id=None, ecs_metadata_uri=None,
        lease_ms=round(lease_s * 1000), heartbeat_ms=round(heartbeat_s * 1000), reconcile_ms=round(reconcile_s * 1000),
        checkpoint_ms=5000, max_connections=max_connections, max_clock_skew_ms=skew_ms, metrics_namespace="",
        service_name="sim", state_shards=shards, shutdown_seconds=shutdown_s, metrics_seconds=60.0, message_ttl_days=1,
        flush_interval_ms=1000, sweep_ms=round(sweep_s * 1000),
    )


class SimWorker(Worker):
    """A :class:`Worker` whose roles are the product's, built on :class:`SimAws`; its
    loop methods (the keeper's reopen, ``_every``, the polls, the balance loop) are
    the lifecycle's own."""

    def __init__(self, cfg: WorkerConfig, worker_id: str, *, aws: SimAws, clock_ms: Callable[[], int]) -> None:
        self.config, self.worker_id, self.aws = cfg, worker_id, aws
        self.timing = SessionTiming(cfg.lease_ms, cfg.heartbeat_ms, cfg.max_clock_skew_ms)
        self.counters = Counters()
        log = self._log = QuietLog()
        self.supervisor = Supervisor(log=log, counters=self.counters)  # type: ignore[arg-type]
        self._sessions = SessionsStore(aws.dynamodb, cfg.sessions_table_name, clock_ms=clock_ms)
        self._connections = ConnectionsStore(aws.dynamodb, cfg.table_name, state_shards=cfg.state_shards,
                                             sessions_table_name=cfg.sessions_table_name, clock_ms=clock_ms)
        self.stopping, self.session_ready = asyncio.Event(), asyncio.Event()
        self.summary = FleetSummary(clock_ms=clock_ms)
        self.holdings = Holdings(max_connections=cfg.max_connections, summary=self.summary, clock_ms=clock_ms)
        self._suspects, self._named = SuspectWatch(), None
        call = aws.call
        self.hints = Hints(aws=aws, queue_url=cfg.queue_url, log=log)  # type: ignore[arg-type]
        self.attachments = Attachments(connections=self._connections, sessions=self._sessions, call=call, hints=self.hints, log=log)
        self.handoffs = Handoffs(connections=self._connections, call=call, hints=self.hints, attachments=self.attachments,
                                 counters=self.counters, log=log)
        self.stops = Stops(holdings=self.holdings, handoffs=self.handoffs, log=log)
        self.mover = Mover(connections=self._connections, call=call, hints=self.hints, handoffs=self.handoffs, log=log)
        self.keeper = SessionKeeper(
            sessions=self._sessions, worker_id=worker_id, timing=self.timing, max_connections=cfg.max_connections,
            call=aws.call_urgent, log=log, active=self.holdings.count, on_stops=self.stops.on_stops,
            on_assigned=self._on_assigned, suspect=self._prime_suspect, clock_ms=clock_ms,
        )
        self.acquisition = Acquisition(
            settings=None, holdings=self.holdings, keeper=self.keeper, stopping=self.stopping,  # type: ignore[arg-type]
            acquirer=Acquirer(connections=self._connections, call=call, worker_id=worker_id), attachments=self.attachments,
            handoffs=self.handoffs, hints=self.hints, mover=self.mover, connections=self._connections,
            messages=_NoTail(), writer=None, checkpoints=None, secrets=None, aws=aws,  # type: ignore[arg-type]
            counters=self.counters, log=log, runner=SimRunner,  # type: ignore[arg-type]
        )
        self.takeover = Takeover(
            sessions=self._sessions, connections=self._connections, keeper=self.keeper, timing=self.timing,
            state_shards=cfg.state_shards, call=call, log=log, acquisition=self.acquisition, hints=self.hints,
            mover=self.mover, holdings=self.holdings, summary=self.summary, counters=self.counters,
            quarantine_after=cfg.quarantine_after, clock_ms=clock_ms,
        )
        self.assignments = Assignments(
            acquisition=self.acquisition, holdings=self.holdings, keeper=self.keeper, connections=self._connections,
            sessions=self._sessions, attachments=self.attachments, hints=self.hints, call=call, log=log,
            suspect_at=lambda: self.takeover.suspect_at,
        )
        self.intake = Intake(aws=aws, queue_url=cfg.queue_url, log=log, holdings=self.holdings,  # type: ignore[arg-type]
                             acquisition=self.acquisition, keeper=self.keeper, takeover=self.takeover,
                             wall=lambda: clock_ms() / 1000)
        self.balancer = Balancer(
            sessions=self._sessions, keeper=self.keeper, timing=self.timing, enabled=cfg.rebalance,
            tolerance=cfg.rebalance_tolerance, call=call, log=log, holdings=self.holdings, summary=self.summary,
            takeover=self.takeover, clock_ms=clock_ms,
        )
        self.sweeper = Sweeper(
            connections=self._connections, sessions=self._sessions, keeper=self.keeper, takeover=self.takeover, call=call,
            hints=self.hints, counters=self.counters, log=log, sweep_s=cfg.sweep_ms / 1000, clock_ms=clock_ms,
        )
        self.departure = Departure(holdings=self.holdings, keeper=self.keeper, handoffs=self.handoffs,
                                   attachments=self.attachments, log=log)

    def _prime_suspect(self) -> dict | None:
        """No frames flow here, so no connection costs anything: never a suspect (and
        the crash-loop breaker's look over every connection at each renewal is saved)."""
        return None

    async def run(self) -> None:  # the lifecycle's run, without the writer, checkpoints and metrics
        keeper = asyncio.create_task(self._keep_session(), name="session")
        polls = [self._supervised(f"poll-{n}", self.poll_loop) for n in range(HINT_POLLERS)]
        reconcile = lambda: reconcile_pause_s(self.config.reconcile_ms)  # noqa: E731
        watch = self.timing.watch_pause_s
        scan = lambda: reconcile_pause_s(self.config.reconcile_ms, idle_scans=self.takeover.idle_scans)  # noqa: E731
        loops = [
            self._supervised("watch", lambda: self._every(watch, self.takeover.watch_once)),
            self._supervised("reconcile", lambda: self._every(scan, self.takeover.reconcile_once, pause=self._reconcile_pause)),
            self._supervised("handoffs", lambda: self._every(lambda: CHECK_EVERY_S, self.handoffs.check_once)),
            self._supervised("assignments", lambda: self._every(lambda: ASSIGNED_POLL_S, self.assignments.poll_once)),
            self._supervised("summary", lambda: self._every(watch, self.balancer.summarize_once)),
            self._supervised("balance", self._balance_loop),
            self._supervised("sweep", lambda: self._every(lambda: PAGE_PAUSE_S, self.sweeper.step)),
            self._supervised("audit", lambda: self._every(lambda: AUDIT_EVERY * reconcile(), self.acquisition.audit_once,
                                                          wait_first=True)),
        ]
        await self.stopping.wait()
        started = asyncio.get_running_loop().time()
        for task in loops:
            task.cancel()
        self.takeover.cancel()
        budget = self.config.shutdown_seconds - SHUTDOWN_MARGIN_S
        await self.departure.leave(budget_s=budget)
        keeper.cancel()
        in_flight = [p for p in polls if not p.done()]
        if self.hints.sent and in_flight:
            left = budget - (asyncio.get_running_loop().time() - started)
            await asyncio.wait(in_flight, timeout=max(0.0, min(HINT_GRACE_S, left)))
        for p in polls:
            p.cancel()
        await self.departure.hint_handoffs_again(until=started + budget, after=HINT_GRACE_S)
        await asyncio.gather(keeper, *polls, *loops, return_exceptions=True)
