"""Upstream frames and checkpoints, without I/O: every class of frame the parser may
meet, replays, the resume URL."""

import json
import random
from urllib.parse import parse_qsl, urlsplit

import pytest

from wsfleet import schema
from wsfleet.pointer import Pointer
from wsfleet.stream import (
    MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    MAX_SEQ,
    OVER_LIMIT_TRIES,
    DEFAULT_SHAPE,
    Frame,
    FrameShape,
    Problem,
    Rejected,
    SeqTracker,
    contiguous_end,
    parse_frame,
    resume_url,
    unparsed,
    upstream_gap,
)


def test_a_well_formed_frame_keeps_its_data_as_compact_json():
    f = parse_frame('{"seq": 7, "data": {"a": [1, 2], "b": "é"}}', 123)
    assert (f.seq, f.data_json, f.received_at_ms) == (7, '{"a":[1,2],"b":"é"}', 123)


# Every class of frame the parser may meet, and what becomes of it: stored (its data as
# compact JSON), a skip marker at its seq (no data), or rejected (no usable seq: only
# counted). Each row: the frame, then what parse_frame returns for it (received at 123).
DEEP = "[" * 3000 + "]" * 3000


def rejected(problem: Problem) -> tuple:
    return ("rejected", problem)


def marker(problem: Problem, seq: int = 5) -> tuple:
    return ("marker", seq, problem)


def stored(data_json: str, problem: Problem | None = None, seq: int = 5) -> tuple:
    return ("stored", seq, data_json, problem)


