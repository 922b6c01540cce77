"""The worker's own clock for deadlines: seconds that keep counting while the machine is
suspended.

A worker decides on its own when its session has run out: the send time of its last
successful renewal, plus the lease, less the skew margin. ``time.monotonic`` does not
count time a VM (or a laptop) spends suspended, so after a suspension longer than the
lease a worker would believe its session alive while its watchers, whose wall clocks
moved on, have ended it and handed its connections to others; it would go on writing.
``CLOCK_BOOTTIME`` counts suspended time and, like the monotonic clock, never jumps with
the wall clock. Where the platform has no such clock, the monotonic one is used.

Every time the worker compares with a deadline (and every time it computes one) comes
from :func:`now`; pauses and timeouts given to asyncio are durations and need no clock.
"""

from __future__ import annotations

import time

_CLOCK: int | None = getattr(time, "CLOCK_BOOTTIME", None)
if _CLOCK is not None:
    try:
        time.clock_gettime(_CLOCK)
    except OSError:  # the constant exists but the kernel refuses it
        _CLOCK = None


def now() -> float:
    """Seconds since an arbitrary point, never going back, counting suspended time where
    the platform can (``CLOCK_BOOTTIME``), else ``time.monotonic()``."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


def counts_suspended_time() -> bool:
    return _CLOCK is not None
