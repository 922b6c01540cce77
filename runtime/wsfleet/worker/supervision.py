"""Keeping the worker's long-lived loops alive whatever they meet.

Every long-lived task of the worker (the writer, the checkpoints, the session keeper's
loop, the takeover's watch and reconcile, the hint pollers, the balancer, the audit,
metrics, the lag probe, each runner's stream and checkpointer) runs under a
:class:`Supervisor`. An exception nothing closer handled does not end the loop:

* a transient fault (throttling, a timeout, a 5xx: :func:`~wsfleet.store.is_transient`)
  is logged as a ``loop_retry`` warning;
* anything else (AccessDenied during a deploy, a table not found, a bug) is logged as one
  ``loop_error`` line with its traceback in a ``traceback`` field, and counted in
  ``LoopErrors``, which has an alarm;

and the loop runs again after a jittered backoff, capped, so that a fault that persists
costs a request every few seconds, not a busy loop. :meth:`Supervisor.retry` does the
same for one store call, bounded by the worker's deadline: work that cannot be done now
waits, and nothing is dropped.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any, Awaitable, Callable, TypeVar

from .. import clock
from .. import metrics_names as names
from ..leases import backoff_s
from ..logs import JsonLogger
from ..metrics import Counters
from ..store import TransientError, is_transient
from .retry import LeaseExpired

T = TypeVar("T")

LOOP_BACKOFF_BASE_S = 0.5
LOOP_BACKOFF_CAP_S = 10.0  # a loop that keeps failing runs again at least this often
RETRY_BACKOFF_BASE_S = 0.2
RETRY_BACKOFF_CAP_S = 5.0  # a store call that keeps failing is tried again at least this often


class Supervisor:
    def __init__(self, *, log: JsonLogger, counters: Counters) -> None:
        self._log = log
        self._counters = counters

    def report(self, loop: str, exc: BaseException, **fields: Any) -> None:
        """Log what ``loop`` met (a transient fault as a warning; anything else as an
        error with its traceback, counted in ``LoopErrors``)."""
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TransientError) or is_transient(exc):
            self._log.warning("loop_retry", loop=loop, error=error, **fields)
            return
        self._counters.add(names.LOOP_ERRORS)
        self._log.error("loop_error", loop=loop, error=error, traceback="".join(traceback.format_exception(exc)), **fields)

    async def keep(self, loop: str, run: Callable[[], Awaitable[T]]) -> T:
        """``await run()`` until it returns; each time it raises, report it and run it
        again after a backoff (which starts over when a run had lasted longer than the
        cap). Cancelling it cancels the loop."""
        attempt = 0
        while True:
            started = clock.now()
            try:
                return await run()
            except Exception as exc:  # noqa: BLE001 - whatever it was, the loop goes on
                if clock.now() - started > LOOP_BACKOFF_CAP_S:
                    attempt = 0  # it had been running: a new fault, not the same one again
                delay = backoff_s(attempt, base=LOOP_BACKOFF_BASE_S, cap=LOOP_BACKOFF_CAP_S)
                self.report(loop, exc, attempt=attempt, retry_in_s=round(delay, 3))
            attempt += 1
            await asyncio.sleep(delay)

    async def retry(
        self,
        loop: str,
        call: Callable[[], Awaitable[T]],
        *,
        deadline: Callable[[], float],
        passes: tuple[type[Exception], ...] = (),
    ) -> T:
        """``await call()`` until it returns. :class:`LeaseExpired` and the ``passes``
        exceptions go to the caller; any other is reported and the call made again after
        a backoff, until the ``deadline()`` (on :func:`wsfleet.clock.now`, read afresh each
        time: renewals move it), then :class:`LeaseExpired`."""
        attempt = 0
        while True:
            try:
                return await call()
            except (LeaseExpired, *passes):
                raise
            except Exception as exc:  # noqa: BLE001 - not about ownership: wait, then again
                delay = min(
                    backoff_s(attempt, base=RETRY_BACKOFF_BASE_S, cap=RETRY_BACKOFF_CAP_S),
                    max(0.0, deadline() - clock.now()),
                )
                self.report(loop, exc, attempt=attempt, retry_in_s=round(delay, 3))
            await asyncio.sleep(delay)
            if deadline() <= clock.now():
                raise LeaseExpired()
            attempt += 1


class LogSampler:
    """At most one log line per key per ``period_s``, counting the ones held back."""

    def __init__(self, period_s: float) -> None:
        self._period = period_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def take(self, key: str, now: float) -> int | None:
        """None: hold this one back. Else log it, with how many were held back since the
        last line of that key."""
        last = self._last.get(key)
        if last is not None and now - last < self._period:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)
