"""What the worker reports: its CloudWatch metrics, the ``stats`` log line, and the
event loop's lag.

Every ``METRICS_SECONDS`` the worker publishes its counters' deltas, its connections and
its loop lag (:func:`wsfleet.metrics.metric_data`); the fleet's summarizer adds the count
of STARTED connections nobody owns. A failed publish is logged, never raised: metrics must
never take the worker down.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import deque
from typing import Any

from .. import clock, tracing
from .. import metrics_names as names
from ..aws import Aws
from ..balance import is_summarizer
from ..config import WorkerConfig
from ..logs import JsonLogger
from ..metrics import EMF_EVENT, Counters, emf, metric_data
from .balancer import Balancer
from ..budget import MemoryBudget
from .checkpoints import Checkpoints
from .decoder import FrameDecoder
from .gate import ReceiveGate
from .holdings import Holdings
from .session import SessionKeeper
from .sweep import Sweeper
from .takeover import Takeover
from .writer import Writer

LAG_PROBE_S = 0.25  # how often the event-loop lag probe wakes up


class LoopLag:
    """The event loop's lag as the probe measures it: the last two minutes of probes (for
    ``LoopLagP99`` and the stats line) and the longest since the previous publish (for
    ``EventLoopLagMs``: one stall the p99 would hide)."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=round(120 / LAG_PROBE_S))
        self._longest: float | None = None

    def note(self, lag_ms: float) -> None:
        self.recent.append(lag_ms)
        self._longest = lag_ms if self._longest is None else max(self._longest, lag_ms)

    def p99(self) -> float | None:
        lags = sorted(self.recent)
        return round(lags[int(0.99 * (len(lags) - 1))], 2) if lags else None

    def window_max(self) -> float | None:
        return round(max(self.recent), 2) if self.recent else None

    def take_longest(self) -> float | None:
        """The longest lag since the previous call (None: no probe since)."""
        longest, self._longest = self._longest, None
        return None if longest is None else round(longest, 2)


class Report:
    def __init__(
        self,
        *,
        config: WorkerConfig,
        worker_id: str,
        aws: Aws,
        counters: Counters,
        log: JsonLogger,
        holdings: Holdings,
        keeper: SessionKeeper,
        takeover: Takeover,
        balancer: Balancer,
        sweeper: Sweeper,
        writer: Writer,
        checkpoints: Checkpoints,
        budget: MemoryBudget | None,
        gate: ReceiveGate | None,
        decoder: FrameDecoder,
    ) -> None:
        self.lag = LoopLag()
        self._config = config
        self._worker_id = worker_id
        self._aws = aws
        self._counters = counters
        self._log = log
        self._holdings = holdings
        self._keeper = keeper
        self._takeover = takeover
        self._balancer = balancer
        self._sweeper = sweeper
        self._writer = writer
        self._checkpoints = checkpoints
        self._budget = budget
        self._gate = gate
        self._decoder = decoder

    async def count_unowned(self) -> int | None:
        """STARTED connections nobody owns, counted for the whole fleet by its summarizer
        (the last session of the ring, which reads every session); None from any other
        worker, and if the count failed (the alarm then sees a gap, not a false zero)."""
        if not is_summarizer(self._keeper.session_id, self._takeover.successors()):
            return None
        try:
            return await self._takeover.count_unowned(self._balancer.dead_sessions)
        except Exception as exc:  # noqa: BLE001 - metrics must never take the worker down
            self._log.warning("count_unowned_failed", error=str(exc))
            return None

    async def publish_metrics_once(self, *, count_unowned: bool = True) -> None:
        data = metric_data(
            service_name=self._config.service_name,
            active_connections=self._holdings.count(),
            deltas=self._counters.take_deltas(),
            unowned_connections=await self.count_unowned() if count_unowned else None,
            loop_lag_p99_ms=self.lag.p99(),
            loop_lag_max_ms=self.lag.take_longest(),
            refused_connections=sum(1 for r in list(self._holdings.runners.values()) if r.refused),
            silent_connections=sum(1 for r in list(self._holdings.runners.values()) if r.health.silent(clock.now())),
            malformed_connections=sum(
                1 for r in list(self._holdings.runners.values()) if r.health.mostly_malformed(clock.now())
            ),
            trace_export_failures=tracing.take_export_failures(),
        )
        try:
            # One EMF line: CloudWatch Logs extracts the metrics (wsfleet.metrics).
            document = emf(self._config.metrics_namespace, data, timestamp_ms=int(time.time() * 1000),
                           properties={names.DIMENSION_WORKER_ID: self._worker_id})
            self._log.info(EMF_EVENT, **document)
        except Exception as exc:  # noqa: BLE001 - metrics must never take the worker down
            self._log.warning("metrics_failed", error=str(exc))
        self._log.info("stats", **self.stats())

    def stats(self) -> dict[str, Any]:
        """What the ``stats`` log line reports: session, connections, counters, AWS
        requests sent, event-loop lag and memory (for operators and the benchmarks)."""
        return {
            "session_id": self._keeper.session_id,
            "renewals": self._keeper.renewals,
            "active": self._holdings.count(),
            "sessions_ended": self._takeover.sessions_ended,
            "shed": self._balancer.shed,
            "sweep": self._sweeper.stats(),
            **self._counters.totals(),
            "writer": self._writer.stats(),
            "budget": self._budget.describe() if self._budget else None,
            "gate": self._gate.stats() if self._gate else None,
            # The most bytes a socket of a held connection left unsent (worker.socket_budget).
            "unsent_max": max((r.budget.unsent_max for r in list(self._holdings.runners.values())), default=0),
            # The held connection whose frames took the most loop time so far (its share: socket_budget).
            "loop_top": self.loop_top(),
            "decoder": self._decoder.describe(),
            "checkpoints": self._checkpoints.stats(),
            "requests": dict(self._aws.requests),
            "loop_lag_p99_ms": self.lag.p99(),
            "loop_lag_max_ms": self.lag.window_max(),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 3),
        }

    def loop_top(self) -> dict[str, Any] | None:
        """The held connection whose frames took the most event-loop time, and how much."""
        costs = self._holdings.costs()  # (connection id, fence) -> (bytes, loop seconds)
        if not costs:
            return None
        (cid, _), (_, loop_s) = max(costs.items(), key=lambda item: item[1][1])
        return {"connection_id": cid, "loop_s": round(loop_s, 3)}

    async def probe_lag(self) -> None:
        """How late the loop wakes a sleeper: the delay every socket and the renewal see."""
        while True:
            before = clock.now()
            await asyncio.sleep(LAG_PROBE_S)
            self.lag.note(max(0.0, (clock.now() - before - LAG_PROBE_S) * 1000))
