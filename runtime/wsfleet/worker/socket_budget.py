"""What a peer can make one socket send: unsent bytes bounded, a control-frame flood closed.

websockets answers every PING the moment it parses it, with a PONG as large as the ping,
whether or not the peer ever reads; nothing else of the worker sees those bytes. A peer
that pings and never reads would pile up our pongs in the transport's write buffer without
end (200 MiB of pings: about +200 MB of RSS, a dead worker, then its next owner). So,
per socket:

* **Unsent bytes bounded.** A socket whose unsent bytes (the transport's write buffer)
  pass :data:`WRITE_LIMIT_BYTES` is not read until they drain to
  :data:`WRITE_RESUME_BYTES`: no ping is read, so no pong is made. The marks are
  websockets' documented ``write_limit`` (:func:`connect_options`), which it hands to the
  transport's ``set_write_buffer_limits``; asyncio then calls the protocol's
  ``pause_writing`` and ``resume_writing`` as the buffer crosses them, and
  :class:`BudgetedConnection` pauses and resumes reading there. Nothing of websockets'
  parsing or answering is replaced.

  Why pausing is safe: it only stops the transport handing us bytes. What it handed over
  was parsed whole (a frame half-read stays in websockets' parser buffer, the rest of it
  in the kernel's), and resuming goes on from exactly there: nothing is lost or reordered.
  Meanwhile the TCP window closes and the peer's own sends wait. The pongs of the read
  that crossed the mark are all written (one read is at most 256 KiB on selector
  transports; a pong is its ping plus a 4-byte mask, so at most 3x for empty pings), so a
  socket holds at most the mark plus that one read's answers. Our own sends (the open
  message, keepalive pings) wait in websockets' ``drain`` past the same mark, as they did
  past its 32 KiB default; a close handshake behind unsent bytes is cut off by the close
  timeout, as with any peer that does not read.

* **A control-frame flood closed.** Control frames (PING, PONG) are counted in a leaky
  bucket (:class:`ControlFlood`, pure): a peer floods while its control frames have come
  faster than :data:`CONTROL_RATE` a second since the bucket was last empty, or while we
  have paused reading it for unsent bytes (a paused socket sees no more pings, so the
  pause counts toward the flood). Flooding for :data:`FLOOD_S` without a break closes the socket
  (aborted: a peer that does not read would not finish a close handshake) with
  :class:`OverBudget` as the cause of websockets' ``ConnectionClosed``; the runner then
  writes its text to ``last_error`` and waits like a refusal (:mod:`.connection`).

* **Its share of the event loop.** The loop time a socket's frames take (websockets'
  parsing of its bytes in ``data_received``, and the receive loop's parse of each frame
  small enough to parse on the loop: :mod:`.decoder` charges it here) fills a second
  leaky bucket (:class:`LoopShare`, pure), which leaks :data:`LOOP_SHARE` of a second a
  second. A socket whose bucket has not emptied for :data:`LOOP_SHARE_S` (more than half
  of the loop's time sustained over 10 s, or one burst of more than 5 s of it) is closed
  the same way, ``last_error`` naming ``loop_share``. Round-robin scheduling already
  gives neighbours their turn between its frames; this stops one feed (frames the
  parser works hard on and then rejects, say, which nothing stores and so nothing slows)
  from taking a worker's CPU for ever.

Each socket counts afresh; what a connection's sockets measured is kept across its
reconnects in its :class:`BudgetStats`.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
import time
from typing import Any, Callable

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from .. import metrics_names as names

CONTROL_FLOOD = "control_flood"  # the budget's name, in last_error and the log

# A socket's unsent bytes past this are not added to: 1 MiB holds thousands of pongs and
# any open message, so a peer that reads at all is never paused; one that does not holds
# this and one read's answers at most, and only for FLOOD_S.
WRITE_LIMIT_BYTES = 1024 * 1024
# Reading resumes once this little is left unsent: enough drained that a socket read
# again does not pause again at once (asyncio's own default low mark is a quarter too).
WRITE_RESUME_BYTES = WRITE_LIMIT_BYTES // 4
# Control frames a second a peer may send for ever: a real upstream pings every few
# seconds (ours every 20 s); fifty a second is a peer doing nothing else.
CONTROL_RATE = 50.0
# How long a peer may go over CONTROL_RATE, or leave our bytes unread, before it is
# closed: long enough that a burst (up to CONTROL_RATE * FLOOD_S frames at once) is
# forgiven, short enough that a flood costs a worker seconds of work, never its memory.
FLOOD_S = 10.0
# last_error for a control flood: one sentence whatever the counts, so that flooding
# again does not write the item again.
FLOOD_TEXT = (
    f"{CONTROL_FLOOD}: the upstream sent control frames (pings) faster than {CONTROL_RATE:g} a second,"
    f" or left our answers unread (over {WRITE_LIMIT_BYTES // 2**20} MiB unsent), for {FLOOD_S:g} s;"
    " closed, and tried again after the refusal wait"
)

DECODE_BUDGET = "decode_budget"  # a frame that cost more to parse than the decoder allows (worker.decoder)
DECODE_TEXT = (
    f"{DECODE_BUDGET}: a frame needed more memory or time to parse than the worker allows (stored as an "
    "over_frame_limit marker at its seq); closed, and tried again after the refusal wait"
)
LOOP_SHARE_BUDGET = "loop_share"  # the budget's name, in last_error and the log
# Of the event loop's time, what one connection's frames may take for ever: a worker holds
# hundreds of connections; one taking half of its only core is a feed for a worker of its own.
LOOP_SHARE = 0.5
# How long a connection may stay over LOOP_SHARE before it is closed (a backlog replayed
# after a reconnect is parsed in a burst: up to LOOP_SHARE * LOOP_SHARE_S seconds of it
# are forgiven).
LOOP_SHARE_S = 10.0
LOOP_SHARE_TEXT = (
    f"{LOOP_SHARE_BUDGET}: the upstream's frames took more than {LOOP_SHARE:.0%} of the worker's event loop"
    f" for {LOOP_SHARE_S:g} s; closed, and tried again after the refusal wait"
)


class LeakyBucket:
    """A bucket that leaks ``rate`` a second, on the clock its caller passes (no I/O):
    :meth:`over` once it has not been empty (or, for a flood, reading has been paused)
    for ``limit_s`` without a break."""

    def __init__(self, now: float, *, rate: float, limit_s: float) -> None:
        self.rate, self.limit_s = rate, limit_s
        self._level = 0.0  # what came beyond the rate, not leaked out yet
        self._at = now  # when _level was last brought up to date
        self._since: float | None = None  # when the excess going on began
        self._paused = False  # reading is paused for unsent bytes (a flood's)

    def _settle(self, now: float) -> None:
        self._level = max(0.0, self._level - self.rate * (now - self._at))
        self._at = now
        if self._level == 0.0 and not self._paused:
            self._since = None  # empty and reading: whatever excess there was has ended

    def add(self, now: float, amount: float = 1.0) -> None:
        self._settle(now)
        self._level += amount
        if self._since is None:
            self._since = now

    def deadline(self) -> float | None:
        """When the excess going on (if any) is over the budget, unless it ends first."""
        return None if self._since is None else self._since + self.limit_s

    def over(self, now: float) -> bool:
        """Not empty (or paused) for ``limit_s`` without a break."""
        self._settle(now)
        return self._since is not None and now - self._since >= self.limit_s


class LoopShare(LeakyBucket):
    """One socket's share of the event loop: seconds of loop time in, :data:`LOOP_SHARE`
    a second out."""

    def __init__(self, now: float) -> None:
        super().__init__(now, rate=LOOP_SHARE, limit_s=LOOP_SHARE_S)


class ControlFlood(LeakyBucket):
    """One socket's flood accounting: each control frame adds one, :data:`CONTROL_RATE`
    a second leak out. The socket floods while the bucket is not empty or its reading is
    paused for unsent bytes; :meth:`over` once it has flooded for :data:`FLOOD_S` without
    a break, which is more than CONTROL_RATE control frames a second sustained over
    FLOOD_S, unsent bytes that did not drain for FLOOD_S, or the one running into the other."""

    def __init__(self, now: float) -> None:
        super().__init__(now, rate=CONTROL_RATE, limit_s=FLOOD_S)

    def control(self, now: float) -> None:
        """A control frame arrived."""
        self.add(now)

    def pause(self, now: float) -> None:
        """Reading paused: the unsent bytes passed the mark."""
        self._settle(now)
        self._paused = True
        if self._since is None:
            self._since = now

    def resume(self, now: float) -> None:
        """Reading resumed: the unsent bytes drained."""
        self._settle(now)
        self._paused = False
        if self._level == 0.0:
            self._since = None


class OverBudget(Exception):
    """Why we closed a socket: ``budget`` names the budget (:data:`CONTROL_FLOOD`,
    :data:`LOOP_SHARE_BUDGET`),
    ``text`` is the sentence for ``last_error``. The cause of the ``ConnectionClosed``
    that the socket's ``recv`` raises then."""

    counter, event = names.BUDGET_CLOSES, "closed_over_budget"  # as the refusal wait counts and logs it

    def __init__(self, budget: str, text: str) -> None:
        super().__init__(text)
        self.budget = budget
        self.text = text


