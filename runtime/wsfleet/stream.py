"""The upstream stream, as pure decisions: parse frames, drop replays, track the
checkpoint, build the resume URL. No I/O.

The frame rules (CONTRACT.md section 3): a frame never fails a connection. Whatever an
upstream sends, :func:`parse_frame` returns either a :class:`Frame` to store or a
:class:`Rejected` to count, and never raises. A frame whose seq can be read but whose data
cannot be stored becomes a skip marker at that seq (a :class:`Frame` with no data), so the
stored messages stay gap-free and no owner ever stops at it; a frame with no usable seq
is only counted. :class:`Problem` names each class; docs/design.md's table says what happens
to each.

No silent holes: every seq up to the checkpoint is stored, as data or as a marker. Seqs the
upstream jumps over become one ``upstream_gap`` marker (a range, :func:`upstream_gap`);
a frame over the socket's limit, sent again at every resume, becomes an
``over_frame_limit`` marker after a bounded number of closes (:meth:`SeqTracker.closed_over_limit`).
"""

from __future__ import annotations

import base64
import enum
import json
import re
from dataclasses import dataclass, field, replace
from typing import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import schema
from .checkpoint import Checkpoint
from .pointer import MISSING, Pointer, ignored

# Data up to this size (compact JSON, UTF-8) is stored inline in its item, well inside
# DynamoDB's 400 KB item limit; larger data goes to an S3 object (wsfleet.sinks.objects).
MAX_MESSAGE_BYTES = 350_000
MAX_SEQ = 2**63 - 1  # a seq is a non-negative integer below 2^63
# The seq of a frame parsed for an assigned-seq feed: SeqTracker.numbered gives its own.
UNNUMBERED = -1
# Deepest nesting of arrays and objects a frame may have (the frame's own object is 1).
# Deeper data is skipped: it bounds parsing, and what is stored stays readable by
# consumers whose parsers limit depth (serde_json: 128; .NET's default is 64).
MAX_DEPTH = 128
# How far into a frame that json cannot read (too deep, an integer too long) a scan
# looks for its top-level seq: a bound on the time such a frame can cost.
SEQ_SCAN_CHARS = 1 << 16
# Closes for a frame over the socket's limit, at one resume point with no frame accepted
# in between, before the seq there is given up as an over_frame_limit marker. More than
# one, so that a frame the upstream sent once (not as that seq, never again) costs a
# reconnect, not a seq.
OVER_LIMIT_TRIES = 3


class Problem(enum.Enum):
    """Why a frame is not stored exactly as sent. Counted (``MalformedFrames``) and logged."""

    # No usable seq: counted and skipped, nothing stored.
    NOT_JSON = "not_json"  # not JSON text: garbage, truncated, trailing data
    NOT_AN_OBJECT = "not_an_object"  # JSON, but an array, a string, a number...
    BAD_SEQ = "bad_seq"  # no seq where the seq pointer leads, or not an integer in 0..2^63-1 (bool, float, 10^40)
    # A seq and data that cannot be stored: a skip marker at the seq (no seq found: as above).
    NO_DATA = "no_data"  # the data pointer leads nowhere: nothing to store, nothing invented
    INVALID_UTF8 = "invalid_utf8"  # bytes that are not UTF-8 (read with U+FFFD to find the seq)
    TOO_DEEP = "too_deep"  # nested deeper than MAX_DEPTH
    NUMBER_TOO_LONG = "number_too_long"  # an integer of more than 4,300 digits (Python refuses it)
    NOT_FINITE = "not_finite"  # NaN, Infinity (not JSON) or a number beyond a double (1e400)
    TOO_LARGE = "too_large"  # data over MAX_FRAME_BYTES as compact JSON (the writer makes the marker)
    # Parsing it would cost more memory or time than the worker's decoder allows (made by
    # wsfleet.worker.decoder): a skip marker at the seq a scan finds, as too_deep.
    OVER_DECODE_BUDGET = "over_decode_budget"
    STORE_REFUSED = "store_refused"  # the table refused the item (the writer makes the marker)
    # Matched one of the upstream's ignore rules (a heartbeat, an ack): dropped, not stored,
    # not malformed, no marker; counted in IgnoredFrames.
    IGNORED = "ignored"
    # Not a frame's content: seqs the stream went past (markers made by SeqTracker and the
    # worker, not by the parser; counted in SkippedFrames, not MalformedFrames).
    UPSTREAM_GAP = "upstream_gap"  # a frame's seq jumped ahead: one marker for the seqs in between
    OVER_FRAME_LIMIT = "over_frame_limit"  # closed the socket (1009) at the same resume point, again and again
    RECONNECT = "reconnect"  # an assigned-seq feed (re)connected: what it sent meanwhile may be missed
    # Stored, but not byte for byte.
    LONE_SURROGATE = "lone_surrogate"  # half a UTF-16 pair (a cut emoji): stored as a \\uXXXX escape


