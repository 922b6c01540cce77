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
- The server ignores whatever clients send (but a subscribe message, below).

Kinds: query parameters on the stream URL configure what one socket must do and get, so
that an upstream in another process is configured by ``ws_url`` alone (see
:mod:`.kinds`): ``auth_header=<header>`` (a credential in that header: missing 401, wrong 403;
:meth:`Upstream.set_credentials` rotates them at run time), ``subprotocol=<name>`` (must
be offered, else 400), ``subscribe=1`` (nothing sent before
``{"op":"subscribe","stream":..,"from_seq":n}``, which overrides the URL's from_seq; a
bad one closes with 1008), ``shape=nested|flat`` (fixed per stream at its creation; a
socket asking another shape gets 400), ``replay=none`` (live frames only) and, hostile,
``ping_flood=<per second>`` (PINGs at that rate, 125-byte payloads, nothing else sent and
nothing the client sends read: each socket's ``pings_sent`` is in its record) and
``amplify=<bytes>`` (every tenth seq sent as a frame of that size made of tiny values,
``[{},{},...]``, costly to parse; ``amplify_every``, ``amplify_with=zeros``),
``firehose=<per second>`` (frames of its own, numbered on from from_seq, as fast as the
client reads them up to that rate; not the stream's, not in its books) and
``slow_handshake=<seconds>`` (the upgrade held back that long, nothing sent; each
stream's held and given-up counts: :meth:`Upstream.held_handshakes`). Refused
handshakes are counted per stream and status (:meth:`Upstream.refusals`);
:meth:`Upstream.expected_data` gives, per seq, what a worker reading the stream's shape
should store, for audits of any shape.

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

    python -m sim.upstream --port 0 --rate 2 --credential VALUE  # prints READY ws://127.0.0.1:PORT
"""

from .books import Overlap, SocketRecord, StreamTotals
from .kinds import DEFAULT, FLAT, NESTED, SHAPES, Kind
from .server import (
    MALFORMED_FRAMES,
    NO_SEQ,
    NOT_JSON,
    STATS_PATH,
    STREAM_PREFIX,
    Upstream,
    stream_name,
    stream_path,
)
from .threaded import ThreadedUpstream

__all__ = [
    "DEFAULT", "FLAT", "MALFORMED_FRAMES", "NESTED", "NO_SEQ", "NOT_JSON", "SHAPES", "STATS_PATH",
    "STREAM_PREFIX", "Kind", "Overlap", "SocketRecord", "StreamTotals", "ThreadedUpstream", "Upstream",
    "stream_name", "stream_path",
]
