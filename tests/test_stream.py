"""Upstream frames and checkpoints, without I/O: every class of frame the parser may
meet, replays, the resume URL."""

import json
import random
from urllib.parse import parse_qsl, urlsplit

import pytest

from wsfleet.stream import (
    MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    MAX_SEQ,
    Frame,
    Problem,
    Rejected,
    SeqTracker,
    parse_frame,
    resume_url,
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
    ('{"seq": 5}', stored("null")),
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


def test_resume_url_sets_from_seq_and_keeps_other_query_parameters():
    url = resume_url("wss://feed.example.com/s/1?token=abc&from_seq=3&x=", 42)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("wss", "feed.example.com", "/s/1")
    assert parse_qsl(parts.query, keep_blank_values=True) == [("token", "abc"), ("x", ""), ("from_seq", "42")]


def test_tracker_drops_replays_and_counts_upstream_gaps():
    t = SeqTracker(checkpoint=10)
    assert t.next_seq == 11
    assert not t.accept(10)
    assert t.accept(11) and t.accept(13)
    assert not t.accept(12)
    assert t.gaps == 1 and t.next_seq == 14


def test_checkpoint_moves_only_with_stored_frames():
    t = SeqTracker(checkpoint=0)
    for seq in (1, 2, 3):
        t.accept(seq)
    assert t.checkpoint == 0
    t.stored(2)
    assert t.checkpoint == 2
    assert t.next_seq == 4  # a reconnect resumes after what is in hand, not the checkpoint
