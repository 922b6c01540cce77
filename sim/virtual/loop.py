"""Virtual time for asyncio: the product's own coroutines, timers and timeouts, run on a
clock the simulation moves.

:class:`VirtualLoop` is asyncio's selector loop whose ``time()`` is a number it keeps:
when nothing is ready to run, the selector, instead of sleeping until the next timer,
moves the clock to it. Every ``asyncio.sleep``, ``wait_for`` and ``call_later`` of the
worker's roles then takes no real time, and nothing but the event order (fixed by the
code and the seeded random numbers) decides what happens: a seed replays a run.

:func:`virtual_clock` points :func:`wsfleet.clock.now` (the worker's deadline clock) at
the loop for the duration of a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from typing import Iterator

from wsfleet import clock

EPOCH_S = 1_800_000_000.0  # the wall clock at virtual time 0 (epoch seconds)


class Stalled(RuntimeError):
    """Nothing ready and no timer: the run can never go on."""


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: "VirtualLoop") -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):  # type: ignore[override]
        if timeout is None:
            raise Stalled("the simulation has nothing left to run")
        if timeout > 0:
            self._loop.now += timeout
        return super().select(0)


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_Selector(self))
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return int((EPOCH_S + self.now) * 1000)


@contextlib.contextmanager
def virtual_clock(loop: VirtualLoop) -> Iterator[None]:
    real = clock.now
    clock.now = loop.time
    try:
        yield
    finally:
        clock.now = real
