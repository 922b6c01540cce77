"""Upstream kinds: what a socket's URL asks of the local upstream, and the shapes of its
frames. No I/O, so the server, its tests and the audits share one reading of it.

A kind is configured by query parameters on the stream URL (the stream name still comes
from the path), so an upstream in another process is configured by ``ws_url`` alone:

* ``auth_header=<header-name>``: the handshake must carry that header with one of the accepted
  credentials (missing: HTTP 401, wrong: HTTP 403);
* ``subprotocol=<name>``: the client must offer it (the server selects it), else HTTP 400;
* ``subscribe=1``: nothing is sent until the client sends
  ``{"op":"subscribe","stream":"<name>","from_seq":<int >= 1>}``, whose from_seq overrides
  the URL's; a bad one closes the socket with 1008 and a reason;
* ``shape=nested`` / ``shape=flat`` (default ``shape=default``): see :data:`SHAPES`;
* ``replay=none`` (default ``replay=all``): the socket gets only frames produced after it
  opened, whatever from_seq it asked for;
* ``ping_flood=<per second>``: hostile: the socket is sent PINGs at that rate, each with
  the largest payload a control frame carries (125 bytes), and no frame of the stream;
  nothing the client sends is ever read, so its answers pile up on its side.
* ``amplify=<bytes>`` (hostile: an amplification peer): in place of each seq that is a
  multiple of ``amplify_every`` (default 10), the socket sends a frame of about that many
  bytes whose data is a list of tiny values (``amplify_with=objects``, the default:
  ``[{},{},...]``, about 24 times its size as Python objects; ``zeros``: ``[0,0,...]``,
  about 4 times), cheap to send, costly to parse. A socket resuming there gets it again,
  as a hostile source would send it; the stream's books keep the ordinary frame.
* ``firehose=<frames per second>`` (hostile: a peer faster than the store): in place of
  the stream, the socket is sent frames numbered on from its from_seq as fast as its
  client takes them, up to that rate (:func:`firehose_frame`: the same bytes for a seq
  every time, so a reconnect resumes as with any source); they are not the stream's and
  its books do not keep them (the socket's record counts them). A client that stops
  reading stops them: no more than a few hundred KiB wait unsent on our side.
* ``slow_handshake=<seconds>`` (hostile: a slow handshake): the TCP connection is
  accepted and the upgrade request read, then nothing at all is sent for that long
  (the upgrade held back), then the handshake goes on as usual if the client is still
  there. A client whose open timeout is shorter gives up first.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Collection
from urllib.parse import parse_qs, urlsplit

DEFAULT = "default"  # {"seq": n, "data": <data>}
NESTED = "nested"  # {"type": "update", "meta": {"sequence": n}, "payload": <data>}
FLAT = "flat"  # {"u": n, "stream": .., "t": .., "v": n}: the whole frame is the data
# Shape -> (seq pointer, data pointer) an `upstream` object names to read it.
SHAPES = {DEFAULT: ("/seq", "/data"), NESTED: ("/meta/sequence", "/payload"), FLAT: ("/u", "")}
REPLAYS = ("all", "none")
KIND_PARAMS = (
    "auth_header", "subprotocol", "subscribe", "shape", "replay", "ping_flood", "amplify", "amplify_every", "amplify_with",
    "firehose", "slow_handshake",
)
MAX_PING_FLOOD = 1_000_000.0  # pings a second: more than any socket carries
AMPLIFY_EVERY = 10
AMPLIFY_WITH = {"objects": b"{}", "zeros": b"0"}  # amplify_with -> the list's item
MAX_AMPLIFY = 1 << 30  # bytes: a bound on what one URL makes the upstream build
MAX_FIREHOSE = 100_000.0  # frames a second
MAX_SLOW_HANDSHAKE_S = 86_400.0

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110: header names, subprotocols
MAX_CLOSE_REASON = 120  # bytes; a close frame's reason must fit in 123
# As the worker stores data: compact, UTF-8, and NaN/Infinity are not JSON (a skip marker).
# A lone surrogate cannot be UTF-8: such data is stored with every non-ASCII character escaped.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class BadRequest(ValueError):
    """A URL or subscribe message the upstream refuses; the message is a sentence."""


@dataclass(frozen=True)
class Kind:
    """What one socket's URL asked for (the default protocol when nothing)."""

    auth: str | None = None  # the header that must carry a credential
    subprotocol: str | None = None  # the subprotocol the client must offer
    subscribe: bool = False  # wait for a subscribe message before sending
    shape: str = DEFAULT
    replay: str = "all"  # "none": live frames only
    ping_flood: float | None = None  # hostile: PINGs a second, nothing else sent, nothing read
    amplify: int = 0  # bytes of an amplification frame (0: none)
    amplify_every: int = AMPLIFY_EVERY  # it replaces each seq that is a multiple of this
    amplify_with: str = "objects"  # what its data's list holds (AMPLIFY_WITH)
    firehose: float | None = None  # hostile: frames a second at most, as fast as the client reads
    slow_handshake: float = 0.0  # hostile: seconds the upgrade is held back

    def amplifies(self, seq: int) -> bool:
        """Whether this socket sends seq ``seq`` as an amplification frame."""
        return self.amplify > 0 and seq % self.amplify_every == 0

    @property
    def text(self) -> str:
        """Short and readable, for books and reports (``default`` for the default)."""
        parts = [f"auth_header={self.auth}"] if self.auth else []
        parts += [f"subprotocol={self.subprotocol}"] if self.subprotocol else []
        parts += ["subscribe"] if self.subscribe else []
        parts += [f"shape={self.shape}"] if self.shape != DEFAULT else []
        parts += ["replay=none"] if self.replay == "none" else []
        parts += [f"ping_flood={self.ping_flood:g}"] if self.ping_flood else []
        parts += [f"amplify={self.amplify}"] if self.amplify else []
        parts += [f"amplify_every={self.amplify_every}"] if self.amplify and self.amplify_every != AMPLIFY_EVERY else []
        parts += [f"amplify_with={self.amplify_with}"] if self.amplify and self.amplify_with != "objects" else []
        parts += [f"firehose={self.firehose:g}"] if self.firehose else []
        parts += [f"slow_handshake={self.slow_handshake:g}"] if self.slow_handshake else []
        return "&".join(parts) or DEFAULT


