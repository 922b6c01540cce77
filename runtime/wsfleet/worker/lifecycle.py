"""The worker's lifecycle: what to take (SQS hints and orphan reconciliation), holding
what it took (one :class:`ConnectionRunner` each), metrics, and graceful shutdown.

``poll_once``, ``reconcile_once`` and ``publish_metrics_once`` are the run-once steps
that :meth:`Worker.run` loops over; tests can drive them one at a time.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import time
from collections import deque
from itertools import islice
from typing import Any, Callable

from .. import metrics_names as names
from .. import schema, tracing
from ..aws import SQS_WAIT_SECONDS, Aws
from ..config import WorkerConfig
from ..leases import (
    AcquireFailure,
    Candidate,
    LeaseTiming,
    hint_pause_s,
    reconcile_pause_s,
    takeover_jitter_s,
    takeover_plan,
)
from ..logs import JsonLogger
from ..metrics import Counters, metric_data
from ..validation import Allowlist
from ..store import Acquired, ConnectionsStore, MessagesStore, NotAcquired, TransientError, now_ms
from .connection import ConnectionRunner, EndReason, Settings
from .retry import LeaseExpired, call_until

SHUTDOWN_MARGIN_S = 1.0  # kept back from the budget for the final log line and exit
# Concurrent one-message long polls per worker: a burst of START hints is taken four at
# a time, and a leaving worker's hints spread over every waiting poll in the fleet
# instead of all landing in whichever poll returned first. Idle, they cost 0.4 SQS
# requests/s per worker.
HINT_POLLERS = 4
HINT_GRACE_S = 0.5  # at shutdown, how long our in-flight polls get to return our own hints
LAG_PROBE_S = 0.25  # how often the event-loop lag probe wakes up


class Worker:
    def __init__(self, config: WorkerConfig, worker_id: str, *, aws: Aws, log: JsonLogger) -> None:
        self.config = config
        self.worker_id = worker_id
        self.timing = LeaseTiming(config.lease_ms, config.heartbeat_ms, config.max_clock_skew_ms)
        self.counters = Counters()
        self.runners: dict[str, ConnectionRunner] = {}
        self._aws = aws
        self._log = log.bind(worker_id=worker_id)
        self._connections = ConnectionsStore(aws.dynamodb, config.table_name, state_shards=config.state_shards)
        self._messages = MessagesStore(aws.dynamodb, config.messages_table_name, ttl_days=config.message_ttl_days)
        self._settings = Settings(
            worker_id=worker_id,
            timing=self.timing,
            flush_interval_s=config.flush_interval_ms / 1000,
            allowlist=Allowlist.of(config.allowed_ws_hosts),
        )
        self._acquiring: set[str] = set()
        self._scheduled: dict[str, asyncio.TimerHandle] = {}
        self._holders: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._capacity_freed = asyncio.Event()
        self._hints_sent = 0
        self._lag_ms: deque[float] = deque(maxlen=480)  # the last two minutes of probes

    # --- capacity ----------------------------------------------------------------------

    def free(self) -> int:
        return self.config.max_connections - len(self.runners) - len(self._acquiring)

    def _busy(self, connection_id: str) -> bool:
        return connection_id in self.runners or connection_id in self._acquiring

    # --- taking connections ------------------------------------------------------------

    async def try_acquire(self, connection_id: str, *, source: str) -> ConnectionRunner | None:
        """Take the lease if we have room, then hold the connection in a task of its own.
        Returns the runner, or None if we lost the race or had no room."""
        if self._stopping.is_set() or self._busy(connection_id) or self.free() <= 0:
            return None
        self._acquiring.add(connection_id)
        sent = time.monotonic()
        try:
            with tracing.segment("acquire", connection_id=connection_id, source=source) as span:
                result = await call_until(
                    self._aws.call,
                    lambda: sent + self.timing.heartbeat_ms / 1000,
                    self._connections.acquire,
                    log=self._log,
                    connection_id=connection_id,
                    owner=self.worker_id,
                    lease_ms=self.timing.lease_ms,
                    max_clock_skew_ms=self.timing.max_clock_skew_ms,
                )
                span.annotate(outcome=result.reason.value if isinstance(result, NotAcquired) else "acquired")
        except LeaseExpired:
            self._log.warning("acquire_gave_up", connection_id=connection_id, source=source)
            return None
        finally:
            self._acquiring.discard(connection_id)
        if isinstance(result, NotAcquired):
            self._log.info("acquire_lost", connection_id=connection_id, source=source, why=result.reason.value)
            if source == "orphan" and result.reason is AcquireFailure.HELD:
                self._retry_suspect(connection_id, result.lease_expires_at_ms)
            return None
        assert isinstance(result, Acquired)
        item = result.item
        if self._stopping.is_set():
            # Won a race that finished after shutdown began: hand it straight back.
            await self._release_unheld(connection_id, item)
            return None
        runner = ConnectionRunner(
            connection_id=connection_id,
            ws_url=item[schema.WS_URL],
            fence_token=int(item[schema.FENCE_TOKEN]),
            checkpoint=int(item.get(schema.LAST_SEQ, 0)),
            deadline_mono=self.timing.local_deadline_mono(sent),
            settings=self._settings,
            call=self._aws.call,
            connections=self._connections,
            messages=self._messages,
            counters=self.counters,
            log=self._log,
        )
        self.runners[connection_id] = runner
        self.counters.add(names.LEASES_ACQUIRED)
        if source == "orphan":
            self.counters.add(names.ORPHANS_RECOVERED)
        self._log.info(
            "lease_acquired",
            connection_id=connection_id,
            source=source,
            fence_token=runner.fence_token,
            from_seq=runner.tracker.next_seq,
            active=len(self.runners),
        )
        task = asyncio.create_task(self._hold(runner), name=f"hold:{connection_id}")
        self._holders.add(task)
        task.add_done_callback(self._holders.discard)
        return runner

    async def _release_unheld(self, connection_id: str, item: dict) -> None:
        try:
            await self._aws.call(
                self._connections.release,
                connection_id=connection_id,
                owner=self.worker_id,
                fence_token=int(item[schema.FENCE_TOKEN]),
                last_seq=int(item.get(schema.LAST_SEQ, 0)),
            )
        except TransientError:
            pass  # it expires by itself within a lease
        await self._hint(connection_id)

    async def _hold(self, runner: ConnectionRunner) -> None:
        try:
            reason = await runner.run()
        finally:
            self.runners.pop(runner.connection_id, None)
            self._capacity_freed.set()
        self._log.info(
            "connection_ended", connection_id=runner.connection_id, why=reason.value, active=len(self.runners)
        )
        if reason in (EndReason.SHUTDOWN, EndReason.FAILED):
            await self._hint(runner.connection_id)

    async def _hint(self, connection_id: str) -> None:
        """Tell peers a connection is free now, so one takes it in about a second
        instead of at its next reconcile."""
        try:
            await self._aws.call(
                self._aws.sqs.send_message,
                QueueUrl=self.config.queue_url,
                MessageBody=json.dumps({schema.HINT_CONNECTION_ID: connection_id}),
            )
            self._hints_sent += 1
        except Exception as exc:  # noqa: BLE001 - a hint is an optimisation; reconcile covers it
            self._log.warning("hint_failed", connection_id=connection_id, error=str(exc))

    # --- intake: SQS hints ---------------------------------------------------------------

    async def poll_once(self, *, wait_seconds: int = SQS_WAIT_SECONDS) -> int:
        """One long poll for START hints; returns how many messages it handled.

        One message per poll (with several polls per worker, see HINT_POLLERS): when a
        leaving worker hints its connections all at once, every waiting poll in the
        fleet takes one instead of the first poller taking ten, and a busier worker
        pauses a little before its next poll, so the hints spread over the fleet.
        """
        if self.free() <= 0:
            return 0
        resp = await self._aws.poll(
            self._aws.sqs.receive_message,
            QueueUrl=self.config.queue_url,
            MaxNumberOfMessages=1,
            WaitTimeSeconds=wait_seconds,
        )
        messages = resp.get("Messages", [])
        await asyncio.gather(*(self._on_hint(m) for m in messages))
        if messages and not self._stopping.is_set():
            await asyncio.sleep(hint_pause_s(1 - self.free() / self.config.max_connections))
        return len(messages)

    async def _on_hint(self, message: dict[str, Any]) -> None:
        connection_id = _hinted_connection(message.get("Body", ""))
        keep = False
        if connection_id is None:
            self._log.warning("bad_hint", body=message.get("Body", "")[:200])
        elif self._stopping.is_set() or (not self._busy(connection_id) and self.free() <= 0):
            keep = True  # no room here: give it back to the queue for a peer, now
        elif not self._busy(connection_id):
            await self.try_acquire(connection_id, source="hint")
        try:
            if keep:
                await self._aws.call(
                    self._aws.sqs.change_message_visibility,
                    QueueUrl=self.config.queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=0,
                )
            else:
                # Won, lost or already ours: the hint has done its job either way.
                await self._aws.call(
                    self._aws.sqs.delete_message, QueueUrl=self.config.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
        except Exception as exc:  # noqa: BLE001 - it comes back after its visibility timeout
            self._log.warning("hint_ack_failed", error=str(exc))

    # --- intake: orphan reconciliation ----------------------------------------------------

    async def reconcile_once(self) -> int:
        """Query every index shard for leases that are free, expired, or have missed a
        renewal, and schedule an acquire attempt for each at the moment it becomes
        acquirable. Returns how many attempts it scheduled."""
        free = self.free() - len(self._scheduled)
        if free <= 0 or self._stopping.is_set():
            return 0
        now = now_ms()
        below = self.timing.suspect_below_ms(now)
        shards = list(range(self.config.state_shards))
        random.shuffle(shards)
        candidates: list[Candidate] = []
        for shard in shards:
            found = await self._aws.call(
                _take, self._connections.suspects(shard, below_ms=below, limit=min(100, free + 10)), free + 10
            )
            candidates.extend(found)
        plan = self._schedule(candidates, now, capacity=free)
        if plan:
            self._log.info("orphans_scheduled", count=len(plan), first_in_s=round(max(0, plan[0][1] - now) / 1000, 3))
        return len(plan)

    def _schedule(self, candidates: list[Candidate], now: int, *, capacity: int) -> list[tuple[str, int]]:
        """Arm a timer per planned takeover, at the moment each lease becomes acquirable
        plus load-weighted jitter."""
        busy = set(self.runners) | self._acquiring | set(self._scheduled)
        plan = takeover_plan(candidates, now_ms=now, timing=self.timing, managed=busy, capacity=capacity)
        load = 1 - self.free() / self.config.max_connections
        loop = asyncio.get_running_loop()
        for connection_id, at_ms in plan:
            delay = max(0.0, (at_ms - now_ms()) / 1000) + takeover_jitter_s(load)
            self._scheduled[connection_id] = loop.call_later(delay, self._fire, connection_id)
        return plan

    def _retry_suspect(self, connection_id: str, lease_expires_at_ms: int | None) -> None:
        """A takeover attempt found the lease still held. If its expiry still looks like
        a missed renewal (the holder's last renewal landed after our scan read the
        index, then it died), try again at the new expiry instead of waiting for a scan
        after it. A live holder's next renewal moves the expiry out of the suspect
        range, which ends the retries."""
        now = now_ms()
        if self._stopping.is_set() or lease_expires_at_ms is None:
            return
        if lease_expires_at_ms < self.timing.suspect_below_ms(now):
            self._schedule(
                [Candidate(connection_id, lease_expires_at_ms)], now, capacity=self.free() - len(self._scheduled)
            )

    def _fire(self, connection_id: str) -> None:
        self._scheduled.pop(connection_id, None)
        task = asyncio.create_task(self.try_acquire(connection_id, source="orphan"))
        self._holders.add(task)
        task.add_done_callback(self._holders.discard)

    # --- metrics -------------------------------------------------------------------------

    async def count_unowned(self) -> int | None:
        """STARTED connections with no live lease, over every shard; None if the count
        failed (the alarm then sees a gap, not a false zero)."""
        now = now_ms()
        try:
            counts = await asyncio.gather(
                *(
                    self._aws.call(self._connections.count_unowned, shard, now_ms=now)
                    for shard in range(self.config.state_shards)
                )
            )
        except Exception as exc:  # noqa: BLE001 - metrics must never take the worker down
            self._log.warning("count_unowned_failed", error=str(exc))
            return None
        return sum(counts)

    async def publish_metrics_once(self, *, count_unowned: bool = True) -> None:
        data = metric_data(
            service_name=self.config.service_name,
            active_connections=len(self.runners),
            deltas=self.counters.take_deltas(),
            unowned_connections=await self.count_unowned() if count_unowned else None,
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
        """What the ``stats`` log line reports: connections, counters, AWS requests sent,
        event-loop lag and memory (for operators and the benchmarks)."""
        lags = sorted(self._lag_ms)
        return {
            "active": len(self.runners),
            **self.counters.totals(),
            "requests": dict(self._aws.requests),
            "loop_lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))], 2) if lags else None,
            "loop_lag_max_ms": round(lags[-1], 2) if lags else None,
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 3),
        }

    async def _probe_lag(self) -> None:
        """How late the loop wakes a sleeper: the delay every socket and heartbeat sees."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(LAG_PROBE_S)
            self._lag_ms.append(max(0.0, (time.monotonic() - before - LAG_PROBE_S) * 1000))

    # --- the loops ---------------------------------------------------------------------

    async def _every(self, pause_s: Callable[[], float], step: Any, *, wait_first: bool = False) -> None:
        first = True
        while not self._stopping.is_set():
            if not (first and wait_first):
                try:
                    await step()
                except Exception as exc:  # noqa: BLE001 - one failed step must not end the loop
                    self._log.warning("loop_step_failed", step=step.__name__, error=f"{type(exc).__name__}: {exc}")
            first = False
            pause = pause_s()
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=pause)
            except TimeoutError:
                pass

    async def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            if self.free() <= 0:
                self._capacity_freed.clear()
                await _first_of(self._capacity_freed.wait(), self._stopping.wait())
                continue
            try:
                await self.poll_once()
            except Exception as exc:  # noqa: BLE001
                self._log.warning("poll_failed", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1 + random.random())

    def request_shutdown(self) -> None:
        if not self._stopping.is_set():
            self._log.info("shutdown_requested", active=len(self.runners))
            self._stopping.set()

    async def run(self) -> None:
        """Run until :meth:`request_shutdown`, then shut down within the budget."""
        self._log.info(
            "worker_started",
            max_connections=self.config.max_connections,
            lease_ms=self.timing.lease_ms,
            heartbeat_ms=self.timing.heartbeat_ms,
            reconcile_ms=self.config.reconcile_ms,
        )
        polls = [asyncio.create_task(self._poll_loop(), name=f"poll-{n}") for n in range(HINT_POLLERS)]
        loops = [
            asyncio.create_task(
                self._every(lambda: reconcile_pause_s(self.config.reconcile_ms, self.timing), self.reconcile_once),
                name="reconcile",
            ),
            asyncio.create_task(
                self._every(lambda: self.config.metrics_seconds, self.publish_metrics_once, wait_first=True),
                name="metrics",
            ),
            asyncio.create_task(self._probe_lag(), name="lag-probe"),
        ]
        await self._stopping.wait()
        started = time.monotonic()
        for task in loops:
            task.cancel()
        for handle in self._scheduled.values():
            handle.cancel()
        self._scheduled.clear()
        budget = self.config.shutdown_seconds - SHUTDOWN_MARGIN_S
        await self.shutdown(budget_s=budget)
        in_flight = [p for p in polls if not p.done()]
        if self._hints_sent and in_flight:
            # Our own long polls, still in flight, may receive some of the hints we just
            # sent, and SQS hands a new message to a waiting poll at once: give them a
            # moment to return, so that _on_hint puts those hints straight back for a
            # peer instead of leaving them invisible for a visibility timeout. Polls
            # still waiting after that received nothing.
            left = budget - (time.monotonic() - started)
            await asyncio.wait(in_flight, timeout=max(0.0, min(HINT_GRACE_S, left)))
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, *loops, return_exceptions=True)
        self._log.info(
            "shutdown_complete",
            took_s=round(time.monotonic() - started, 3),
            left=len(self.runners),
            **self.counters.totals(),
        )

    async def shutdown(self, *, budget_s: float) -> None:
        """Close every socket, flush, checkpoint and release, all connections in
        parallel; whatever is not done within the budget is left to expire."""
        started = time.monotonic()
        self._stopping.set()
        for runner in list(self.runners.values()):
            runner.request_shutdown()
        pending = [t for t in self._holders if not t.done()]
        if pending:
            done, late = await asyncio.wait(pending, timeout=max(0.1, budget_s))
            if late:
                self._log.warning("shutdown_budget_exceeded", unfinished=len(late))
        # The last counters and ActiveConnections, within what is left of the budget: the
        # leases are released already, so a slow CloudWatch must not hold the exit.
        left = budget_s - (time.monotonic() - started)
        try:
            await asyncio.wait_for(self.publish_metrics_once(count_unowned=False), timeout=max(0.1, left))
        except TimeoutError:
            self._log.warning("final_metrics_timed_out")


def _hinted_connection(body: str) -> str | None:
    try:
        value = json.loads(body).get(schema.HINT_CONNECTION_ID)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _take(iterable: Any, n: int) -> list:
    return list(islice(iterable, n))


async def _first_of(*aws: Any) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