@dataclass(frozen=True)
class Frame:
    """One seq to store: its data as compact JSON, or, when ``data_json`` is None, a
    skip marker (CONTRACT.md section 4)."""

    seq: int
    data_json: str | None
    received_at_ms: int
    problem: Problem | None = None  # why it is not stored as sent
    # The data's size as compact JSON in UTF-8 (what is stored); a marker's: how large
    # the data it skips is, where known.
    data_bytes: int | None = None
    skip_to: int | None = None  # an upstream_gap marker's last seq: it stands for seq..skip_to
    binary: bool = False  # data_json is the frame's bytes in base64, as a JSON string (format binary)

    @property
    def is_marker(self) -> bool:
        return self.data_json is None

    @property
    def end(self) -> int:
        """The last seq this item stands for: its own, or a range marker's ``skip_to``."""
        return self.seq if self.skip_to is None else self.skip_to

    @property
    def reason(self) -> str:
        """A marker's ``skipped`` reason (schema.SKIPPED_*): a gap is ``upstream_gap``, a
        frame over MAX_FRAME_BYTES (on the socket, once re-encoded, or in what parsing it
        would cost) ``over_frame_limit``, every other parser class, and the store's
        refusal, ``malformed``."""
        return _REASONS.get(self.problem, schema.SKIPPED_MALFORMED)

    def as_marker(self, problem: Problem) -> Frame:
        """The skip marker that stands in for this frame."""
        size = self.data_bytes
        if size is None and self.data_json is not None:  # a frame built by hand: a parsed one knows its size
            size = len(self.data_json.encode("utf-8", "replace"))
        return replace(self, data_json=None, problem=problem, data_bytes=size)


_REASONS = {
    Problem.UPSTREAM_GAP: schema.SKIPPED_UPSTREAM_GAP,
    Problem.OVER_FRAME_LIMIT: schema.SKIPPED_OVER_FRAME_LIMIT,
    Problem.TOO_LARGE: schema.SKIPPED_OVER_FRAME_LIMIT,  # over the limit once re-encoded
    Problem.OVER_DECODE_BUDGET: schema.SKIPPED_OVER_FRAME_LIMIT,  # too large in effect: to parse
    Problem.RECONNECT: schema.SKIPPED_RECONNECT,
}


def upstream_gap(first: int, last: int, received_at_ms: int) -> Frame:
    """The one marker for seqs ``first..last`` that the upstream went past: a jump of
    10^18 seqs costs one item, like a jump of one."""
    if not first <= last:
        raise ValueError(f"an empty gap: {first}..{last}")
    return Frame(first, None, received_at_ms, Problem.UPSTREAM_GAP, skip_to=last)


@dataclass(frozen=True)
class Rejected:
    """A frame with no usable seq: nothing is stored."""

    problem: Problem
    size: int  # bytes (or characters, for text given as str)


