"""The receive gate: at most ``slots`` sockets of a worker hold a large frame at once.

Each socket may hold up to ``allowance`` bytes without asking: every ordinary frame fits.
A socket whose held bytes grow past it (a large frame arriving) needs a slot; when none
is free, it stops reading (``transport.pause_reading``: the kernel buffer fills, the TCP
window closes and the upstream's sends wait) and queues for one, first come first
served. So the worker holds at most ``slots`` large frames in its sockets, plus the
allowance (and one read, 256 KiB in asyncio) per socket, whatever every upstream sends.

What a socket holds (:meth:`GatedConnection.held_bytes`) is read from websockets 17's
internals, which this module relies on (checked by tests/test_gate.py):

* ``protocol.reader.buffer``: the bytes read and not yet parsed (a partial frame);
* ``protocol.current_size``: the size so far of a fragmented message (its fragments move
  into ``Assembler.get``'s own list, out of sight, until the message is whole);
* ``recv_messages.frames.queue``: whole frames waiting for ``recv``;
* the data frames ``process_event`` hands the assembler, whose ``bytearray`` payloads
  are emptied once ``recv`` has joined them into its message (the parser keeps a
  reference to the last frame until the next one is whole: one large frame per socket
  otherwise);
* ``recv_messages.pause`` / ``.resume``: the assembler's flow control callbacks (its
  frame queue's high-water mark, ``max_queue``), replaced (by the base class,
  :class:`~.socket_budget.BudgetedConnection`) so that reading is paused while the queue
  is full, the socket's unsent bytes are over their mark, or the socket waits for a slot,
  and resumed only when none holds it: none resumes what another paused.

* the socket's unsent bytes (the transport's write buffer: our pongs to a peer that pings
  and does not read, :mod:`.socket_budget`), re-checked as they cross the write marks;

and the receive loop's side: the message ``recv`` returned is held until the loop calls
``recv`` again (it has handed the message on to the writer by then, which accounts for
it in its own share) or leaves the socket's ``async with``.

Invariants (tests/test_gate.py):

* at most ``slots`` sockets hold a slot (``high_water`` never exceeds it);
* a slot holder is never paused by the gate, so it can always finish its frame; the
  writer drains whatever it hands on without the gate, so no cycle of waits exists;
* a slot is given back when the socket holds no more than the allowance again, or,
  when others wait, once its large message is handed on (first come, first served:
  a stream of large frames back to back does not keep its slot for ever), and
  always when its connection is lost or its ``async with`` is left (error, cancel):
  a socket that dies mid-frame frees its slot; a waiter that dies leaves the queue.

Read-ahead: a socket stops reading while the messages waiting for its receive loop
(queued, or returned by ``recv`` and not yet handed on) are over the allowance, so a
slot holder holds one large message and at most one read of the next, not ``max_queue``
large frames while its loop waits for the writer.

Closing: the close handshake needs the upstream's close frame read, so once our close
begins the socket is never paused by the gate and does not queue for a slot (what arrives
meanwhile is bounded by the close timeout); a slot it holds is kept until it is done.
(A socket paused for its unsent bytes stays paused: an upstream that does not read
those will not read our close frame behind them either; the close timeout cuts it off.)

Keepalive: a socket paused for a slot (or for read-ahead) cannot read the upstream's
pong, and a large frame on a slow link delays it as long as the frame takes. websockets'
keepalive would then close a live socket (1011), so :meth:`GatedConnection.keepalive` waits for a pong
without a timeout while we hold reading paused, and counts bytes arriving as the peer
being alive: it fails the connection only when neither a pong nor any byte came for
``ping_timeout`` while the socket was reading. It still pings a paused socket: the
write finds a connection the peer reset, which a socket that does not read never sees
(a dead waiter leaves the gate's queue then).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict, deque
from typing import Any, Callable

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import DATA_OPCODES, CloseCode, Frame

from .socket_budget import BudgetedConnection


class ReceiveGate:
    """The worker's receive slots. Touched only from the event loop."""

    def __init__(self, *, slots: int, allowance: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.allowance = allowance
        self._holders: set[GatedConnection] = set()
        self._waiting: OrderedDict[GatedConnection, None] = OrderedDict()
        self.high_water = 0  # most slots held at once, since start
        self.waits = 0  # times a socket paused for a slot
        self.granted = 0  # slots given out

    def connection_factory(self) -> Callable[..., ClientConnection]:
        """What ``websockets.asyncio.client.connect(create_connection=...)`` takes: a
        :class:`GatedConnection` bound to this gate."""
        return functools.partial(GatedConnection, gate=self)

    def holding(self) -> int:
        return len(self._holders)

    def waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict[str, int]:
        return {
            "slots": self.slots,
            "allowance": self.allowance,
            "holding": len(self._holders),
            "waiting": len(self._waiting),
            "high_water": self.high_water,
            "waits": self.waits,
            "granted": self.granted,
        }

    def _take(self, conn: GatedConnection) -> bool:
        """A slot now (True), or queued for the next one free (False: the caller pauses
        reading until :meth:`GatedConnection._granted` is called)."""
        if len(self._holders) < self.slots and not self._waiting:
            self._hold(conn)
            return True
        if conn not in self._waiting:
            self._waiting[conn] = None
            self.waits += 1
        return False

    def _hold(self, conn: GatedConnection) -> None:
        self._holders.add(conn)
        self.granted += 1
        self.high_water = max(self.high_water, len(self._holders))

    def _leave(self, conn: GatedConnection) -> None:
        """The socket needs no slot any more (or is gone): give back its slot, or leave
        the queue; the freed slot goes to the first waiter."""
        self._waiting.pop(conn, None)
        self._holders.discard(conn)
        while self._waiting and len(self._holders) < self.slots:
            nxt, _ = self._waiting.popitem(last=False)
            self._hold(nxt)
            nxt._granted()


MAX_QUEUE = 4  # whole frames a gated socket queues for recv (websockets' default: 16)
UNSENT_RECHECK_S = 0.1  # how often a socket needing a slot for its unsent bytes looks at them again


def connect_options(gate: ReceiveGate | None) -> dict[str, Any]:
    """The ``connect()`` arguments that put a socket behind ``gate`` (None: websockets'
    defaults, no byte bound)."""
    if gate is None:
        return {}
    return {"create_connection": gate.connection_factory(), "max_queue": MAX_QUEUE}


class GatedConnection(BudgetedConnection):
    """A client connection that asks its :class:`ReceiveGate` before it holds more than
    the allowance (and keeps to a socket's budgets, :mod:`.socket_budget`). Built by
    ``connect(create_connection=gate.connection_factory())``."""

    def __init__(self, *args: Any, gate: ReceiveGate, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.has_slot = False
        self._gate_wait = False  # queued for a slot: reading paused by the gate
        self._read_ahead_full = False  # reading paused: a large message waits for the receive loop
        self.held_max = 0  # most bytes held at once (tests and benchmarks)
        self._gone = False  # connection lost, or its async with left: needs nothing
        self._closing = False  # our close began: never paused by the gate (see close)
        self._assembling = 0  # bytes of a fragmented message recv has not returned yet
        self._out = 0  # bytes of the message recv returned, until the next recv
        self._handed_large = False  # that message needed a slot: its turn ends at the next recv
        self._delivered: deque[Frame] = deque()  # data frames given to the assembler, in order
        self._data_at = 0.0  # loop time of the last bytes read: the peer is alive
        self._recheck: asyncio.TimerHandle | None = None  # a look at unsent bytes draining (_recheck_unsent)

    # --- what the socket holds ------------------------------------------------------------

    def _waiting_bytes(self) -> int:
        """Whole messages (or fragments) read and not yet handed on by the receive loop."""
        return sum(len(f.data) for f in self.recv_messages.frames.queue) + self._out

    def held_bytes(self) -> int:
        """Bytes this socket holds now: frames, and what it has not sent (see the module
        docstring). Unsent bytes over the allowance need a slot like a large frame: with
        none free, reading stops, and no more pongs are made, at the allowance, not at the
        socket's own 1 MiB mark."""
        transport = self.transport
        unsent = transport.get_write_buffer_size() if transport is not None and not self._gone else 0
        return len(self.protocol.reader.buffer) + self._waiting_bytes() + self._assembling + unsent

    def _check(self) -> None:
        """Take, keep or give back a slot for what the socket holds now, and read ahead
        only while what waits for the receive loop fits the allowance: a slot holder
        holds one large message at a time, not ``max_queue`` of them."""
        held = self.held_bytes()
        self.held_max = max(self.held_max, held)
        self._recheck_unsent()
        ahead = not self._closing and self._waiting_bytes() > self.gate.allowance
        if ahead != self._read_ahead_full:
            self._read_ahead_full = ahead
            self._apply_reading()
        need = not self._gone and held > self.gate.allowance
        if need and not self.has_slot and not self._gate_wait and not self._closing:
            if self.gate._take(self):
                self.has_slot = True
            else:
                self._gate_wait = True
                self._apply_reading()
        elif (not need and self.has_slot) or (self._gate_wait and (not need or self._closing)):
            self.has_slot = False
            if self._gate_wait:
                self._gate_wait = False
                self._apply_reading()
            self.gate._leave(self)

    def _recheck_unsent(self) -> None:
        """asyncio tells of unsent bytes only as they cross the write marks: while they
        are part of why this socket needs a slot, look again every UNSENT_RECHECK_S, so
        that the slot (or the place in the queue) goes once they drain."""
        transport = self.transport
        unsent = transport.get_write_buffer_size() if transport is not None and not self._gone else 0
        if unsent and (self.has_slot or self._gate_wait) and self._recheck is None:
            self._recheck = self.loop.call_later(UNSENT_RECHECK_S, self._rechecked)

    def _rechecked(self) -> None:
        self._recheck = None
        self._check()

    def _granted(self) -> None:
        """The gate gave this waiting socket a slot: read again."""
        self.has_slot = True
        self._gate_wait = False
        self._apply_reading()

    # --- reading: paused also while a slot is awaited or a large message waits -------------

    def _pause_wanted(self) -> bool:
        return super()._pause_wanted() or self._gate_wait or self._read_ahead_full

    # --- websockets' hooks ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._data_at = self.loop.time()
        super().data_received(data)
        size = self.protocol.current_size
        if size is not None:
            self._assembling = max(self._assembling, size)
        self._check()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._check()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._check()  # drained: a slot taken for unsent bytes is given back

    def process_event(self, event: Any) -> None:
        super().process_event(event)
        if isinstance(event, Frame) and event.opcode in DATA_OPCODES:
            self._delivered.append(event)

    def _release_consumed(self) -> None:
        """Empty the payload of every frame recv has consumed: websockets' parser keeps
        its last frame in a local variable until the next frame is whole, so without
        this every socket that ever received a large frame keeps one (the receive loop
        has its own copy, the joined message)."""
        for _ in range(len(self._delivered) - len(self.recv_messages.frames)):
            data = self._delivered.popleft().data
            if isinstance(data, bytearray):
                data.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            # The partial frame is gone with the socket. Frames already queued (recv
            # still returns them) and the message recv returned stay the receive loop's
            # until it calls recv again or leaves the async with.
            self.protocol.reader.buffer.clear()
            self._assembling = 0
            self._check()

    async def recv(self, decode: bool | None = None) -> Any:
        # Called again: the last message was handed on (or dropped).
        self._out = 0
        if self._handed_large and self.has_slot and self.gate.waiting():
            # Its turn is over: the slot goes to the first waiter, and this socket, if its
            # next frame is large too, queues behind the others (no stream starves).
            self.has_slot = False
            self.gate._leave(self)
        self._handed_large = False
        self._check()
        message = await super().recv(decode)
        self._release_consumed()
        self._assembling = 0
        self._out = len(message)
        self._handed_large = self._out > self.gate.allowance
        self._check()
        return message

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        # The close handshake needs the upstream's close frame read: from now on reading
        # is never paused by the gate, and a socket without a slot does not queue for one
        # (what arrives while closing is bounded by the close timeout). A slot held is
        # kept until the socket is done with it.
        self._closing, self._out = True, 0
        self._check()
        await super().close(code, reason)

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await super().__aexit__(*exc)
        finally:
            self._gone, self._out, self._assembling = True, 0, 0
            self._check()

    async def keepalive(self) -> None:
        """Ping every ``ping_interval``; fail the connection when neither a pong nor any
        byte arrived for ``ping_timeout`` while the socket was reading. Replaces
        websockets' own loop (see the module docstring); cancelled by connection_lost."""
        assert self.ping_interval is not None
        try:
            while True:
                await asyncio.sleep(self.ping_interval)
                # Pinged even while paused: the pong cannot be read then, but writing the
                # ping finds a connection the peer reset (a paused socket reads no EOF).
                pong = await self.ping()
                if self.ping_timeout is None:
                    continue
                since = self.loop.time()
                while True:
                    # Paused by us, no pong can be read: wait only until the next ping is due.
                    wait_s = min(self.ping_timeout, self.ping_interval) if self._reading_paused else self.ping_timeout
                    done, _ = await asyncio.wait({pong}, timeout=wait_s)
                    if done or self._reading_paused:
                        break  # a pong, or we hold reading paused: ping again next interval
                    if self._data_at > since or self._pause_changed_at > since:
                        since = self.loop.time()  # the peer is sending, or was just resumed: alive
                        continue
                    async with self.send_context():
                        self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
                    return
        except ConnectionClosed:
            pass
        except Exception:  # noqa: BLE001 - as websockets' own keepalive: log, never raise
            self.logger.error("keepalive ping failed", exc_info=True)
