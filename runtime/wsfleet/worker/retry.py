"""Retrying a store call through transient faults, bounded by the deadline; waiting for
the first of several events."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from ..leases import backoff_s
from ..logs import JsonLogger
from ..store import TransientError


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
    backoff until the monotonic ``deadline()`` (read afresh each attempt: a renewal
    may extend it meanwhile). Raises :class:`LeaseExpired` once it has passed; a
    transient fault is never reported as a lost lease."""
    attempt = 0
    while True:
        left = deadline() - time.monotonic()
        if left <= 0:
            raise LeaseExpired()
        try:
            return await asyncio.wait_for(call(fn, **kwargs), timeout=left)
        except TimeoutError:
            raise LeaseExpired() from None
        except TransientError as exc:
            log.warning("transient_error", op=getattr(fn, "__name__", "?"), error=str(exc), attempt=attempt)
        await asyncio.sleep(min(backoff_s(attempt), max(0.0, deadline() - time.monotonic())))
        attempt += 1


async def first_of(*aws: Any) -> None:
    """Wait until the first of the awaitables completes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