def _last(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def parse_request(path: str) -> tuple[int, Kind]:
    """The from_seq (1 when absent) and the kind a request path asks for; raises
    :class:`BadRequest` (an HTTP 400) for a value the upstream does not know."""
    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
    raw = _last(query, "from_seq")
    from_seq = 1 if raw is None else _whole(raw, "from_seq")
    auth = _last(query, "auth_header")
    if auth is not None and not _TOKEN.fullmatch(auth):
        raise BadRequest(f"auth must name a header (an RFC 9110 token), got {auth!r}")
    subprotocol = _last(query, "subprotocol")
    if subprotocol is not None and not _TOKEN.fullmatch(subprotocol):
        raise BadRequest(f"subprotocol must be an RFC 9110 token, got {subprotocol!r}")
    subscribe = _last(query, "subscribe") or "0"
    if subscribe not in ("0", "1"):
        raise BadRequest(f"subscribe must be 0 or 1, got {subscribe!r}")
    shape = _last(query, "shape") or DEFAULT
    if shape not in SHAPES:
        raise BadRequest(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    replay = _last(query, "replay") or "all"
    if replay not in REPLAYS:
        raise BadRequest(f"replay must be one of {', '.join(REPLAYS)}, got {replay!r}")
    raw = _last(query, "amplify")
    amplify = 0 if raw is None else _whole(raw, "amplify")
    if amplify > MAX_AMPLIFY:
        raise BadRequest(f"amplify must be at most {MAX_AMPLIFY}, got {amplify}")
    raw = _last(query, "amplify_every")
    every = AMPLIFY_EVERY if raw is None else _whole(raw, "amplify_every")
    amplify_with = _last(query, "amplify_with") or "objects"
    if amplify_with not in AMPLIFY_WITH:
        raise BadRequest(f"amplify_with must be one of {', '.join(AMPLIFY_WITH)}, got {amplify_with!r}")
    flood = _last(query, "ping_flood")
    firehose = _last(query, "firehose")
    slow = _last(query, "slow_handshake")
    return from_seq, Kind(
        auth, subprotocol, subscribe == "1", shape, replay,
        None if flood is None else _rate(flood, "ping_flood", "pings a second", MAX_PING_FLOOD),
        amplify, every, amplify_with,
        None if firehose is None else _rate(firehose, "firehose", "frames a second", MAX_FIREHOSE),
        0.0 if slow is None else _rate(slow, "slow_handshake", "seconds", MAX_SLOW_HANDSHAKE_S),
    )


def _rate(raw: str, name: str, unit: str, most: float) -> float:
    try:
        rate = float(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a number of {unit}, got {raw!r}") from None
    if not 0 < rate <= most:  # NaN fails this too
        raise BadRequest(f"{name} must be above 0 and at most {most:g}, got {raw!r}")
    return rate


def check_handshake(path: str, headers: Any, credentials: Collection[str], shape: str | None) -> tuple[int, str]:
    """The answer to a handshake on a stream whose frames are in ``shape`` (None: a new
    stream): 101 to go on, else the HTTP status and a sentence (never a credential).
    ``headers`` is websockets' ``Headers`` (``get_all`` is case-insensitive)."""
    try:
        _, kind = parse_request(path)
    except BadRequest as error:
        return 400, str(error)
    if shape is not None and shape != kind.shape:
        return 400, f"this stream has shape {shape}, not {kind.shape}"
    if kind.auth is not None:
        values = headers.get_all(kind.auth)
        if not values:
            return 401, f"the {kind.auth} header is required"
        if not any(v in credentials for v in values):
            return 403, f"the {kind.auth} header does not carry an accepted credential"
    if kind.subprotocol is not None and kind.subprotocol not in offered_subprotocols(headers):
        return 400, f"the subprotocol {kind.subprotocol} must be offered"
    return 101, ""


def offered_subprotocols(headers: Any) -> list[str]:
    """The subprotocols a handshake offers, in its order."""
    return [p.strip() for value in headers.get_all("Sec-WebSocket-Protocol") for p in value.split(",")]


def _whole(raw: Any, name: str) -> int:
    if type(raw) is int:
        value = raw
    else:
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise BadRequest(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise BadRequest(f"{name} must be at least 1, got {value}")
    return value


def parse_subscribe(message: str | bytes, stream: str) -> int:
    """The from_seq of a subscribe message for ``stream``; raises :class:`BadRequest`
    (the socket is then closed with 1008) for anything else."""
    if isinstance(message, bytes):
        raise BadRequest("the subscribe message must be a text frame")
    try:
        obj = json.loads(message)
    except (ValueError, RecursionError):
        raise BadRequest("the subscribe message is not JSON") from None
    if not isinstance(obj, dict) or obj.get("op") != "subscribe":
        raise BadRequest('the first message must be {"op":"subscribe",...}')
    if obj.get("stream") != stream:
        raise BadRequest("the subscribe message names another stream")
    if "from_seq" not in obj:
        raise BadRequest("the subscribe message has no from_seq")
    if type(obj["from_seq"]) is not int:  # 1.0, "1" and true are not whole numbers here
        raise BadRequest("from_seq must be a whole number")
    return _whole(obj["from_seq"], "from_seq")


def close_reason(text: str) -> str:
    """``text`` cut to what a close frame carries."""
    data = text.encode()
    return text if len(data) <= MAX_CLOSE_REASON else data[:MAX_CLOSE_REASON].decode(errors="ignore")


def generated_data(stream: str, seq: int) -> dict[str, Any]:
    """The data of a generated frame: which stream, when, and a value."""
    return {"stream": stream, "t": int(time.time() * 1000), "v": seq}


def render(shape: str, seq: int, data: Any) -> bytes:
    """The text frame carrying ``seq`` and ``data`` in ``shape``. A flat frame is the
    data itself with the seq beside it, so its data must be an object without ``u``."""
    if shape == NESTED:
        frame: Any = {"type": "update", "meta": {"sequence": seq}, "payload": data}
    elif shape == FLAT:
        if not isinstance(data, dict) or "u" in data:
            raise ValueError("flat frames take an object without a 'u' member as data")
        frame = {"u": seq, **data}
    else:
        frame = {"seq": seq, "data": data}
    return _COMPACT.encode(frame).encode()


def amplified(shape: str, seq: int, size: int, amplify_with: str = "objects") -> bytes:
    """The amplification frame carrying ``seq`` in ``shape``: about ``size`` bytes (at
    least the frame around one item), its data a list of ``amplify_with`` items."""
    frame = render(shape, seq, {"v": []} if shape == FLAT else [])
    at = frame.rindex(b"[]") + 1  # the empty list is the data (a flat frame's: its "v")
    item = AMPLIFY_WITH[amplify_with]
    return frame[:at] + _items(item, max(1, (size - len(frame)) // (len(item) + 1))) + frame[at:]


def firehose_data(stream: str, seq: int) -> dict[str, Any]:
    """The data of a ``firehose`` kind's seq: the same every time it is sent."""
    return {"stream": stream, "v": seq, "firehose": True}


def firehose_frame(shape: str, stream: str, seq: int) -> bytes:
    """The frame a ``firehose`` socket sends as ``seq``, in ``shape``."""
    return render(shape, seq, firehose_data(stream, seq))


@functools.lru_cache(maxsize=4)
def _items(item: bytes, count: int) -> bytes:
    """``count`` items, comma-separated: built once per size, each frame only joins it."""
    return item + (b"," + item) * (count - 1)


def stored_data(shape: str, frame: bytes) -> str | None:
    """What a worker reading ``shape`` should store for ``frame``: its data part as
    compact JSON, or None for a frame that does not have one (a byzantine frame: a skip
    marker is expected). Read here without the worker's code, for independent audits."""
    try:
        obj = json.loads(frame)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if shape == FLAT:
        data = obj
    elif shape == NESTED:
        if "payload" not in obj:
            return None
        data = obj["payload"]
    else:
        if "data" not in obj:
            return None
        data = obj["data"]
    try:
        text = _COMPACT.encode(data)
    except ValueError:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _COMPACT_ASCII.encode(data)
    return text
