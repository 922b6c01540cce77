"""Received -> stored times of frames, as a histogram the writer fills and tools read.

Fixed log-spaced buckets (no allocation per frame beyond the float): a rolling window of
time slots for the ``stats`` line's p50 / p99 / max, read without changing anything, and
a cumulative histogram since start, which tools subtract between two lines for any
window's percentiles (the benchmarks do).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable, Iterable, Mapping, Sequence

from .. import clock

# Upper bounds (ms) of the received -> stored histogram's buckets: 8 per doubling from
# 1 ms to 2^17 ms (about 131 s), so a bucket is 9 % wide; one more bucket beyond.
LATENCY_BOUNDS_MS: tuple[float, ...] = tuple(2 ** (i / 8) for i in range(8 * 17 + 1))


def latency_key(bucket: int) -> str:
    """How a bucket is named in the stats line: its upper bound in ms (3 digits), or
    ``inf`` for the one beyond the last bound."""
    return f"{LATENCY_BOUNDS_MS[bucket]:.3g}" if bucket < len(LATENCY_BOUNDS_MS) else "inf"


def histogram_quantile(counts: Sequence[int], q: float, max_ms: float | None = None) -> float | None:
    """The q-th percentile (0..100) of a histogram over :data:`LATENCY_BOUNDS_MS` (counts
    per bucket, the overflow bucket last), interpolated linearly inside its bucket and
    never above ``max_ms`` when the largest value is known; None when it is empty. With
    q 100 and no ``max_ms``: the upper bound of the highest non-empty bucket."""
    n = sum(counts)
    if n == 0:
        return None
    rank = max(1.0, q / 100 * n)
    seen = 0
    for b, c in enumerate(counts):
        if c and seen + c >= rank:
            lower = LATENCY_BOUNDS_MS[b - 1] if b > 0 else 0.0
            if b >= len(LATENCY_BOUNDS_MS):  # beyond the last bound: only the maximum says more
                return max_ms if max_ms is not None else lower
            value = lower + (LATENCY_BOUNDS_MS[b] - lower) * (rank - seen) / c
            return min(value, max_ms) if max_ms is not None else value
        seen += c
    return max_ms


def histogram_of(cumulative: Mapping[str, int]) -> list[int]:
    """A stats line's cumulative histogram (``{bound: count}``, see :func:`latency_key`)
    back as counts per bucket."""
    index = {latency_key(b): b for b in range(len(LATENCY_BOUNDS_MS) + 1)}
    counts = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    for key, n in cumulative.items():
        counts[index[key]] += n
    return counts


class Latency:
    """Frame received -> stored times: a histogram per time slot (``slots`` of
    ``window_s / slots`` seconds each, reused round-robin) for the rolling summary, and
    one since start for tools that difference two readings."""

    def __init__(self, window_s: float = 60.0, slots: int = 6, clock: Callable[[], float] = clock.now) -> None:
        self.window_s = window_s
        self._slot_s = window_s / slots
        self._clock = clock
        width = len(LATENCY_BOUNDS_MS) + 1
        self._counts = [[0] * width for _ in range(slots)]
        self._max = [0.0] * slots
        self._epoch = [-1] * slots
        self._total = [0] * width

    def record(self, now: float, handed: Iterable[float]) -> None:
        """One stored batch: ``handed`` are its frames' hand-over times (clock.now() s)."""
        epoch = int(now // self._slot_s)
        slot = epoch % len(self._epoch)
        counts = self._counts[slot]
        if self._epoch[slot] != epoch:  # a slot last used a whole window ago, or never
            counts[:] = [0] * len(counts)
            self._max[slot] = 0.0
            self._epoch[slot] = epoch
        total, bounds, top = self._total, LATENCY_BOUNDS_MS, self._max[slot]
        for t in handed:
            ms = (now - t) * 1000.0
            b = bisect_left(bounds, ms)
            counts[b] += 1
            total[b] += 1
            if ms > top:
                top = ms
        self._max[slot] = top

    def summary(self) -> dict[str, Any]:
        """n, p50, p99 and max (ms) over the slots of the rolling window."""
        now_epoch = int(self._clock() // self._slot_s)
        live = [s for s, e in enumerate(self._epoch) if now_epoch - len(self._epoch) < e <= now_epoch]
        counts = [sum(col) for col in zip(*(self._counts[s] for s in live), strict=True)] if live else []
        top = max((self._max[s] for s in live), default=0.0)
        n = sum(counts)

        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        return {
            "window_s": self.window_s,
            "n": n,
            "p50": r(histogram_quantile(counts, 50, top)) if n else None,
            "p99": r(histogram_quantile(counts, 99, top)) if n else None,
            "max": r(top) if n else None,
        }

    def cumulative(self) -> dict[str, int]:
        """Every frame stored since start, per bucket (non-empty buckets only)."""
        return {latency_key(b): c for b, c in enumerate(self._total) if c}