@dataclass(frozen=True)
class FrameShape:
    """Where a connection's frames keep their seq and their data (its upstream's
    ``seq_pointer`` and ``data_pointer``); the default is ``{"seq", "data"}``. A pointer
    of one token into an object is read with a dict lookup (the default's fast path).
    ``format`` (json, text, binary) and ``assigned``: its upstream's ``format`` and
    ``seq: assigned`` (then frames are parsed UNNUMBERED and the seq pointer is unused)."""

    seq: Pointer = Pointer.parse("/seq")
    data: Pointer = Pointer.parse("/data")
    format: str = "json"
    assigned: bool = False
    # The upstream's ignore rules: (pointer, the value as canonical JSON); a JSON frame
    # where any pointer leads to its value is dropped (Problem.IGNORED).
    ignore: tuple[tuple[Pointer, str], ...] = ()
    seq_key: str | None = field(init=False, repr=False, compare=False)
    data_key: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seq.is_whole:
            raise ValueError("a seq pointer must point into the frame")
        object.__setattr__(self, "seq_key", self.seq.tokens[0] if len(self.seq.tokens) == 1 else None)
        object.__setattr__(self, "data_key", self.data.tokens[0] if len(self.data.tokens) == 1 else None)


DEFAULT_SHAPE = FrameShape()


def parse_frame(message: str | bytes, received_at_ms: int, shape: FrameShape = DEFAULT_SHAPE) -> Frame | Rejected:
    """Read an upstream frame (by default ``{"seq": <int>, "data": <any JSON>}``; else
    its seq and data where ``shape`` points): a :class:`Frame` (its data as compact JSON,
    or a skip marker), or :class:`Rejected`. Never raises.

    The worker reads every frame as bytes (text frames are not decoded by the socket, so
    invalid UTF-8 cannot fail the connection); a binary frame is read the same way.
    An assigned-seq feed's frame is never rejected (:func:`_unnumbered`)."""
    if shape.assigned:
        return _unnumbered(message, received_at_ms, shape)
    problem: Problem | None = None
    if isinstance(message, str):
        text = message
    else:
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            text = message.decode("utf-8", "replace")
            problem = Problem.INVALID_UTF8
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return Rejected(problem or Problem.NOT_JSON, len(message))
    except RecursionError:  # deeper than the interpreter's stack allows (about 1,000)
        return _by_scan(text, problem or Problem.TOO_DEEP, received_at_ms, len(message), shape)
    except ValueError:  # JSON beyond what Python takes: an integer over 4,300 digits
        return _by_scan(text, problem or Problem.NUMBER_TOO_LONG, received_at_ms, len(message), shape)
    # Fewer brackets than MAX_DEPTH, in strings or not, cannot nest deeper. Counted now, so
    # that the text is freed before the data is re-encoded: for a large frame (parsed in the
    # decoder's child, whose memory is capped) that is one copy of the frame less at the peak.
    brackets = text.count("[") + text.count("{")
    del text
    if shape.ignore and ignored(obj, shape.ignore):
        return Rejected(Problem.IGNORED, len(message))
    is_object = type(obj) is dict
    seq = obj.get(shape.seq_key) if is_object and shape.seq_key is not None else shape.seq.resolve(obj)
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:  # bool is a subclass of int: excluded
        return Rejected(problem or (Problem.BAD_SEQ if is_object else Problem.NOT_AN_OBJECT), len(message))
    if problem is None and brackets > MAX_DEPTH and _deeper_than(obj, MAX_DEPTH):
        problem = Problem.TOO_DEEP
    if problem is not None:
        return Frame(seq, None, received_at_ms, problem)
    if is_object and shape.data_key is not None:
        data = obj.get(shape.data_key, MISSING)
    else:
        data = shape.data.resolve(obj)
    if data is MISSING:
        return Frame(seq, None, received_at_ms, Problem.NO_DATA)
    return _stored(seq, data, received_at_ms)