FRAME_CLASSES = [
    # No usable seq: only counted.
    ("not json", rejected(Problem.NOT_JSON)),
    ('{"seq": 1, "data": 1', rejected(Problem.NOT_JSON)),  # truncated
    ('{"seq": 1, "data": 1} x', rejected(Problem.NOT_JSON)),  # trailing data
    ("", rejected(Problem.NOT_JSON)),
    ("[1,2]", rejected(Problem.NOT_AN_OBJECT)),
    ('"seq"', rejected(Problem.NOT_AN_OBJECT)),
    ("5", rejected(Problem.NOT_AN_OBJECT)),
    ('{"data": 1}', rejected(Problem.BAD_SEQ)),
    ('{"seq": "3"}', rejected(Problem.BAD_SEQ)),
    ('{"seq": 1.5}', rejected(Problem.BAD_SEQ)),
    ('{"seq": 5.0}', rejected(Problem.BAD_SEQ)),
    ('{"seq": true}', rejected(Problem.BAD_SEQ)),
    ('{"seq": null}', rejected(Problem.BAD_SEQ)),
    ('{"seq": -1}', rejected(Problem.BAD_SEQ)),
    ('{"seq": NaN}', rejected(Problem.BAD_SEQ)),
    ('{"seq": %d}' % 2**63, rejected(Problem.BAD_SEQ)),
    ('{"seq": %d, "data": 1}' % 10**40, rejected(Problem.BAD_SEQ)),
    ('{"seq": %s}' % ("9" * 5000), rejected(Problem.NUMBER_TOO_LONG)),
    ('{"data": %s}' % DEEP, rejected(Problem.TOO_DEEP)),
    ('{"x\\"seq": 5, "data": %s}' % DEEP, rejected(Problem.TOO_DEEP)),  # the key is x"seq, not seq
    ('{"data": {"seq": 5, "x": %s}}' % DEEP, rejected(Problem.TOO_DEEP)),  # a seq, but not the frame's
    (b"\xff\xfe\x00", rejected(Problem.INVALID_UTF8)),
    (b'{"data": "\xc3"}', rejected(Problem.INVALID_UTF8)),
    # A seq, and data that cannot be stored: a skip marker at that seq.
    ('{"seq": 5, "data": %s}' % DEEP, marker(Problem.TOO_DEEP)),  # RecursionError in json
    ('{"data": %s, "seq": 5}' % DEEP, marker(Problem.TOO_DEEP)),  # the seq after the deep part
    ('{"seq": 5, "data": %s}' % ("[" * 128 + "]" * 128), marker(Problem.TOO_DEEP)),  # past MAX_DEPTH
    (b'{"seq": 5, "data": "\xed\xa0\xbd"}', marker(Problem.INVALID_UTF8)),  # a surrogate encoded as UTF-8
    (b'{"seq": 5, "data": "\xff"}', marker(Problem.INVALID_UTF8)),
    ('{"seq": 5, "data": NaN}', marker(Problem.NOT_FINITE)),
    ('{"seq": 5, "data": [-Infinity]}', marker(Problem.NOT_FINITE)),
    ('{"seq": 5, "data": 1e400}', marker(Problem.NOT_FINITE)),
    ('{"seq": 5, "data": %s}' % ("9" * 5000), marker(Problem.NUMBER_TOO_LONG)),
    # Stored.
    ('{"seq": 5, "data": "\\ud83d"}', stored('"\\ud83d"', Problem.LONE_SURROGATE)),  # half an emoji, escaped
    ('{"seq": 5, "data": {"\\udc00é": 1}}', stored('{"\\udc00\\u00e9":1}', Problem.LONE_SURROGATE)),
    ('{"seq": 5, "data": "\\ud83d\\ude00"}', stored('"\U0001f600"')),  # a whole emoji
    ('{"seq": 5, "data": %s}' % ("[" * 127 + "]" * 127), stored("[" * 127 + "]" * 127)),  # MAX_DEPTH exactly
    ('{"seq": 5, "data": "%s"}' % ("[" * 500), stored('"%s"' % ("[" * 500))),  # brackets in a string
    ('{"seq": 5, "data": %s}' % ("9" * 4300), stored("9" * 4300)),
    ('{"seq": 5}', marker(Problem.NO_DATA)),  # no data: nothing invented (not stored as null)
    ('{"seq": 5, "data": null}', stored("null")),
    ('{"seq": 0, "data": 1}', stored("1", seq=0)),
    ('{"seq": %d, "data": 1}' % MAX_SEQ, stored("1", seq=MAX_SEQ)),
    ('{"seq": 5, "seq": 6, "data": 1}', stored("1", seq=6)),  # duplicate keys: the last wins, as in json
    ('{"seq": 5, "data": 1, "extra": [1]}', stored("1")),
    (b'{"seq": 5, "data": "\xc3\xa9"}', stored('"é"')),  # bytes, as the worker reads every frame
    ('{"seq": 5, "data": "%s"}' % ("x" * MAX_MESSAGE_BYTES), stored('"%s"' % ("x" * MAX_MESSAGE_BYTES))),  # over an item: S3
]


@pytest.mark.parametrize(("frame", "expected"), FRAME_CLASSES, ids=lambda v: repr(v)[:40])
def test_each_class_of_frame_is_stored_skipped_with_a_marker_or_rejected(frame, expected):
    got = parse_frame(frame, 123)
    if expected[0] == "rejected":
        assert got == Rejected(expected[1], len(frame))
    elif expected[0] == "marker":
        assert isinstance(got, Frame) and got.is_marker
        assert (got.seq, got.received_at_ms, got.problem) == (expected[1], 123, expected[2])
    else:
        assert got == Frame(expected[1], expected[2], 123, expected[3], data_bytes=len(expected[2].encode()))


def test_data_larger_than_an_item_is_kept_whole_with_its_stored_size():
    data = {"text": "é" * MAX_MESSAGE_BYTES, "n": [1, 2]}
    got = parse_frame(json.dumps({"seq": 1, "data": data}, indent=2), 0)
    assert not got.is_marker and got.problem is None
    assert json.loads(got.data_json) == data and got.data_json == json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    assert got.data_bytes == len(got.data_json.encode("utf-8")) > 2 * MAX_MESSAGE_BYTES  # UTF-8 bytes, not characters


