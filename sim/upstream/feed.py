"""What the local upstream sends on one socket: the subscribe handshake of a ``subscribe=1``
kind, then the stream's frames from the socket's position (retained ones, then live ones),
with the stream's faults (stall, slow, injected frames) applied as it goes; or, for a
``ping_flood`` socket, nothing but PINGs; for a ``firehose`` one, its own frames as fast
as the client reads them. Per socket, no state of the server's own:
:class:`~.server.Upstream` runs one of these per socket."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from . import kinds
from .books import SocketRecord, Stream
from .kinds import BadRequest

# How often a stalled stream asks the kernel whether its clients closed: the books' close
# time of such a socket is late by at most this.
STALL_POLL_S = 0.02
# A ping_flood socket: PINGs go out in batches this often, each with the largest payload
# a control frame carries (RFC 6455 5.5), and no more than this many bytes wait unsent on
# our side (what the client's kernel does not take is its problem, not ours to buffer).
FLOOD_TICK_S = 0.01
FLOOD_PAYLOAD = 125
FLOOD_UNSENT_BYTES = 256 * 1024
_TCP_PEER_CLOSED = (7, 8, 9)  # TCP_CLOSE, TCP_CLOSE_WAIT, TCP_LAST_ACK (linux/tcp_states.h)

log = logging.getLogger(__name__)


async def subscribed(ws: ServerConnection, s: Stream, record: SocketRecord) -> bool:
    """Wait for the socket's subscribe message and take its from_seq; a bad one
    closes the socket (1008, the reason in a sentence) and answers False."""
    message = await ws.recv()
    try:
        record.subscribed_from = record.from_seq = kinds.parse_subscribe(message, s.name)
    except BadRequest as error:
        record.subscribe_error = str(error)
        await ws.close(1008, kinds.close_reason(str(error)))
        return False
    return True


async def send_stream(ws: ServerConnection, s: Stream, record: SocketRecord) -> None:
    # The position in the stream: seq ``last`` is behind us. A live-only socket
    # starts at the head it opened at, past what was injected there before.
    start = record.from_seq if record.live_from is None else record.live_from
    last = max(0, start - 1 + record.offset)
    extras_sent = len(s.injected.get(last, ())) if record.live_from is not None else 0
    # ``format=binary`` in the URL: the stream's frames go as binary frames (their bytes
    # unchanged), for a worker reading a binary feed.
    as_text = "binary" not in parse_qs(urlsplit(record.path).query).get("format", [])
    sent_at = 0.0  # when the last numbered frame went (monotonic), for slow()
    try:
        while True:
            if s.stalled:
                # Not reading, we would not see the client close: ask the kernel.
                if peer_closed(ws):
                    ws.transport.abort()  # the reader sees it now and books the close
                    return
                try:
                    await asyncio.wait_for(s.changed.wait(), STALL_POLL_S)
                except TimeoutError:
                    pass
                continue
            extras = s.injected.get(last, ())
            if extras_sent < len(extras):
                await ws.send(extras[extras_sent], text=True)
                extras_sent += 1
                record.injected_sent += 1
            elif last < s.head:
                if s.slow_s > 0 and time.monotonic() < sent_at + s.slow_s:
                    # Not yet: wake at the due time, or sooner if the setting changes.
                    try:
                        await asyncio.wait_for(s.changed.wait(), sent_at + s.slow_s - time.monotonic())
                    except TimeoutError:
                        pass
                    continue
                seq = max(last + 1, s.oldest_retained)
                frame = s.frame(seq)
                if frame is None:  # skipped: never produced, nothing to send
                    last, extras_sent = seq, 0
                    continue
                if record.kind.amplifies(seq):
                    kind = record.kind
                    frame = kinds.amplified(s.shape, seq, kind.amplify, kind.amplify_with)
                    record.amplified_sent += 1
                sent_at = time.monotonic()
                await ws.send(frame, text=as_text)
                last, extras_sent = seq, 0
                record.frames_sent += 1
                record.last_seq_sent = seq
                if record.first_seq_sent is None:
                    record.first_seq_sent = seq
            else:
                # No await between the checks above and taking this event, so
                # no change can slip in unnoticed.
                await s.changed.wait()
    except ConnectionClosed:
        pass  # the reader in Upstream._serve_socket books the close
    except Exception:
        log.exception("upstream sender failed; closing socket %d", record.id)
        await ws.close(1011, "upstream error")


async def flood_pings(ws: ServerConnection, record: SocketRecord, rate: float) -> None:
    """A hostile peer: PINGs at ``rate`` a second and not one byte read of what the
    client sends, so its pongs pile up on its side until it stops reading us. The frames
    go straight to the transport in batches (websockets' ``ping`` would keep a waiter per
    ping, and cost a task switch each); whole frames only, and this socket is sent no
    data frame, so none is split. A closed client is seen by asking the kernel."""
    ws.transport.pause_reading()
    ping = Frame(Opcode.PING, b"p" * FLOOD_PAYLOAD).serialize(mask=False)
    owed, last = 0.0, time.monotonic()
    while not ws.transport.is_closing() and not peer_closed(ws):
        now = time.monotonic()
        # Owed pings, a tick or so at most: a late wake-up sends a burst, not a backlog.
        owed, last = min(owed + (now - last) * rate, max(1.0, 2 * rate * FLOOD_TICK_S)), now
        if owed >= 1 and ws.transport.get_write_buffer_size() < FLOOD_UNSENT_BYTES:
            ws.transport.write(ping * int(owed))
            record.pings_sent += int(owed)
            owed -= int(owed)
        await asyncio.sleep(FLOOD_TICK_S)
    ws.transport.abort()  # the reader in Upstream._serve_socket books the close


async def firehose(ws: ServerConnection, s: Stream, record: SocketRecord, rate: float) -> None:
    """A peer faster than the store: frames numbered on from the socket's from_seq, up to
    ``rate`` a second, as long as its client reads them (no more than
    FLOOD_UNSENT_BYTES wait unsent on our side: a client that pauses reading pauses us).
    Written whole to the transport in batches, as :func:`flood_pings` does, so that one
    thread's upstream keeps up with its other streams; this socket is sent nothing else
    but websockets' keepalive pings, which never split a frame written whole."""
    seq = record.from_seq
    owed, last = 0.0, time.monotonic()
    # Past OPEN, nothing more: a frame after our close frame would break the closing handshake.
    while ws.state is State.OPEN and not ws.transport.is_closing():
        now = time.monotonic()
        owed, last = min(owed + (now - last) * rate, max(1.0, 2 * rate * FLOOD_TICK_S)), now
        if owed >= 1 and ws.transport.get_write_buffer_size() < FLOOD_UNSENT_BYTES:
            batch = int(owed)
            ws.transport.write(b"".join(
                Frame(Opcode.TEXT, kinds.firehose_frame(s.shape, s.name, n)).serialize(mask=False)
                for n in range(seq, seq + batch)
            ))
            record.frames_sent += batch
            if record.first_seq_sent is None:
                record.first_seq_sent = seq
            seq += batch
            record.last_seq_sent = seq - 1
            owed -= batch
        await asyncio.sleep(FLOOD_TICK_S)


def peer_closed(ws: ServerConnection) -> bool:
    """The client has closed its end (its FIN or RST reached our kernel), whether or not
    we have read that far (Linux TCP_INFO; False where it cannot be asked)."""
    sock = ws.transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return True
    return state in _TCP_PEER_CLOSED


