"""A local WebSocket upstream: many independent numbered streams on one server.

It speaks the default upstream protocol (CONTRACT.md section 3) and keeps the books
the fleet is judged by: every socket per stream, with open and close times, and every
"overlap" (a moment with two sockets open on one stream at once).

- A stream is named by the URL path: ``/streams/<name>`` is the stream ``<name>``
  (percent-decoded); any other path ``/p/q`` is the stream ``"/p/q"``.
- A stream produces ``{"seq": n, "data": {"stream": name, "t": epoch_ms, "v": n}}``
  text frames, seq 1, 2, 3, ..., at ``rate`` frames per second from one generator
  task for all streams. ``rate=None`` switches the generator off; frames then come
  only from :meth:`Upstream.publish`, which tests use to be deterministic.
- A stream exists from the first time it is requested (or :meth:`Upstream.create_stream`)
  and from then on it produces whether or not anyone is connected, as a real source
  does: that is what makes "no message lost across a failover" checkable. Streams
  nobody asked for cost nothing. Accessors never create a stream.
- A client connecting with ``?from_seq=N`` (default 1) first receives the retained
  frames with seq >= N, then live ones, in order without gap or duplicate. With a
  ``history`` cap, a from_seq older than the oldest retained frame starts at the oldest
  retained one, a visible gap, as a source with limited retention would do.
- The server ignores whatever clients send.

Fault injection, at run time, per stream:

* :meth:`Upstream.drop` closes a stream's sockets from the server side;
* :meth:`Upstream.inject` puts a raw (malformed) text frame into a stream right after its
  current head, so every socket whose reading passes that point receives it once; given
  bytes, it sends them as they are (invalid UTF-8 in a text frame, as a broken producer may);
* :meth:`Upstream.stall` makes the stream hang (open but silent): its sockets, and any
  opened meanwhile, send nothing and read nothing (so not even a pong goes back) until
  it is switched off, when the backlog follows in order. A client that closes meanwhile
  is still booked closed when it does (the kernel is asked, as nothing is read);
* :meth:`Upstream.slow` sends the stream's frames no faster than one per ``delay_s`` (a
  slow path: the reader falls behind, then catches up when it is switched off);
* :meth:`Upstream.oversize` sends one text frame of the given size to the sockets open
  now (never replayed to later ones), as a misbehaving source might;
* :meth:`Upstream.publish_raw` produces the stream's next seq as raw bytes of the caller's
  making (a byzantine frame that still takes its seq: the books keep it as sent);
* :meth:`Upstream.skip` moves the stream's head forward without producing the seqs in
  between: they never exist, no socket is ever sent them, the books do not hold them;
* :meth:`Upstream.replay_from` makes the next socket opened on the stream start some seqs
  before or after the ``from_seq`` it asked for (its record keeps both).

Stats: ``GET /_stats`` on the same port answers JSON (answered by websockets'
``process_request`` before the WebSocket handshake), so a separate process needs
no second port. Fault injection is in-process only.

Use it in an event loop (:class:`Upstream`), from synchronous code
(:class:`ThreadedUpstream` runs its own loop in a thread), or as a process::

    python -m wsfleet.local.upstream --port 0 --rate 2     # prints READY ws://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import dataclasses
import heapq
import itertools
import json
import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar
from urllib.parse import parse_qs, quote, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ..logs import route_stdlib_logging

STREAM_PREFIX = "/streams/"
# How often a stalled stream asks the kernel whether its clients closed: the books' close
# time of such a socket is late by at most this.
STALL_POLL_S = 0.02
_TCP_PEER_CLOSED = (7, 8, 9)  # TCP_CLOSE, TCP_CLOSE_WAIT, TCP_LAST_ACK (linux/tcp_states.h)
STATS_PATH = "/_stats"
NOT_JSON = "not json"
NO_SEQ = '{"data": 1}'
MALFORMED_FRAMES = (NOT_JSON, NO_SEQ)

log = logging.getLogger(__name__)
T = TypeVar("T")


def stream_name(path: str) -> str:
    """The stream a request path names (query string ignored)."""
    path = urlsplit(path).path
    if path.startswith(STREAM_PREFIX) and len(path) > len(STREAM_PREFIX):
        return unquote(path[len(STREAM_PREFIX):])
    return unquote(path)


def stream_path(stream: str) -> str:
    """Inverse of :func:`stream_name`."""
    return stream if stream.startswith("/") else STREAM_PREFIX + quote(stream, safe="")


@dataclass
class SocketRecord:
    """One WebSocket the upstream accepted. Times are epoch seconds (wall clock)."""

    id: int
    stream: str
    peer: str
    path: str
    from_seq: int
    opened_at: float
    closed_at: float | None = None
    frames_sent: int = 0
    last_seq_sent: int = 0
    first_seq_sent: int | None = None
    injected_sent: int = 0
    oversized_sent: int = 0
    dropped: bool = False
    offset: int = 0  # replay_from: it started this many seqs after from_seq (before, if negative)


@dataclass
class Overlap:
    """A socket opened on a stream while others were open on it.

    ``socket_ids`` lists every socket open at that moment, the new one last.
    ``ended_at`` is when the stream was back to at most one open socket.
    """

    stream: str
    started_at: float
    socket_ids: tuple[int, ...]
    peers: tuple[str, ...]
    ended_at: float | None = None


@dataclass(frozen=True)
class StreamTotals:
    stream: str
    produced: int  # head seq
    oldest_retained: int  # seq of the oldest retained frame (produced + 1 when none)
    sockets_opened: int
    open_sockets: int
    max_concurrent: int
    overlaps: int
    frames_sent: int
    injected: int
    sent_head: int = 0  # the highest seq sent on a socket open now (0 when none is)


class _Stream:
    """One stream's frames and books. Touched only from the event loop."""

    def __init__(self, name: str, history: int | None) -> None:
        self.name = name
        # Seq oldest_retained + i is frames[i]; None for a seq skipped (never produced).
        self.frames: collections.deque[bytes | None] = collections.deque(maxlen=history)
        self.head = 0
        # Raw frames to send after seq ``k`` (0: before seq 1), in injection order.
        self.injected: dict[int, list[bytes]] = {}
        self.injected_total = 0
        # Replaced at every change; waiters hold the old one, which is then set.
        self.changed = asyncio.Event()
        self.sockets: list[SocketRecord] = []
        self.open: dict[int, tuple[SocketRecord, ServerConnection]] = {}
        self.max_concurrent = 0
        self.overlaps: list[Overlap] = []
        self.stalled = False
        self.slow_s = 0.0
        self.next_offset = 0  # replay_from, for the next socket opened

    @property
    def oldest_retained(self) -> int:
        return self.head - len(self.frames) + 1

    def frame(self, seq: int) -> bytes | None:
        return self.frames[seq - self.oldest_retained]

    def append(self, frame: bytes | None) -> None:
        self.frames.append(frame)
        self.notify()

    def inject(self, text: str | bytes) -> None:
        self.injected.setdefault(self.head, []).append(text if isinstance(text, bytes) else text.encode())
        self.injected_total += 1
        self.notify()

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def totals(self) -> StreamTotals:
        return StreamTotals(
            stream=self.name,
            produced=self.head,
            oldest_retained=self.oldest_retained,
            sockets_opened=len(self.sockets),
            open_sockets=len(self.open),
            max_concurrent=self.max_concurrent,
            overlaps=len(self.overlaps),
            frames_sent=sum(r.frames_sent for r in self.sockets),
            injected=self.injected_total,
            sent_head=max((r.last_seq_sent for r, _ in self.open.values()), default=0),
        )


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
        self._streams: dict[str, _Stream] = {}
        self._socket_ids = itertools.count(1)
        self._server: Server | None = None
        self._generator: asyncio.Task[None] | None = None
        # Generator schedule: (due on the monotonic clock, tie-break, stream name).
        self._due: list[tuple[float, int, str]] = []
        self._due_ids = itertools.count()
        self._first_stream = asyncio.Event()
        self._closing: set[asyncio.Task[None]] = set()

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
            # Fleets open hundreds of sockets at once; the default backlog (100)
            # drops SYNs and costs a one-second retransmit each.
            backlog=4096,
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

    def create_stream(self, stream: str) -> None:
        """Make the stream exist (and produce, if there is a rate) from now on."""
        self._stream(stream)

    def publish(self, stream: str, data: Any = None) -> int:
        """Append one frame now (``data`` defaults to the generated shape); returns its seq."""
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
        return {s.oldest_retained + i: frame for i, frame in enumerate(s.frames) if frame is not None} if s else {}

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
        s = self._streams.get(stream)
        return s.totals() if s else _Stream(stream, None).totals()

    def stats(self) -> dict[str, Any]:
        """Everything above as JSON-ready data (what ``GET /_stats`` answers)."""
        return {
            "rate": self.rate,
            "history": self.history,
            "streams": {name: dataclasses.asdict(s.totals()) for name, s in self._streams.items()},
            "overlaps": [dataclasses.asdict(o) for o in self.overlaps()],
        }

    # -- internals ---------------------------------------------------------------

    def _stream(self, name: str) -> _Stream:
        s = self._streams.get(name)
        if s is None:
            s = self._streams[name] = _Stream(name, self.history)
            if self.rate is not None:
                # All streams share one rate, so a new stream's first due time is never
                # earlier than the head of the schedule: the generator need not wake.
                heapq.heappush(self._due, (time.monotonic() + 1 / self.rate, next(self._due_ids), name))
                self._first_stream.set()
        return s

    def _produce(self, s: _Stream, data: Any = None) -> int:
        seq = s.head + 1
        if data is None:
            data = {"stream": s.name, "t": int(time.time() * 1000), "v": seq}
        frame = json.dumps({"seq": seq, "data": data}, separators=(",", ":")).encode()
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

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        if urlsplit(request.path).path == STATS_PATH:
            response = ws.respond(200, json.dumps(self.stats()) + "\n")
            response.headers["Content-Type"] = "application/json"
            return response
        try:
            _from_seq(request.path)
        except ValueError as error:
            return ws.respond(400, f"{error}\n")
        return None

    async def _serve_socket(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        s = self._stream(stream_name(ws.request.path))
        host, port = ws.remote_address[:2]
        record = SocketRecord(
            id=next(self._socket_ids),
            stream=s.name,
            peer=f"{host}:{port}",
            path=ws.request.path,
            from_seq=_from_seq(ws.request.path),
            opened_at=time.time(),
            offset=s.next_offset,
        )
        s.next_offset = 0
        self._opened(s, record, ws)
        if s.stalled:
            self._reading(ws, False)
        sender = asyncio.create_task(self._send(ws, s, record))
        try:
            # Reading also notices the close: the iteration ends (or raises, after
            # an error code or an abort) when the TCP connection is gone.
            async for _ in ws:
                pass
        except ConnectionClosed:
            pass
        finally:
            sender.cancel()
            self._closed(s, record)

    async def _send(self, ws: ServerConnection, s: _Stream, record: SocketRecord) -> None:
        last = max(0, record.from_seq - 1 + record.offset)  # the position in the stream: seq ``last`` is behind us
        extras_sent = 0  # injected frames after ``last`` already sent
        sent_at = 0.0  # when the last numbered frame went (monotonic), for slow()
        try:
            while True:
                if s.stalled:
                    # Not reading, we would not see the client close: ask the kernel.
                    if _peer_closed(ws):
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
                    sent_at = time.monotonic()
                    await ws.send(frame, text=True)
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
            pass  # the reader in _serve_socket books the close
        except Exception:
            log.exception("upstream sender failed; closing socket %d", record.id)
            await ws.close(1011, "upstream error")

    def _opened(self, s: _Stream, record: SocketRecord, ws: ServerConnection) -> None:
        s.sockets.append(record)
        s.open[record.id] = (record, ws)
        s.max_concurrent = max(s.max_concurrent, len(s.open))
        if len(s.open) > 1:
            others = [r for r, _ in s.open.values()]
            s.overlaps.append(
                Overlap(
                    stream=s.name,
                    started_at=record.opened_at,
                    socket_ids=tuple(r.id for r in others),
                    peers=tuple(r.peer for r in others),
                )
            )

    def _closed(self, s: _Stream, record: SocketRecord) -> None:
        record.closed_at = time.time()
        s.open.pop(record.id, None)
        if len(s.open) <= 1:
            for overlap in s.overlaps:
                if overlap.ended_at is None:
                    overlap.ended_at = record.closed_at


def _peer_closed(ws: ServerConnection) -> bool:
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


def _from_seq(path: str) -> int:
    values = parse_qs(urlsplit(path).query).get("from_seq")
    if not values:
        return 1
    try:
        value = int(values[-1])
    except ValueError:
        raise ValueError(f"from_seq must be a whole number, got {values[-1]!r}") from None
    if value < 1:
        raise ValueError(f"from_seq must be at least 1, got {value}")
    return value


class ThreadedUpstream:
    """An :class:`Upstream` running its own event loop in a daemon thread, for
    synchronous callers. Every method runs on that loop and returns a copy."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._upstream: Upstream | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self, timeout: float = 10.0) -> "ThreadedUpstream":
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(ready),), name="upstream", daemon=True)
        self._thread.start()
        ready.result(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        assert self._loop is not None and self._stopped is not None
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> "ThreadedUpstream":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            self._upstream = await Upstream(**self._settings).start()
        except BaseException as error:
            ready.set_exception(error)
            return
        ready.set_result(None)
        try:
            await self._stopped.wait()
        finally:
            await self._upstream.stop()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._loop is None or self._thread is None:
            raise RuntimeError("the upstream is not started")
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn(*args, **kwargs))
            except BaseException as error:
                result.set_exception(error)

        self._loop.call_soon_threadsafe(run)
        return result.result(timeout=30)

    @property
    def upstream(self) -> Upstream:
        """The wrapped upstream; touch it only from its own loop (see :meth:`_call`)."""
        assert self._upstream is not None
        return self._upstream

    @property
    def url(self) -> str:
        return self._call(lambda: self.upstream.url)

    @property
    def stats_url(self) -> str:
        return self._call(lambda: self.upstream.stats_url)

    def url_for(self, stream: str) -> str:
        return self._call(self.upstream.url_for, stream)

    def create_stream(self, stream: str) -> None:
        self._call(self.upstream.create_stream, stream)

    def publish(self, stream: str, data: Any = None) -> int:
        return self._call(self.upstream.publish, stream, data)

    def publish_raw(self, stream: str, make: Callable[[int], bytes]) -> int:
        return self._call(self.upstream.publish_raw, stream, make)

    def skip(self, stream: str, count: int) -> int:
        return self._call(self.upstream.skip, stream, count)

    def replay_from(self, stream: str, offset: int) -> None:
        self._call(self.upstream.replay_from, stream, offset)

    def inject(self, stream: str, text: str | bytes = NOT_JSON) -> None:
        self._call(self.upstream.inject, stream, text)

    def drop(self, stream: str, *, abrupt: bool = True) -> int:
        return self._call(self.upstream.drop, stream, abrupt=abrupt)

    def stall(self, stream: str, on: bool = True) -> int:
        return self._call(self.upstream.stall, stream, on)

    def slow(self, stream: str, delay_s: float = 0.0) -> None:
        self._call(self.upstream.slow, stream, delay_s)

    def oversize(self, stream: str, size: int) -> int:
        return self._call(self.upstream.oversize, stream, size)

    def streams(self) -> list[str]:
        return self._call(self.upstream.streams)

    def produced(self, stream: str) -> int:
        return self._call(self.upstream.produced, stream)

    def frames(self, stream: str) -> dict[int, bytes]:
        return self._call(self.upstream.frames, stream)

    def sockets(self, stream: str) -> list[SocketRecord]:
        return self._call(self.upstream.sockets, stream)

    def open_sockets(self, stream: str) -> list[SocketRecord]:
        return self._call(self.upstream.open_sockets, stream)

    def max_concurrent(self, stream: str) -> int:
        return self._call(self.upstream.max_concurrent, stream)

    def overlaps(self, stream: str | None = None) -> list[Overlap]:
        return self._call(self.upstream.overlaps, stream)

    def totals(self, stream: str) -> StreamTotals:
        return self._call(self.upstream.totals, stream)

    def stats(self) -> dict[str, Any]:
        return self._call(self.upstream.stats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m wsfleet.local.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--rate", type=float, default=2.0, help="frames per second per stream; 0 for none")
    parser.add_argument("--history", type=int, default=None, help="frames retained per stream [all]")
    args = parser.parse_args(argv)
    route_stdlib_logging(component="upstream")

    async def run() -> None:
        upstream = Upstream(host=args.host, port=args.port, rate=args.rate or None, history=args.history)
        await upstream.start()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        print(f"READY {upstream.url}", flush=True)
        await stop.wait()
        await upstream.stop()

    asyncio.run(run())


if __name__ == "__main__":
    main()