def test_the_depth_limit_counts_the_frames_own_object():
    assert MAX_DEPTH == 128
    at_limit = '{"seq": 1, "data": %s}' % ("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    assert not parse_frame(at_limit, 0).is_marker
    assert parse_frame(at_limit.replace("[", "[[", 1).replace("]", "]]", 1), 0).problem is Problem.TOO_DEEP


def test_hostile_bytes_never_make_the_parser_raise():
    """Random and mutated frames (seeded): whatever comes, a Frame whose data is valid
    UTF-8 JSON of a storable size, a marker, or a rejection; never an exception."""
    rng = random.Random(20240917)
    seeds = [frame if isinstance(frame, bytes) else frame.encode() for frame, _ in FRAME_CLASSES]
    pieces = [b"[", b"{", b"]", b"}", b'"', b"\\", b'"seq":', b"\\ud83d", b"\xed\xa0\x80", b"\xff", b"1e999", b"NaN", b"-", b"\x00", b"9" * 4400]
    for n in range(3000):
        if n % 3 == 0:
            frame = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        else:
            frame = bytearray(rng.choice(seeds)[:5000])
            for _ in range(rng.randrange(1, 6)):
                at = rng.randrange(len(frame) + 1)
                if rng.random() < 0.5:
                    frame[at:at] = rng.choice(pieces) * rng.choice((1, 1, 2, 200))
                else:
                    del frame[at : at + rng.randrange(1, 8)]
            frame = bytes(frame)
        got = parse_frame(frame, 0)
        assert isinstance(got, (Frame, Rejected)), frame
        if isinstance(got, Frame):
            assert 0 <= got.seq <= MAX_SEQ
            if not got.is_marker:
                assert got.data_bytes == len(got.data_json.encode("utf-8"))  # raises on a lone surrogate
                json.loads(got.data_json, parse_constant=not_json)


def not_json(literal: str) -> None:
    raise AssertionError(f"{literal} is not JSON")


def shape(seq: str, data: str) -> FrameShape:
    return FrameShape(Pointer.parse(seq), Pointer.parse(data))


NESTED = shape("/meta/sequence", "/payload")
WHOLE = shape("/u", "")

# Frame shapes other than {"seq", "data"}: each row a shape, a frame, what becomes of it.
SHAPED = [
    (NESTED, '{"type": "update", "meta": {"sequence": 5}, "payload": {"p": 1}}', stored('{"p":1}')),
    (NESTED, '{"meta": {"sequence": 5, "x": 1}, "payload": [1, 2], "extra": 3}', stored("[1,2]")),
    (NESTED, '{"meta": {"sequence": "5"}, "payload": 1}', rejected(Problem.BAD_SEQ)),  # not an integer
    (NESTED, '{"meta": {"sequence": 5.0}, "payload": 1}', rejected(Problem.BAD_SEQ)),
    (NESTED, '{"meta": {"sequence": true}, "payload": 1}', rejected(Problem.BAD_SEQ)),
    (NESTED, '{"meta": {"sequence": %d}, "payload": 1}' % 2**63, rejected(Problem.BAD_SEQ)),
    (NESTED, '{"meta": 5, "payload": 1}', rejected(Problem.BAD_SEQ)),  # leads nowhere
    (NESTED, '{"meta": {}, "payload": 1}', rejected(Problem.BAD_SEQ)),
    (NESTED, '{"seq": 5, "payload": 1}', rejected(Problem.BAD_SEQ)),  # the default place is not looked at
    (NESTED, "[1, 2]", rejected(Problem.NOT_AN_OBJECT)),
    (NESTED, '{"meta": {"sequence": 5}}', marker(Problem.NO_DATA)),  # a seq, no data: a malformed marker
    (NESTED, '{"meta": {"sequence": 5}, "payload": null}', stored("null")),
    # A nested seq pointer is never looked for by the scan of a frame json cannot read.
    (NESTED, '{"meta": {"sequence": 5}, "payload": %s}' % DEEP, rejected(Problem.TOO_DEEP)),
    (NESTED, '{"meta": {"sequence": 5}, "payload": %s}' % ("9" * 5000), rejected(Problem.NUMBER_TOO_LONG)),
    (NESTED, b'{"meta": {"sequence": 5}, "payload": "\xff"}', marker(Problem.INVALID_UTF8)),
    (NESTED, '{"meta": {"sequence": 5}, "payload": NaN}', marker(Problem.NOT_FINITE)),
    # data_pointer "": the whole frame is the data, seq included.
    (WHOLE, '{"u": 5, "stream": "s", "v": 5}', stored('{"u":5,"stream":"s","v":5}')),
    (WHOLE, '{"u": 5,  "x": "\\ud83d"}', stored('{"u":5,"x":"\\ud83d"}', Problem.LONE_SURROGATE)),
    (WHOLE, '{"v": 5}', rejected(Problem.BAD_SEQ)),
    # A one-token seq pointer: the scan finds it by its own name, escaped or not.
    (WHOLE, '{"u": 5, "x": %s}' % DEEP, marker(Problem.TOO_DEEP)),
    (WHOLE, '{"x": %s, "\\u0075": 5}' % DEEP, marker(Problem.TOO_DEEP)),
    (WHOLE, '{"seq": 5, "x": %s}' % DEEP, rejected(Problem.TOO_DEEP)),
    (shape("/a~1b", "/d"), '{"a/b": 5, "d": 1}', stored("1")),  # RFC 6901 escapes
    (shape("/0", "/1"), "[5, {\"k\": 1}]", stored('{"k":1}')),  # an array frame, by index
    (shape("/0", "/2"), "[5, 1]", marker(Problem.NO_DATA)),
]


@pytest.mark.parametrize(("frame_shape", "frame", "expected"), SHAPED, ids=lambda v: repr(v)[:40])
def test_frame_shapes_read_the_seq_and_data_where_the_pointers_lead(frame_shape, frame, expected):
    got = parse_frame(frame, 123, frame_shape)
    if expected[0] == "rejected":
        assert got == Rejected(expected[1], len(frame))
    elif expected[0] == "marker":
        assert isinstance(got, Frame) and got.is_marker
        assert (got.seq, got.received_at_ms, got.problem, got.reason) == (expected[1], 123, expected[2], "malformed")
    else:
        assert got == Frame(expected[1], expected[2], 123, expected[3], data_bytes=len(expected[2].encode()))


def test_the_default_shape_is_seq_and_data_and_a_whole_frame_seq_pointer_is_refused():
    assert DEFAULT_SHAPE == shape("/seq", "/data")
    assert parse_frame('{"seq": 3, "data": 1}', 0) == parse_frame('{"seq": 3, "data": 1}', 0, shape("/seq", "/data"))
    with pytest.raises(ValueError):
        shape("", "/data")


def test_hostile_bytes_never_make_the_parser_raise_whatever_the_shape():
    rng = random.Random(20261202)
    shapes = [NESTED, WHOLE, shape("/0", "/1"), shape("/a/0/b", "/a")]
    pieces = [b"[", b"{", b"]", b"}", b'"', b"\\", b'"meta":', b'"u":', b'{"sequence":', b"\xff", b"NaN", b"9" * 4400]
    seeds = [f.encode() if isinstance(f, str) else f for _, f, _ in SHAPED]
    for _round in range(2000):
        frame = bytearray(rng.choice(seeds)[:3000])
        for _ in range(rng.randrange(1, 5)):
            at = rng.randrange(len(frame) + 1)
            if rng.random() < 0.5:
                frame[at:at] = rng.choice(pieces) * rng.choice((1, 2, 200))
            else:
                del frame[at : at + rng.randrange(1, 8)]
        got = parse_frame(bytes(frame), 0, rng.choice(shapes))
        assert isinstance(got, (Frame, Rejected))
        if isinstance(got, Frame) and not got.is_marker:
            assert got.data_bytes == len(got.data_json.encode("utf-8"))
            json.loads(got.data_json, parse_constant=not_json)


def test_resume_url_sets_from_seq_and_keeps_other_query_parameters():
    url = resume_url("wss://feed.example.com/s/1?token=abc&from_seq=3&x=", 42)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("wss", "feed.example.com", "/s/1")
    assert parse_qsl(parts.query, keep_blank_values=True) == [("token", "abc"), ("x", ""), ("from_seq", "42")]


def test_tracker_drops_replays_and_puts_one_gap_marker_before_a_frame_that_jumps_ahead():
    t = SeqTracker(checkpoint=10)
    assert t.next_seq == 11
    assert t.to_store(Frame(10, "1", 0)) == [] and not t.accept(10)
    assert t.to_store(Frame(11, "1", 0)) == [Frame(11, "1", 0)] and t.accept(11)
    assert t.to_store(Frame(14, "1", 7)) == [Frame(12, None, 7, Problem.UPSTREAM_GAP, skip_to=13), Frame(14, "1", 7)]
    assert t.next_seq == 12  # asking changes nothing: only accept does
    assert t.accept(14) and t.to_store(Frame(12, "1", 0)) == [] and t.next_seq == 15


def test_a_jump_of_any_length_costs_one_marker():
    t = SeqTracker(checkpoint=0)
    gap, frame = t.to_store(Frame(10**18, "1", 0))
    assert (gap.seq, gap.end, gap.reason, gap.is_marker) == (1, 10**18 - 1, schema.SKIPPED_UPSTREAM_GAP, True)
    assert frame.end == 10**18
    with pytest.raises(ValueError):
        upstream_gap(5, 4, 0)


def test_a_frame_lost_before_it_was_accepted_is_covered_by_the_next_frames_gap_marker():
    t = SeqTracker(checkpoint=0)
    t.accept(1)
    t.to_store(Frame(2, "1", 0))  # its queueing failed: never accepted
    gap, _ = t.to_store(Frame(3, "1", 0))
    assert (gap.seq, gap.end) == (2, 2)


def test_every_marker_says_its_reason():
    reasons = {p: Frame(1, None, 0, p).reason for p in Problem}
    assert reasons.pop(Problem.UPSTREAM_GAP) == schema.SKIPPED_UPSTREAM_GAP
    assert reasons.pop(Problem.OVER_FRAME_LIMIT) == schema.SKIPPED_OVER_FRAME_LIMIT
    assert reasons.pop(Problem.TOO_LARGE) == schema.SKIPPED_OVER_FRAME_LIMIT  # over the limit once re-encoded
    assert reasons.pop(Problem.OVER_DECODE_BUDGET) == schema.SKIPPED_OVER_FRAME_LIMIT  # too costly to parse
    assert reasons.pop(Problem.RECONNECT) == schema.SKIPPED_RECONNECT  # an assigned-seq feed reconnected
    assert set(reasons.values()) == {schema.SKIPPED_MALFORMED}  # every parser class, and the store's refusal
    assert Frame(1, None, 0).reason == schema.SKIPPED_MALFORMED


def test_a_frame_given_up_unparsed_is_a_marker_at_the_seq_its_head_shows_with_its_size():
    big = b'{"seq": 12, "data": [' + b"{}," * 100_000 + b"{}]}"
    assert unparsed(big, Problem.OVER_DECODE_BUDGET, 5) == Frame(12, None, 5, Problem.OVER_DECODE_BUDGET, data_bytes=len(big))
    nested = FrameShape(Pointer.parse("/u"), Pointer.parse(""))
    assert unparsed(b'{"u": 3, "v": [' + b"0," * 100_000 + b"0]}", Problem.OVER_DECODE_BUDGET, 5, nested).seq == 3


def test_a_frame_given_up_unparsed_with_no_seq_in_its_head_is_only_counted():
    seq_last = b'{"data": [' + b"{}," * 100_000 + b'{}], "seq": 12}'
    assert unparsed(seq_last, Problem.OVER_DECODE_BUDGET, 5) == Rejected(Problem.OVER_DECODE_BUDGET, len(seq_last))
    assert unparsed(b"\xff" * 300_000, Problem.OVER_DECODE_BUDGET, 5) == Rejected(Problem.OVER_DECODE_BUDGET, 300_000)


def test_a_frame_over_the_limit_is_given_up_after_a_bounded_number_of_closes_at_one_resume_point():
    t = SeqTracker(checkpoint=4)
    assert OVER_LIMIT_TRIES == 3
    assert t.closed_over_limit(9, 2_000_000) is None
    assert t.closed_over_limit(9, 2_000_000) is None
    marker = t.closed_over_limit(9, 2_000_001)
    assert marker == Frame(5, None, 9, Problem.OVER_FRAME_LIMIT, data_bytes=2_000_001)
    assert marker.reason == schema.SKIPPED_OVER_FRAME_LIMIT and t.next_seq == 5  # not until it is queued
    t.skip_over_limit(marker)
    assert t.next_seq == 6
    assert t.closed_over_limit(9) is None and t.closed_over_limit(9) is None  # the next seq: counted afresh
    assert t.closed_over_limit(9).seq == 6
    with pytest.raises(ValueError):
        t.skip_over_limit(marker)  # not where the stream is


def test_an_accepted_frame_starts_the_count_again():
    t = SeqTracker(checkpoint=0)
    t.closed_over_limit(0)
    t.closed_over_limit(0)
    t.accept(1)  # the upstream sent it once, not as that seq: it went on
    assert t.closed_over_limit(0) is None and t.closed_over_limit(0) is None
    t.closed_over_limit(0)
    t.skip_over_limit(t.closed_over_limit(0))
    assert t.next_seq == 3


def run_model_upstream(frames: dict[int, str], head: int, glitches: set[int], rng: random.Random):
    """Drive a SeqTracker as the worker does against a model upstream that sends, from
    any from_seq, its frames from there up in order ('big' ones close the socket, as
    websockets does over max_size; a seq it lacks is never sent). ``glitches``: socket
    numbers on which it first sends a frame over the limit that takes no seq (sent
    once, never again; fewer than OVER_LIMIT_TRIES in a row, or they would cost a seq).
    Returns (what was queued, sockets opened)."""
    t, queued, sockets = SeqTracker(checkpoint=0), [], 0
    last = max(frames)
    while t.next_seq <= last:  # past the last frame, a socket waits for the next one
        sockets += 1
        assert sockets < 10 * head + 50, "the loop does not converge"
        if sockets in glitches:
            closed = True
        else:
            closed = False
            for seq in range(t.next_seq, head + 1):
                if seq not in frames:
                    continue
                if frames[seq] == "big":
                    closed = True
                    break
                out = t.to_store(Frame(seq, frames[seq], 0))
                queued.extend(out)
                t.accept(seq)
                if rng.random() < 0.1:  # the socket drops now and then
                    break
        if closed and (marker := t.closed_over_limit(0)) is not None:
            queued.append(marker)
            t.skip_over_limit(marker)
    return queued, sockets


@pytest.mark.parametrize("seed", range(40))
def test_frames_over_the_limit_among_gaps_and_glitches_converge_hide_no_frame_and_leave_no_hole(seed):
    """Whatever mix of frames, frames over the limit (one after a gap of k seqs too),
    seqs the upstream never produced and glitches: the loop ends after a bounded number
    of sockets, every seq up to the last frame is queued once, in order (as data or inside a
    marker), and every frame that could be stored is stored as data."""
    rng = random.Random(seed)
    head = rng.randrange(20, 80)
    kinds = rng.choices(["ok", "big", "missing"], weights=[6, 1, 2], k=head)
    frames = {seq: ('{"v":%d}' % seq if kind == "ok" else "big") for seq, kind in enumerate(kinds, 1) if kind != "missing"}
    glitches = {n for n in rng.sample(range(1, 40), 8) if n % OVER_LIMIT_TRIES}  # never 3 in a row
    queued, sockets = run_model_upstream(frames, head, glitches, rng)
    covered = contiguous_end(0, ((f.seq, f.end) for f in queued))
    assert covered == (max(frames), True) and [f.seq for f in queued] == sorted({f.seq for f in queued})
    assert {f.seq for f in queued if not f.is_marker} == {s for s, d in frames.items() if d != "big"}
    bigs = sum(1 for d in frames.values() if d == "big")
    assert sockets <= (head + 1) * OVER_LIMIT_TRIES + len(glitches)
    assert any(f.problem is Problem.OVER_FRAME_LIMIT for f in queued) == (bigs > 0)


def test_a_frame_over_the_limit_right_after_a_gap_costs_the_tries_for_each_seq_up_to_it():
    frames = {1: "1", 2: "1", 6: "big", 7: "1"}  # 3..5 never produced
    queued, sockets = run_model_upstream(frames, 7, set(), random.Random(1))
    assert [(f.seq, f.end, f.reason if f.is_marker else "data") for f in queued] == [
        (1, 1, "data"), (2, 2, "data"),
        (3, 3, "over_frame_limit"), (4, 4, "over_frame_limit"), (5, 5, "over_frame_limit"), (6, 6, "over_frame_limit"),
        (7, 7, "data"),
    ]  # the upstream gives no seq for a frame the socket never reads: each seq tried is given up in turn
    assert sockets == 4 * OVER_LIMIT_TRIES + 1  # the first socket (1, 2, then the big one) counts its close


def test_the_gap_free_end_stops_at_the_first_hole():
    def one_each(*seqs):
        return [(s, s) for s in seqs]

    assert contiguous_end(10, one_each(11, 12, 13)) == (13, True)
    assert contiguous_end(10, one_each(11, 12, 14)) == (12, False)
    assert contiguous_end(10, one_each(9, 10, 11)) == (11, True)
    assert contiguous_end(10, []) == (10, True)


def test_the_gap_free_end_goes_through_range_markers():
    assert contiguous_end(4, [(5, 9), (10, 10), (11, 11)]) == (11, True)
    assert contiguous_end(4, [(5, 5), (6, 20), (8, 8), (21, 21)]) == (21, True)  # an item inside a range
    assert contiguous_end(4, [(5, 9), (11, 11)]) == (9, False)
    assert contiguous_end(10, [(12, 12)]) == (10, False)
    assert contiguous_end(10, [(3, 11), (12, 12)]) == (12, True)  # a range from below the start


def test_hostile_frames_with_jumps_and_replays_leave_the_queued_seqs_gap_free():
    """Parsed hostile frames at random seqs (replays, jumps up to 10^18): what the
    tracker asks to store covers every seq from the checkpoint to the last accepted
    once, in order, whatever came."""
    rng = random.Random(7)
    seeds = [frame if isinstance(frame, bytes) else frame.encode() for frame, _ in FRAME_CLASSES]
    t, queued, seq = SeqTracker(checkpoint=3), [], 3
    for _ in range(2000):
        seq = max(0, seq + rng.choice((-5, -1, 0, 1, 1, 1, 2, 50, 10**rng.randrange(1, 18))))
        seq = min(seq, MAX_SEQ)
        raw = rng.choice(seeds).replace(b'"seq": 5', b'"seq": %d' % seq)
        got = parse_frame(raw, 0)
        if isinstance(got, Rejected):
            continue
        out = t.to_store(got)
        queued.extend(out)
        if out:
            assert t.accept(got.seq)
    assert contiguous_end(3, ((f.seq, f.end) for f in queued)) == (t.last_accepted, True)
    assert all(f.is_marker for f in queued if f.problem is Problem.UPSTREAM_GAP)


def test_checkpoint_moves_only_with_stored_frames():
    t = SeqTracker(checkpoint=0)
    for seq in (1, 2, 3):
        t.accept(seq)
    assert t.checkpoint == 0
    t.stored(2)
    assert t.checkpoint == 2
    assert t.next_seq == 4  # a reconnect resumes after what is in hand, not the checkpoint
