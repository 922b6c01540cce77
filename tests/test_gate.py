"""The receive gate (worker.gate) with real sockets: at most ``slots`` sockets hold a
large frame, each holds one large message at a time, every frame arrives in order,
nothing deadlocks, and a slot comes back when its socket dies, mid-frame or waiting.

Sockets are real: the local upstream (sim.upstream) for whole streams, and a
bare TCP server that sends a WebSocket frame header and part of its payload, then
nothing, for a socket that dies in the middle of a frame. No timed assertions: every
wait polls a condition with a generous deadline."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from sim.upstream import Upstream
from wsfleet.worker.gate import MAX_QUEUE, ReceiveGate, connect_options

ALLOWANCE = 64 * 1024
READ_CHUNK = 256 * 1024  # the most one asyncio read hands over (selector transports)
FRAME = 2 * 1000 * 1000
DEADLINE_S = 60.0


async def until(predicate, what: str, timeout: float = DEADLINE_S) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def big(seq: int) -> str:
    return f"{seq:08d}" + "x" * (FRAME - 8)


def test_the_connection_reads_what_websockets_17_keeps_where_the_gate_looks():
    """The internals the gate relies on exist under these names (worker.gate's docstring)."""
    from websockets.asyncio.messages import Assembler
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    protocol = ClientProtocol(parse_uri("ws://example.com/"))
    assert isinstance(protocol.reader.buffer, bytearray) and protocol.current_size is None

    async def assembler() -> Assembler:
        return Assembler(1, 0)

    a = asyncio.run(assembler())
    assert callable(a.pause) and callable(a.resume) and len(a.frames.queue) == 0


def test_six_sockets_sending_large_frames_share_two_slots_and_every_frame_arrives_in_order():
    async def scenario():
        gate = ReceiveGate(slots=2, allowance=ALLOWANCE)
        async with Upstream(rate=None) as up:
            names = [f"s{i}" for i in range(6)]
            for name in names:
                up.create_stream(name)
                for seq in range(1, 4):
                    up.publish(name, big(seq))
            go = asyncio.Event()
            got: dict[str, list[int]] = {n: [] for n in names}
            order: list[int] = []
            conns = {}

            async def consume(name: str) -> None:
                async with connect(up.url_for(name), max_size=4 * FRAME, compression=None, **connect_options(gate)) as ws:
                    conns[name] = ws
                    await go.wait()
                    for _ in range(3):
                        frame = json.loads(await ws.recv(decode=False))
                        assert frame["data"].startswith(f"{frame['seq']:08d}")
                        got[name].append(frame["seq"])
                        order.append(frame["seq"])
                        await asyncio.sleep(0)  # as the receive loop hands it on

            tasks = [asyncio.create_task(consume(n)) for n in names]
            # Nobody reads yet: two sockets hold a slot (a whole frame each), the other
            # four have each started a large frame and wait, paused.
            await until(lambda: gate.holding() == 2 and gate.waiting() == 4, "2 holders and 4 waiters")
            assert all(c.held_max <= ALLOWANCE + READ_CHUNK for c in conns.values() if not c.has_slot)
            go.set()
            await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
            return gate, got, conns, order

    gate, got, conns, order = asyncio.run(scenario())
    # Turns: a socket with large frames back to back gives its slot to the waiters after
    # each one, so every stream gets its first frame before any gets its third.
    assert max(i for i, seq in enumerate(order) if seq == 1) < min(i for i, seq in enumerate(order) if seq == 3)
    assert got == {n: [1, 2, 3] for n in got}
    assert gate.high_water == 2 and gate.holding() == 0 and gate.waiting() == 0
    assert gate.waits >= 4
    # One large message at a time per socket (and one read of the next), not max_queue of them.
    frame_size = len(json.dumps({"seq": 1, "data": big(1)}))
    assert all(c.held_max <= frame_size + ALLOWANCE + READ_CHUNK for c in conns.values())
    assert MAX_QUEUE * frame_size > frame_size + ALLOWANCE + READ_CHUNK  # the bound is the gate's, not the queue's


def test_small_frames_need_no_slot():
    async def scenario():
        gate = ReceiveGate(slots=1, allowance=ALLOWANCE)
        async with Upstream(rate=None) as up:
            up.create_stream("s")
            for _ in range(200):
                up.publish("s", {"v": "y" * 100})
            async with connect(up.url_for("s"), compression=None, **connect_options(gate)) as ws:
                seqs = [json.loads(await ws.recv())["seq"] for _ in range(200)]
        return gate, seqs

    gate, seqs = asyncio.run(scenario())
    assert seqs == list(range(1, 201)) and gate.granted == 0 and gate.waits == 0


class HalfFrameServer:
    """A WebSocket server that answers the handshake, then sends the header of a
    ``size``-byte text frame and ``sent`` bytes of its payload, and nothing more: a
    socket that dies mid-frame when :meth:`abort` cuts it."""

    def __init__(self, size: int, sent: int, whole_first: int = 0) -> None:
        self.size, self.sent, self.whole_first = size, sent, whole_first
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> HalfFrameServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key"))
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        whole = struct.pack("!BBQ", 0x81, 127, self.whole_first) + b'"' + b"w" * (self.whole_first - 2) + b'"' if self.whole_first else b""
        writer.write(whole + struct.pack("!BBQ", 0x81, 127, self.size) + b"z" * self.sent)
        self.writers.append(writer)
        await writer.drain()

    def abort(self, i: int) -> None:
        self.writers[i].transport.abort()

    async def __aexit__(self, *exc_info) -> None:
        for w in self.writers:
            w.transport.abort()
        self.server.close()
        await self.server.wait_closed()


def test_a_socket_that_dies_mid_frame_gives_its_slot_to_the_next_waiter():
    async def scenario():
        gate = ReceiveGate(slots=1, allowance=ALLOWANCE)
        async with HalfFrameServer(size=8 * FRAME, sent=FRAME) as server:
            url = server.url
            first = await connect(url, max_size=16 * FRAME, close_timeout=1, **connect_options(gate))
            await until(lambda: first.has_slot, "the first socket to take the slot mid-frame")
            second = await connect(url, max_size=16 * FRAME, close_timeout=1, **connect_options(gate))
            await until(lambda: gate.waiting() == 1, "the second socket to wait")
            assert not second.has_slot and second.held_max <= ALLOWANCE + READ_CHUNK
            # Nobody calls recv on the first socket: losing the connection alone frees it.
            server.abort(0)
            await until(lambda: second.has_slot, "the slot to pass to the waiter")
            assert not first.has_slot and gate.holding() == 1 and gate.high_water == 1
            with pytest.raises(ConnectionClosed):
                await first.recv()
            # A paused socket reads no EOF: its keepalive ping, written anyway, finds the reset.
            third = await connect(url, max_size=16 * FRAME, ping_interval=0.2, **connect_options(gate))
            await until(lambda: gate.waiting() == 1, "the third socket to wait")
            server.abort(2)  # a waiter that dies leaves the queue
            await until(lambda: gate.waiting() == 0, "the dead waiter to leave the queue")
            assert second.has_slot and not third.has_slot
            return gate

    gate = asyncio.run(scenario())
    assert gate.high_water == 1


def test_a_socket_whose_large_message_was_handed_on_gives_its_slot_to_a_waiter():
    async def scenario():
        gate = ReceiveGate(slots=1, allowance=ALLOWANCE)
        # Each socket gets one whole large frame, then half of another, back to back.
        async with HalfFrameServer(size=8 * FRAME, sent=FRAME, whole_first=FRAME) as server:
            url = server.url
            first = await connect(url, max_size=16 * FRAME, **connect_options(gate))
            assert len(await first.recv()) == FRAME and first.has_slot
            second = await connect(url, max_size=16 * FRAME, **connect_options(gate))
            await until(lambda: gate.waiting() == 1, "the second socket to wait")
            # The first socket's loop asks for its next message: its turn is over.
            nxt = asyncio.create_task(first.recv())
            await until(lambda: second.has_slot, "the slot to pass to the waiter")
            await until(lambda: gate.waiting() == 1, "the first socket to queue again for its next frame")
            assert not first.has_slot and len(await second.recv()) == FRAME
            nxt.cancel()
            return gate

    gate = asyncio.run(scenario())
    assert gate.high_water == 1


def test_a_receive_loop_cancelled_mid_frame_frees_its_slot():
    async def scenario():
        gate = ReceiveGate(slots=1, allowance=ALLOWANCE)
        async with HalfFrameServer(size=8 * FRAME, sent=FRAME) as server:
            url = server.url
            holding = asyncio.Event()

            async def loop() -> None:
                async with connect(url, max_size=16 * FRAME, close_timeout=0.5, **connect_options(gate)) as ws:
                    await until(lambda: ws.has_slot, "the slot")
                    holding.set()
                    await ws.recv()  # never completes: the frame never ends

            task = asyncio.create_task(loop())
            await asyncio.wait_for(holding.wait(), DEADLINE_S)
            assert gate.holding() == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return gate

    gate = asyncio.run(scenario())
    assert gate.holding() == 0 and gate.waiting() == 0


def test_a_gate_needs_a_slot():
    with pytest.raises(ValueError):
        ReceiveGate(slots=0, allowance=ALLOWANCE)
