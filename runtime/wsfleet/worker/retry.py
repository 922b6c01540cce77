"""Retrying a store call through transient faults, bounded by the deadline; waiting for
the first of several events."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .. import clock
from ..leases import backoff_s
from ..logs import JsonLogger
from ..store import TransientError


DEADLINE_POLL_S = 0.5  # how often a slow attempt re-reads the deadline


class LeaseExpired(Exception):
    """The local lease deadline passed before the call got through: stop writing."""


async def call_until(
    call: Callable[..., Awaitable[Any]],
    deadline: Callable[[], float],
    fn: Callable[..., Any],
    /,
    log: JsonLogger,
    **kwargs: Any,
) -> Any:
    """``await call(fn, **kwargs)``, retrying :class:`TransientError` with jittered
    backoff until the ``deadline()`` (:func:`wsfleet.clock.now`). The deadline is read afresh while an
    attempt is in flight and before each retry (a renewal may extend it meanwhile), so a
    slow attempt is waited for as long as the worker may still write, never abandoned
    early. Raises :class:`LeaseExpired` once it has passed; a transient fault is never
    reported as a lost lease."""
    attempt = 0
    while True:
        if deadline() <= clock.now():
            raise LeaseExpired()
        task = asyncio.ensure_future(call(fn, **kwargs))
        try:
            while not task.done():
                left = deadline() - clock.now()
                if left <= 0:
                    raise LeaseExpired()
                await asyncio.wait({task}, timeout=min(left, DEADLINE_POLL_S))
            return task.result()
        except TransientError as exc:
            log.warning("transient_error", op=getattr(fn, "__name__", "?"), error=str(exc), attempt=attempt)
        finally:
            task.cancel()  # no-op once done; past the deadline the thread may still finish, harmlessly
        await asyncio.sleep(min(backoff_s(attempt), max(0.0, deadline() - clock.now())))
        attempt += 1


async def woken_or_timeout(event: asyncio.Event, timeout: float) -> None:
    """Clear ``event``, then wait until it is set again or ``timeout`` seconds pass: a
    loop that sleeps until its next deadline unless something new arrives first."""
    event.clear()
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout)
    except TimeoutError:
        pass


async def first_of(*aws: Any) -> None:
    """Wait until the first of the awaitables completes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
