"""The local upstream server: streams, kinds and fault injection in one event loop
(see the package docstring); what goes out on each socket is :mod:`.feed`'s."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import json
import time
from typing import Any, Callable, Iterable
from urllib.parse import quote, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from . import kinds
from .books import Overlap, SocketRecord, Stream, StreamTotals
from .feed import firehose, flood_pings, peer_closed, send_stream, subscribed

STREAM_PREFIX = "/streams/"
STATS_PATH = "/_stats"
NOT_JSON = "not json"
NO_SEQ = '{"data": 1}'
MALFORMED_FRAMES = (NOT_JSON, NO_SEQ)
HOLD_POLL_S = 0.1  # how often a held handshake asks whether its client is still there


def stream_name(path: str) -> str:
    """The stream a request path names (query string ignored)."""
    path = urlsplit(path).path
    if path.startswith(STREAM_PREFIX) and len(path) > len(STREAM_PREFIX):
        return unquote(path[len(STREAM_PREFIX):])
    return unquote(path)


def stream_path(stream: str) -> str:
    """Inverse of :func:`stream_name`."""
    return stream if stream.startswith("/") else STREAM_PREFIX + quote(stream, safe="")


class Upstream:
    """The upstream server in the current event loop. Not thread-safe: from another
    thread use :class:`ThreadedUpstream`."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rate: float | None = 2.0,
        history: int | None = None,
        ping_interval: float | None = 20.0,
        credentials: Iterable[str] = (),
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be positive or None, got {rate!r}")
        if history is not None and history < 1:
            raise ValueError(f"history must be at least 1 or None, got {history!r}")
        self.host = host
        self._port = port
        self.rate = rate
        self.history = history
        self._ping_interval = ping_interval
        self._streams: dict[str, Stream] = {}
        self._socket_ids = itertools.count(1)
        self._server: Server | None = None
        self._generator: asyncio.Task[None] | None = None
        # Generator schedule: (due on the monotonic clock, tie-break, stream name).
        self._due: list[tuple[float, int, str]] = []
        self._due_ids = itertools.count()
        self._first_stream = asyncio.Event()
        self._closing: set[asyncio.Task[None]] = set()
        # What an ``auth_header=`` socket's header must carry; replaced whole by set_credentials.
        self._credentials = frozenset(credentials)
        # Refused handshakes: stream -> HTTP status -> count (a refusal creates no stream).
        self._refused: dict[str, dict[int, int]] = {}
        # slow_handshake kinds: stream -> [upgrades held back, of which the client gave up first].
        self._held: dict[str, list[int]] = {}

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> "Upstream":
        self._server = await serve(
            self._serve_socket,
            self.host,
            self._port,
            compression=None,
            process_request=self._process_request,
            ping_interval=self._ping_interval,
            max_size=2**16,
            select_subprotocol=self._select_subprotocol,
            # Fleets open hundreds of sockets at once; the default backlog (100)
            # drops SYNs and costs a one-second retransmit each.
            backlog=4096,
            # No timeout of ours on a handshake: a slow_handshake kind holds its upgrade
            # back for as long as it asks; a client gives up on its own open timeout.
            open_timeout=None,
        )
        if self.rate is not None:
            self._generator = asyncio.create_task(self._generate(), name="upstream-generator")
        return self

    async def stop(self) -> None:
        """Stop generating, close every socket (code 1001) and the listening socket."""
        if self._generator is not None:
            self._generator.cancel()
            self._generator = None
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> "Upstream":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the upstream is not started")
        return next(iter(self._server.sockets)).getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def url_for(self, stream: str) -> str:
        return self.url + stream_path(stream)

    @property
    def stats_url(self) -> str:
        return f"http://{self.host}:{self.port}{STATS_PATH}"

    # -- streams -----------------------------------------------------------------

    def create_stream(self, stream: str, *, shape: str = kinds.DEFAULT) -> None:
        """Make the stream exist (and produce, if there is a rate) from now on, its frames
        in ``shape`` (see :data:`kinds.SHAPES`). Sockets asking for another shape are
        refused (HTTP 400)."""
        if shape not in kinds.SHAPES:
            raise ValueError(f"shape must be one of {', '.join(kinds.SHAPES)}, got {shape!r}")
        s = self._streams.get(stream)
        if s is not None and s.shape != shape:
            raise ValueError(f"stream {stream!r} exists with shape {s.shape!r}")
        self._stream(stream, shape)

    def set_credentials(self, credentials: Iterable[str]) -> None:
        """Accept exactly these on ``auth_header=`` sockets from now on (a rotation that revokes
        the old ones). Sockets already open stay open, as with a real source."""
        self._credentials = frozenset(credentials)

    def publish(self, stream: str, data: Any = None) -> int:
        """Append one frame now in the stream's shape (``data`` defaults to the generated
        data; a flat stream takes an object without ``u``); returns its seq."""
        return self._produce(self._stream(stream), data)

    def publish_raw(self, stream: str, make: Callable[[int], bytes]) -> int:
        """Produce the stream's next seq as the bytes ``make(seq)`` returns, sent as they
        are in a text frame (UTF-8 or not, JSON or not); returns its seq. The books keep
        it as the frame of that seq, as :meth:`publish` does."""
        s = self._stream(stream)
        seq = s.head + 1
        s.head = seq
        s.append(make(seq))
        return seq

    def skip(self, stream: str, count: int) -> int:
        """Move the stream's head ``count`` seqs forward without producing them (an
        upstream that jumps ahead); returns the new head. Those seqs never exist: no
        socket is sent them and :meth:`frames` does not hold them."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count!r}")
        s = self._stream(stream)
        for _ in range(count):
            s.head += 1
            s.append(None)
        return s.head

    def replay_from(self, stream: str, offset: int) -> None:
        """Make the next socket opened on the stream start ``offset`` seqs after the
        ``from_seq`` it asks for (before it, if negative; never before seq 1), as an
        upstream that replays from the wrong place. Its record keeps ``from_seq`` as
        asked and the ``offset``; what it was sent shows in ``first_seq_sent``."""
        self._stream(stream).next_offset = offset

    def inject(self, stream: str, text: str | bytes = NOT_JSON) -> None:
        """Insert a raw text frame right after the stream's current head, taking no seq.

        Every socket, open or future, whose reading passes that point receives it
        once, before the next numbered frame: any socket with ``from_seq <= head + 1``.
        So a client that reconnects with ``from_seq = head + 1`` receives it again.
        ``text`` given as bytes is sent as it is, UTF-8 or not. See :data:`MALFORMED_FRAMES`.
        """
        self._stream(stream).inject(text)

    def drop(self, stream: str, *, abrupt: bool = True) -> int:
        """Close the stream's open sockets from the server side; returns how many.

        ``abrupt`` aborts the TCP connection without a closing handshake (the client
        sees code 1006, as after a crash or network cut); otherwise the server closes
        cleanly with 1001 (going away), as a restarting upstream does. The records
        show the sockets closed once the loop has processed it.
        """
        s = self._streams.get(stream)
        if s is None:
            return 0
        for record, ws in list(s.open.values()):
            record.dropped = True
            if abrupt:
                ws.transport.abort()
            else:
                task = asyncio.create_task(ws.close(1001, "dropped by the upstream"))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        return len(s.open)

    def stall(self, stream: str, on: bool = True) -> int:
        """Hang the stream (``on``) or let it go on; returns how many sockets are open.
        While stalled its sockets send no frame and read nothing, so a client's pings
        go unanswered too; switched off, they read again and the backlog follows."""
        s = self._stream(stream)
        s.stalled = on
        for _, ws in s.open.values():
            self._reading(ws, not on)
        s.notify()
        return len(s.open)

    def slow(self, stream: str, delay_s: float = 0.0) -> None:
        """Send the stream's frames at most one per ``delay_s`` (0: as fast as they come)."""
        if delay_s < 0:
            raise ValueError(f"delay_s must not be negative, got {delay_s!r}")
        s = self._stream(stream)
        s.slow_s = delay_s
        s.notify()

    def oversize(self, stream: str, size: int) -> int:
        """Send one text frame of ``size`` bytes to each socket open on the stream now;
        returns how many. It takes no seq and is never replayed."""
        s = self._streams.get(stream)
        if s is None:
            return 0
        text = ("x" * size).encode()
        for record, ws in list(s.open.values()):
            record.oversized_sent += 1
            task = asyncio.create_task(self._send_quietly(ws, text))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return len(s.open)

    @staticmethod
    async def _send_quietly(ws: ServerConnection, text: bytes) -> None:
        try:
            await ws.send(text, text=True)
        except ConnectionClosed:
            pass

    @staticmethod
    def _reading(ws: ServerConnection, on: bool) -> None:
        transport = ws.transport
        if transport.is_closing():
            return
        (transport.resume_reading if on else transport.pause_reading)()

    # -- books (copies; never create a stream) -----------------------------------

    def streams(self) -> list[str]:
        return list(self._streams)

    def produced(self, stream: str) -> int:
        s = self._streams.get(stream)
        return s.head if s else 0

    def frames(self, stream: str) -> dict[int, bytes]:
        """The stream's retained numbered frames, by seq, as sent (a skipped seq has none)."""
        s = self._streams.get(stream)
        return s.retained() if s else {}

    def expected_data(self, stream: str) -> dict[int, str | None]:
        """Per retained seq, what a worker reading the stream's shape should store: the
        data part as compact JSON (a flat frame's is the whole frame), or None where the
        frame has none (a byzantine frame: a skip marker is expected)."""
        s = self._streams.get(stream)
        return {seq: kinds.stored_data(s.shape, f) for seq, f in s.retained().items()} if s else {}

    def shape(self, stream: str) -> str | None:
        s = self._streams.get(stream)
        return s.shape if s else None

    def refusals(self, stream: str) -> dict[int, int]:
        """Handshakes refused on the stream, by HTTP status (401, 403, 400)."""
        return dict(self._refused.get(stream, {}))

    def held_handshakes(self, stream: str) -> tuple[int, int]:
        """``slow_handshake`` upgrades on the stream: (held back, of which the client
        closed before the hold ended). Neither opens a socket until the upgrade is sent."""
        held, gave_up = self._held.get(stream, (0, 0))
        return held, gave_up

    def sockets(self, stream: str) -> list[SocketRecord]:
        s = self._streams.get(stream)
        return [dataclasses.replace(r) for r in s.sockets] if s else []

    def open_sockets(self, stream: str) -> list[SocketRecord]:
        s = self._streams.get(stream)
        return [dataclasses.replace(r) for r, _ in s.open.values()] if s else []

    def max_concurrent(self, stream: str) -> int:
        s = self._streams.get(stream)
        return s.max_concurrent if s else 0

    def overlaps(self, stream: str | None = None) -> list[Overlap]:
        chosen = self._streams.values() if stream is None else filter(None, [self._streams.get(stream)])
        found = [dataclasses.replace(o) for s in chosen for o in s.overlaps]
        return sorted(found, key=lambda o: o.started_at)

    def totals(self, stream: str) -> StreamTotals:
        s = self._streams.get(stream) or Stream(stream, None)
        return s.totals(sum(self._refused.get(stream, {}).values()))

    def stats(self) -> dict[str, Any]:
        """Everything above as JSON-ready data (what ``GET /_stats`` answers)."""
        return {
            "rate": self.rate,
            "history": self.history,
            "streams": {name: dataclasses.asdict(self.totals(name)) for name in self._streams},
            "refused": {name: {str(k): v for k, v in by.items()} for name, by in self._refused.items()},
            "held_handshakes": {name: {"held": h, "gave_up": g} for name, (h, g) in self._held.items()},
            "overlaps": [dataclasses.asdict(o) for o in self.overlaps()],
        }

    # -- internals ---------------------------------------------------------------

    def _stream(self, name: str, shape: str = kinds.DEFAULT) -> Stream:
        s = self._streams.get(name)
        if s is None:
            s = self._streams[name] = Stream(name, self.history, shape)
            if self.rate is not None:
                # All streams share one rate, so a new stream's first due time is never
                # earlier than the head of the schedule: the generator need not wake.
                heapq.heappush(self._due, (time.monotonic() + 1 / self.rate, next(self._due_ids), name))
                self._first_stream.set()
        return s

    def _produce(self, s: Stream, data: Any = None) -> int:
        seq = s.head + 1
        frame = kinds.render(s.shape, seq, kinds.generated_data(s.name, seq) if data is None else data)
        s.head = seq
        s.append(frame)
        return seq

    async def _generate(self) -> None:
        """Produce every stream's frames on an absolute schedule (seq n is due at
        creation + n / rate), so a late wake-up catches up instead of drifting."""
        assert self.rate is not None
        period = 1 / self.rate
        while True:
            if not self._due:
                self._first_stream.clear()
                await self._first_stream.wait()
                continue
            delay = self._due[0][0] - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                due, _, name = heapq.heappop(self._due)
                self._produce(self._streams[name])
                heapq.heappush(self._due, (due + period, next(self._due_ids), name))

    async def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        """Stats, or the handshake checks of the socket's kind (None: go on), after
        holding the upgrade back as a ``slow_handshake`` kind asks."""
        if urlsplit(request.path).path == STATS_PATH:
            response = ws.respond(200, json.dumps(self.stats()) + "\n")
            response.headers["Content-Type"] = "application/json"
            return response
        name = stream_name(request.path)
        s = self._streams.get(name)
        status, reason = kinds.check_handshake(
            request.path, request.headers, self._credentials, s.shape if s else None)
        if status == 101:
            _, kind = kinds.parse_request(request.path)
            if kind.slow_handshake and not await self._hold(ws, name, kind.slow_handshake):
                ws.transport.abort()
                return ws.respond(408, "the client gave up\n")  # written to nobody: it is gone
            return None
        by_status = self._refused.setdefault(name, {})
        by_status[status] = by_status.get(status, 0) + 1
        return ws.respond(status, reason + "\n")

    async def _hold(self, ws: ServerConnection, stream: str, seconds: float) -> bool:
        """Send nothing for ``seconds``; False if the client closed meanwhile (asked of
        the kernel, as nothing more is read during a handshake)."""
        counts = self._held.setdefault(stream, [0, 0])
        counts[0] += 1
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            if peer_closed(ws) or ws.transport.is_closing():
                counts[1] += 1
                return False
            await asyncio.sleep(min(left, HOLD_POLL_S))
        return True

    def _select_subprotocol(self, ws: ServerConnection, offered: Any) -> Subprotocol | None:
        assert ws.request is not None
        _, kind = kinds.parse_request(ws.request.path)  # checked in _process_request
        return Subprotocol(kind.subprotocol) if kind.subprotocol in offered else None

    async def _serve_socket(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        from_seq, kind = kinds.parse_request(ws.request.path)
        s = self._stream(stream_name(ws.request.path), kind.shape)
        host, port = ws.remote_address[:2]
        record = SocketRecord(
            id=next(self._socket_ids),
            stream=s.name,
            peer=f"{host}:{port}",
            path=ws.request.path,
            from_seq=from_seq,
            opened_at=time.time(),
            offset=s.next_offset,
            kind=kind,
            subprotocol=ws.subprotocol,
            live_from=s.head + 1 if kind.replay == "none" else None,
        )
        s.next_offset = 0
        s.opened(record, ws)
        if s.stalled:
            self._reading(ws, False)
        sender: asyncio.Task[None] | None = None
        try:
            if kind.subscribe and not await subscribed(ws, s, record):
                return
            if kind.ping_flood:
                sender = asyncio.create_task(flood_pings(ws, record, kind.ping_flood))
            elif kind.firehose:
                sender = asyncio.create_task(firehose(ws, s, record, kind.firehose))
            else:
                sender = asyncio.create_task(send_stream(ws, s, record))
            # Reading also notices the close: the iteration ends (or raises, after
            # an error code or an abort) when the TCP connection is gone. Whatever
            # else the client sends is ignored.
            async for _ in ws:
                pass
        except ConnectionClosed:
            pass
        finally:
            if sender is not None:
                sender.cancel()
            s.closed(record, time.time())