# Built once: json.dumps with arguments builds an encoder per call (4 us of the 9 a frame took).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _stored(seq: int, data: object, received_at_ms: int) -> Frame:
    try:
        data_json = _COMPACT.encode(data)
    except ValueError:  # NaN or Infinity (as literals, or 1e400 read as inf): not JSON
        return Frame(seq, None, received_at_ms, Problem.NOT_FINITE)
    problem = None
    try:
        # ASCII (most data) is its own UTF-8: sized without a copy, which for data at
        # the frame limit would be 32 MiB more while the frame is parsed.
        size = len(data_json) if data_json.isascii() else len(data_json.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate cannot be UTF-8 (nor a DynamoDB string): every non-ASCII
        # character escaped instead, the same JSON value, nothing lost.
        data_json = _COMPACT_ASCII.encode(data)
        size = len(data_json)
        problem = Problem.LONE_SURROGATE
    return Frame(seq, data_json, received_at_ms, problem, data_bytes=size)


def _unnumbered(message: str | bytes, received_at_ms: int, shape: FrameShape) -> Frame | Rejected:
    """A frame of an assigned-seq feed, UNNUMBERED: every frame received gets a seq, so
    one that cannot be stored is a ``malformed`` marker (its size kept), never dropped.
    binary: the bytes as they are, in base64; text: the frame as UTF-8 text (invalid
    UTF-8 is no text: a marker, never stored altered); json: the data where the data
    pointer says (the whole frame by default)."""
    raw = message.encode("utf-8", "surrogatepass") if isinstance(message, str) else message
    if shape.format == "binary":
        data_json = '"' + base64.b64encode(raw).decode("ascii") + '"'
        return Frame(UNNUMBERED, data_json, received_at_ms, data_bytes=len(data_json), binary=True)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Frame(UNNUMBERED, None, received_at_ms, Problem.INVALID_UTF8, data_bytes=len(raw))
    if shape.format == "text":
        return _stored(UNNUMBERED, text, received_at_ms)
    try:
        obj = json.loads(text)
    except RecursionError:
        return Frame(UNNUMBERED, None, received_at_ms, Problem.TOO_DEEP, data_bytes=len(raw))
    except ValueError as exc:  # not JSON, or an integer over 4,300 digits
        problem = Problem.NOT_JSON if isinstance(exc, json.JSONDecodeError) else Problem.NUMBER_TOO_LONG
        return Frame(UNNUMBERED, None, received_at_ms, problem, data_bytes=len(raw))
    if shape.ignore and ignored(obj, shape.ignore):
        return Rejected(Problem.IGNORED, len(raw))  # no seq spent on it
    data = shape.data.resolve(obj)
    if data is MISSING:
        return Frame(UNNUMBERED, None, received_at_ms, Problem.NO_DATA, data_bytes=len(raw))
    if (text.count("[") + text.count("{")) > MAX_DEPTH and _deeper_than([data], MAX_DEPTH + 1):
        return Frame(UNNUMBERED, None, received_at_ms, Problem.TOO_DEEP, data_bytes=len(raw))
    return _stored(UNNUMBERED, data, received_at_ms)


# A JSON string, unterminated ones included (to the end of the text), so that a scan
# never backtracks: every match either closes or runs to the end.
_STRING = re.compile(r'"[^"\\]*+(?:\\[\s\S]?+[^"\\]*+)*+(?:"|\Z)')
_COLON = re.compile(r"\s*:")
_INT_VALUE = re.compile(r"\s*:\s*(-?[0-9]+)(?![0-9.eE])")  # a key's value, if an integer literal


def _deeper_than(obj: object, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels in ``obj`` (itself level
    1), level by level without recursion; it stops at the last level it needs."""
    level = [obj]
    for _ in range(limit):
        deeper = []
        for container in level:
            for value in container.values() if type(container) is dict else container:
                if type(value) is dict or type(value) is list:
                    deeper.append(value)
        if not deeper:
            return False
        level = deeper
    return True


def _by_scan(text: str, problem: Problem, received_at_ms: int, size: int, shape: FrameShape) -> Frame | Rejected:
    """A frame json cannot read: a skip marker at its top-level seq if a scan of its
    first SEQ_SCAN_CHARS finds one. Only a seq pointer of one token names a top-level
    key a scan can find; a nested one is not looked for (the frame is only counted)."""
    if shape.seq_key is None:
        return Rejected(problem, size)
    seq = _top_level_seq(text[:SEQ_SCAN_CHARS], shape.seq_key)
    return Rejected(problem, size) if seq is None else Frame(seq, None, received_at_ms, problem)


def unparsed(message: bytes, problem: Problem, received_at_ms: int, shape: FrameShape = DEFAULT_SHAPE) -> Frame | Rejected:
    """A frame given up on unparsed (``problem``: it would cost too much): a skip marker
    at its top-level seq, with the frame's size, if a scan of its first SEQ_SCAN_CHARS
    finds one (as for a frame json cannot read); else :class:`Rejected`. Never raises, and
    costs no more than that scan, whatever the frame's size. (An assigned-seq feed's:
    an UNNUMBERED marker.)"""
    if shape.assigned:
        return Frame(UNNUMBERED, None, received_at_ms, problem, data_bytes=len(message))
    head = message[: 4 * SEQ_SCAN_CHARS].decode("utf-8", "replace")  # a character is at most 4 bytes
    found = _by_scan(head, problem, received_at_ms, len(message), shape)
    return replace(found, data_bytes=len(message)) if isinstance(found, Frame) else found


def _is_key(token: str, key: str, quoted: str) -> bool:
    """Whether a JSON string token (quotes included) is ``key``: compared as written,
    or decoded when it has escapes (``"s\\u0065q"`` is ``seq``)."""
    if token == quoted:
        return True
    if "\\" not in token or not token.endswith('"'):
        return False
    try:
        return json.loads(token) == key
    except ValueError:
        return False


def _top_level_seq(text: str, key: str = "seq") -> int | None:
    """The value of the top-level ``key`` (the last one, as json keeps the last of
    duplicate keys) if it is an integer in range, found by walking the strings and the
    brackets between them; None otherwise. It does not check that the rest is JSON."""
    depth, pos, found = 0, 0, None
    quoted = json.dumps(key, ensure_ascii=False)
    for m in _STRING.finditer(text):
        gap = text[pos : m.start()]
        depth += gap.count("{") + gap.count("[") - gap.count("}") - gap.count("]")
        pos = m.end()
        if depth == 1 and _is_key(m.group(), key, quoted) and _COLON.match(text, pos):
            value = _INT_VALUE.match(text, pos)
            found = value.group(1) if value else None
    if found is None or len(found.lstrip("-")) > len(str(MAX_SEQ)):
        return None
    seq = int(found)
    return seq if 0 <= seq <= MAX_SEQ else None


def resume_url(ws_url: str, from_seq: int) -> str:
    """``ws_url`` with ``from_seq`` set (replacing any given one), other query kept."""
    parts = urlsplit(ws_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "from_seq"]
    query.append(("from_seq", str(from_seq)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def contiguous_end(start: int, items: Iterable[tuple[int, int]]) -> tuple[int, bool]:
    """Walk stored items from ``start``, as (seq, last seq it stands for) pairs in
    ascending seq (a range marker covers seq..its skip_to, any other item its own seq):
    (the last seq reached without a hole, whether every item given was reached). What
    lies at or below the end reached so far is passed over."""
    end = start
    for seq, last in items:
        if seq > end + 1:
            return end, False
        end = max(end, last)
    return end, True


class SeqTracker:
    """What has been received and what is durably stored, for one owned stream.

    Frames are accepted in increasing seq order; a replayed seq (at or below the last
    accepted) is dropped, so a reconnect or takeover never writes a row twice within
    one ownership. Every seq up to ``last_accepted`` is in hand as a frame or a marker
    (:meth:`to_store` puts a gap marker before a frame that jumps ahead), and stored ones
    are a prefix of them, so the checkpoint (the end of what is stored) has no hole below it.

    The caller queues what :meth:`to_store` returns and only then calls :meth:`accept`:
    a frame lost between the two (the queueing cancelled, or failing: a bug of ours,
    counted in LoopErrors) is not in hand, and the next frame's gap marker covers its
    seq. The marker then blames the upstream wrongly, but there is no silent hole.

    ``assigned`` (an assigned-seq feed): frames come UNNUMBERED and :meth:`numbered`
    numbers them after the last accepted; the first frame after every socket opened
    (:meth:`opened`) comes after a ``reconnect`` marker, one seq, as the upstream cannot
    resend what it sent meanwhile; but for ``fresh`` (its first ownership, fence 1) until
    its first frame: a brand-new connection's first frame is seq 1.
    """

    def __init__(self, checkpoint: int, *, assigned: bool = False, fresh: bool = False) -> None:
        self.checkpoint = Checkpoint(checkpoint)
        self.last_accepted = int(checkpoint)
        self._over_limit_closes = 0  # at next_seq, since the last frame accepted (or marker)
        self.assigned = assigned
        self._fresh = fresh and self.last_accepted == 0
        self.reconnect_due = False  # the next numbered frame comes after a reconnect marker

    def opened(self) -> None:
        """A socket opened: an assigned-seq feed's next frame follows a reconnect marker,
        unless nothing was ever numbered for the connection (its first ownership has
        taken no frame yet: the stream starts at its first frame, as with ``resume: none``)."""
        self.reconnect_due = self.assigned and not (self._fresh and self.last_accepted == 0)

    def numbered(self, frame: Frame) -> list[Frame]:
        """An UNNUMBERED frame numbered after the last accepted, after its reconnect
        marker if one is due. Changes nothing (accepting the frame's seq clears it)."""
        seq, out = self.next_seq, []
        if self.reconnect_due:
            out.append(Frame(seq, None, frame.received_at_ms, Problem.RECONNECT))
            seq += 1
        out.append(replace(frame, seq=seq))
        return out

    @property
    def next_seq(self) -> int:
        """Where to resume the socket: seqs up to ``last_accepted`` are in hand."""
        return self.last_accepted + 1

    def to_store(self, frame: Frame) -> list[Frame]:
        """What a received frame asks to store: nothing for a replay; the frame, after one
        upstream_gap marker for the seqs it jumped over, if any. Changes nothing."""
        if frame.seq <= self.last_accepted:
            return []
        if frame.seq > self.next_seq:
            return [upstream_gap(self.next_seq, frame.seq - 1, frame.received_at_ms), frame]
        return [frame]

    def accept(self, seq: int) -> bool:
        """A frame at ``seq`` is queued (with its gap marker, if any); False for a replay."""
        if seq <= self.last_accepted:
            return False
        self.last_accepted = seq
        self._over_limit_closes = 0
        self.reconnect_due = False
        return True

    def closed_over_limit(self, received_at_ms: int, size: int | None = None) -> Frame | None:
        """The socket was closed for a frame over its limit (``size`` bytes, if known):
        the over_frame_limit marker to store at ``next_seq`` once that happened
        OVER_LIMIT_TRIES times there with no frame accepted in between, else None.

        The upstream sends from ``from_seq`` up, so the first frame from ``next_seq``
        on is the one too large: at that seq, or past a gap the upstream had right there
        (then ``next_seq`` is a seq it never produced). Either way ``next_seq`` holds
        nothing that could be stored, and a marker there hides nothing. A frame k seqs
        past such a gap costs ``(k + 1) * OVER_LIMIT_TRIES`` closes, one marker per seq:
        finite, never an endless loop. It cannot be fewer: the upstream gives no seq for
        a frame the socket never reads, and a range marker would be a guess that could
        hide a frame that exists. Nor fewer tries after a first marker: a frame over the
        limit that the upstream sends once, not as that seq (a glitch), must cost a
        reconnect, not a frame that comes after it."""
        self._over_limit_closes += 1
        if self._over_limit_closes < OVER_LIMIT_TRIES or self.assigned:  # (assigned: the reconnect marker says it)
            return None
        return Frame(self.next_seq, None, received_at_ms, Problem.OVER_FRAME_LIMIT, data_bytes=size)

    def skip_over_limit(self, marker: Frame) -> None:
        """The over_frame_limit marker from :meth:`closed_over_limit` is queued: resume
        after it, counting closes at the next seq from zero. (Not a frame accepted: the
        caller's reconnect backoff goes on growing.)"""
        if marker.seq != self.next_seq:
            raise ValueError(f"marker at {marker.seq}, expected {self.next_seq}")
        self.accept(marker.seq)

    def start_at(self, end: int) -> None:
        """A stream that cannot replay, with nothing in hand yet, starts after ``end``
        (its first frame's seq less one): the seqs up to it were never asked for, so
        they are no gap to mark."""
        if self.last_accepted != 0 or self.checkpoint != 0:
            raise ValueError(f"a stream with seqs in hand (up to {self.last_accepted}) cannot start anew")
        self.checkpoint = self.checkpoint.advanced(end)
        self.last_accepted = end

    def stored(self, end: int) -> None:
        """Stored up to ``end``, gap-free (a range marker's: the end of its range)."""
        self.checkpoint = self.checkpoint.advanced(end)
