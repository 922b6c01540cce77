"""One connection's feed as an operator watches it: silence, and a feed gone malformed.

A socket can stay open while its feed has stopped (the server dropped the subscription,
a proxy ate it): keepalive sees a healthy socket, nothing arrives. With the upstream's
``max_silence_seconds``, :meth:`FeedHealth.recv` gives up on a socket that has accepted
no frame for that long since it opened (or since the last frame) with :class:`Silent`;
the runner then closes it and connects again, resuming as usual (``SilenceReconnects``).
Frames dropped by the upstream's ``ignore`` rules are not accepted frames: a feed that
sends only heartbeats is silent.

Two gauges for the fleet: :meth:`FeedHealth.silent` (nothing accepted for longer than the
limit, across reconnects: ``SilentConnections``) and :meth:`FeedHealth.mostly_malformed`
(over the last :data:`WINDOW_S`, at least :data:`MIN_FRAMES` frames of which more than
:data:`MALFORMED_SHARE` malformed: a feed whose format changed looks like that, where
otherwise it would look like a quiet one; ``MalformedConnections``, with an alarm).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from .. import clock

WINDOW_S = 300.0  # what "mostly malformed" is judged over
BUCKET_S = 60.0
MIN_FRAMES = 10  # fewer frames in the window say nothing
MALFORMED_SHARE = 0.5


class Silent(Exception):
    """No frame accepted for ``max_silence_seconds``: close the socket, connect again."""


class FeedHealth:
    def __init__(self, max_silence_s: float | None, now: float) -> None:
        self.max_silence_s = max_silence_s
        self._window_from = now  # the socket's silence window starts at its open, or its last frame
        self.last_accepted = now  # the newest frame accepted, across reconnects
        self._buckets: deque[list[float]] = deque()  # [bucket start, frames, malformed]

    def connected(self, now: float) -> None:
        self._window_from = now

    def accepted(self, now: float) -> None:
        self.last_accepted = self._window_from = now

    def received(self, now: float, *, malformed: bool) -> None:
        """A frame arrived (ignored ones are not counted)."""
        start = now - now % BUCKET_S
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append([start, 0, 0])
        self._buckets[-1][1] += 1
        self._buckets[-1][2] += malformed
        while self._buckets and self._buckets[0][0] <= now - WINDOW_S:
            self._buckets.popleft()

    def mostly_malformed(self, now: float) -> bool:
        recent = [b for b in self._buckets if b[0] > now - WINDOW_S]
        frames = sum(b[1] for b in recent)
        return frames >= MIN_FRAMES and sum(b[2] for b in recent) > MALFORMED_SHARE * frames

    def silent(self, now: float) -> bool:
        return self.max_silence_s is not None and now - self.last_accepted > self.max_silence_s

    async def recv(self, ws: Any) -> bytes:
        """The socket's next frame, as bytes; :class:`Silent` once the feed has been
        silent for its limit. (websockets' ``recv`` may be cancelled safely: nothing is lost.)"""
        if self.max_silence_s is None:
            return await ws.recv(decode=False)
        left = self._window_from + self.max_silence_s - clock.now()
        try:
            return await asyncio.wait_for(ws.recv(decode=False), max(0.0, left))
        except TimeoutError:
            raise Silent(f"no frame accepted for {self.max_silence_s:g} s") from None
