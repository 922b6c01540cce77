"""Byzantine frames: every class of bad frame the worker's parser knows (docs/design.md, "Frames:
a frame never fails a connection"), how the nemesis builds each one, and what the
checker must then find in the messages table. Plain data, no I/O.

A frame either takes a seq of its stream or takes none:

* **numbered** (:data:`ESCAPED`, :data:`MARKER`): a frame with a usable seq that the
  upstream produces as that seq (``Upstream.publish_raw``), so its books hold it. The
  worker stores it with its data escaped (the same JSON value: not "corrupt"), or as a
  skip marker (``skipped`` = ``malformed``: present, not a gap);
* **unnumbered** (:data:`NOTHING`): a frame with no usable seq (the seq out of range or
  not an integer, not an object, not JSON), put between two numbered frames
  (``Upstream.inject``). Nothing is stored for it.

Whatever the class, the socket stays up under the same owner and fence (the checker's
``malformed_closed`` and ``bounce``). A frame with an old seq (:func:`backwards`) is an
unnumbered frame too: a replay, dropped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable

ESCAPED = "escaped"  # stored, with non-ASCII characters escaped: the same JSON value
MARKER = "marker"  # a skip marker at its seq
NOTHING = "nothing"  # no usable seq: nothing stored


@dataclass(frozen=True)
class FrameClass:
    name: str
    expect: str  # ESCAPED | MARKER | NOTHING
    make: Callable[[int, str], bytes]  # (the seq it takes, the stream) -> the frame as sent

    @property
    def numbered(self) -> bool:
        return self.expect != NOTHING


def _data(seq: int, stream: str) -> str:
    """The fields every generated frame's data has (the checker reads ``t`` and ``v``),
    as JSON object members."""
    return f'"stream":{json.dumps(stream)},"t":{int(time.time() * 1000)},"v":{seq}'


def _numbered(body: str) -> Callable[[int, str], bytes]:
    """A frame ``{"seq": seq, "data": {<the usual fields>, <body>}}``."""
    return lambda seq, stream: ('{"seq":%d,"data":{%s,%s}}' % (seq, _data(seq, stream), body)).encode()


def _deep(levels: int) -> Callable[[int, str], bytes]:
    return lambda seq, stream: ('{"seq":%d,"data":{%s,"x":%s%s}}' % (seq, _data(seq, stream), "[" * levels, "]" * levels)).encode()


def _text(frame: str | bytes) -> Callable[[int, str], bytes]:
    return lambda seq, stream: frame if isinstance(frame, bytes) else frame.encode()


CLASSES: dict[str, FrameClass] = {
    c.name: c
    for c in (
        # Half a UTF-16 pair, as a JavaScript producer makes by cutting an emoji.
        FrameClass("lone_surrogate", ESCAPED, _numbered('"x":"\\ud83d"')),
        FrameClass("deep_200", MARKER, _deep(200)),  # deeper than the worker stores (128)
        FrameClass("deep_3000", MARKER, _deep(3000)),  # deeper than Python's parser goes
        FrameClass("nan", MARKER, _numbered('"x":NaN')),
        FrameClass("huge_number", MARKER, _numbered('"x":1e400')),  # beyond a double
        FrameClass("invalid_utf8", MARKER, lambda seq, stream: _numbered('"x":"')(seq, stream)[:-2] + b'\xff\xfe"}}'),
        FrameClass("seq_2_63", NOTHING, _text('{"seq":9223372036854775808,"data":1}')),
        FrameClass("seq_1e40", NOTHING, _text('{"seq":10000000000000000000000000000000000000000,"data":1}')),
        FrameClass("seq_negative", NOTHING, _text('{"seq":-1,"data":1}')),
        FrameClass("seq_float", NOTHING, _text('{"seq":5.0,"data":1}')),
        FrameClass("seq_bool", NOTHING, _text('{"seq":true,"data":1}')),
        FrameClass("top_level_array", NOTHING, _text('[{"seq":1,"data":1}]')),
        FrameClass("not_json", NOTHING, _text("not json")),
        FrameClass("invalid_utf8_no_seq", NOTHING, _text(b"\xff\xfe{")),
    )
}


def backwards(seq: int, stream: str) -> bytes:
    """A frame that goes back to ``seq`` with other data than the upstream sent as that
    seq: a replay the worker must drop (were it stored, the row would differ from the
    books: "corrupt")."""
    return ('{"seq":%d,"data":{%s,"back":true}}' % (seq, _data(seq, stream))).encode()