def over_budget(exc: BaseException) -> OverBudget | None:
    """Why we closed the socket whose ``recv`` raised ``exc``, if over a budget."""
    cause = exc.__cause__
    return cause if isinstance(exc, ConnectionClosed) and isinstance(cause, OverBudget) else None


@dataclass
class BudgetStats:
    """What one connection's sockets measured, across its reconnects."""

    unsent_max: int = 0  # most bytes a socket of it left unsent at once
    write_pauses: int = 0  # times a socket's reading paused for unsent bytes
    flood_closes: int = 0  # sockets closed as a control flood
    share_closes: int = 0  # sockets closed for taking more than their share of the loop
    decode_closes: int = 0  # sockets closed after a frame over the decoder's budget
    loop_s: float = 0.0  # loop time its frames took (websockets' parsing and ours on the loop)
    received_bytes: int = 0  # bytes its sockets received: what names a prime suspect (wsfleet.crash_loop)


class BudgetedConnection(ClientConnection):
    """A client connection that keeps to the budgets above. It also owns why reading is
    paused, so that no two reasons resume what the other paused: websockets' assembler
    (its frame queue's ``max_queue``) and unsent bytes here, more in a subclass
    (:meth:`_pause_wanted`; the receive gate's, :mod:`.gate`)."""

    def __init__(self, *args: Any, stats: BudgetStats | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats = stats if stats is not None else BudgetStats()
        self._flood = ControlFlood(self.loop.time())
        self._share = LoopShare(self.loop.time())
        self._flood_check: asyncio.TimerHandle | None = None  # wakes a paused socket at its deadline
        self._queue_full = False  # reading paused by the assembler (max_queue)
        self._write_full = False  # reading paused: unsent bytes past WRITE_LIMIT_BYTES
        self._reading_paused = False
        self._pause_changed_at = 0.0  # loop time reading was last paused or resumed by us

    # --- reading: paused while any reason holds ------------------------------------------

    def _pause_wanted(self) -> bool:
        return self._queue_full or self._write_full

    def _apply_reading(self) -> None:
        paused = self._pause_wanted()
        if paused == self._reading_paused:
            return
        self._reading_paused = paused
        self._pause_changed_at = self.loop.time()
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _queue_pause(self) -> None:
        self._queue_full = True
        self._apply_reading()

    def _queue_resume(self) -> None:
        self._queue_full = False
        self._apply_reading()

    # --- asyncio's and websockets' hooks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.recv_messages.pause = self._queue_pause
        self.recv_messages.resume = self._queue_resume

    def pause_writing(self) -> None:
        super().pause_writing()
        self.stats.write_pauses += 1
        self._write_full = True
        self._apply_reading()
        self._flood.pause(self.loop.time())
        self._wake_at_deadline()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_full = False
        self._apply_reading()
        self._flood.resume(self.loop.time())

    def data_received(self, data: bytes) -> None:
        began = time.perf_counter()
        self.stats.received_bytes += len(data)
        super().data_received(data)  # answers its pings: the pongs are written here
        self.stats.unsent_max = max(self.stats.unsent_max, self.transport.get_write_buffer_size())
        self.charge_loop(time.perf_counter() - began)

    def charge_loop(self, seconds: float) -> None:
        """``seconds`` of the event loop taken for this socket's frames (see LoopShare)."""
        self.stats.loop_s += seconds
        now = self.loop.time()
        self._share.add(now, seconds)
        if self._share.over(now) and not self.transport.is_closing():
            self.stats.share_closes += 1
            self._close_over(OverBudget(LOOP_SHARE_BUDGET, LOOP_SHARE_TEXT))

    def process_event(self, event: Any) -> None:
        super().process_event(event)
        if isinstance(event, Frame) and event.opcode in (Opcode.PING, Opcode.PONG):
            now = self.loop.time()
            self._flood.control(now)
            if self._flood.over(now):
                self._close_flooded()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if self._flood_check is not None:
                self._flood_check.cancel()
                self._flood_check = None

    # --- the flood ------------------------------------------------------------------------

    def _wake_at_deadline(self) -> None:
        """A paused socket receives nothing that would check the flood: a timer does."""
        deadline = self._flood.deadline()
        if deadline is None or self._flood_check is not None:
            return  # no flood, or woken already (at an earlier deadline: checked again then)
        self._flood_check = self.loop.call_at(deadline, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._flood_check = None
        if self._flood.over(self.loop.time()):
            self._close_flooded()
        else:
            self._wake_at_deadline()  # the flood ended meanwhile, or a later one is on

    def _close_flooded(self) -> None:
        if self.transport.is_closing():
            return  # closed already (by us, a moment ago, or otherwise)
        self.stats.flood_closes += 1
        self._close_over(OverBudget(CONTROL_FLOOD, FLOOD_TEXT))

    def close_over_decode_budget(self) -> None:
        """A frame of this socket was given up by the decoder (its marker is queued): close
        it over that budget, as for the others; the connection waits like a refusal and
        resumes after the marker."""
        if not self.transport.is_closing():
            self.stats.decode_closes += 1
            self._close_over(OverBudget(DECODE_BUDGET, DECODE_TEXT))

    def _close_over(self, why: OverBudget) -> None:
        # Aborted: a peer over a budget is not waited for through a close handshake.
        self.set_connection_exc(why)
        self.transport.abort()


def connection_factory(base: Callable[..., ClientConnection] | None, stats: BudgetStats) -> Callable[..., ClientConnection]:
    """What ``connect(create_connection=...)`` takes: ``base`` (a :class:`BudgetedConnection`
    or a factory of one; None: this module's own) counting into ``stats``."""
    return functools.partial(base or BudgetedConnection, stats=stats)


def connect_options() -> dict[str, Any]:
    """The ``connect()`` arguments of the unsent-bytes marks (websockets' ``write_limit``)."""
    return {"write_limit": (WRITE_LIMIT_BYTES, WRITE_RESUME_BYTES)}
