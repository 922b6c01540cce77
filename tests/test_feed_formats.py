"""Feeds with no seq (upstream ``format: text | binary`` and ``seq: assigned``): the
declaration's rules, parsing, the worker's numbering with its ``reconnect`` marker and
reserved seqs, and the binary data's way through the records, the consumer, the read
API's entries and the CLI. Pure: no AWS, no sockets (the router's and the table's are
in test_router_upstream.py and test_router_messages.py; the fleet's in
test_fleet_assigned.py)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from wsfleet import message_pages, records, schema
from wsfleet.cli import render
from wsfleet.consumer import batch
from wsfleet.stream import UNNUMBERED, Frame, Problem, SeqTracker, parse_frame, unparsed
from wsfleet.upstream_spec import INVALID, WHOLE_FRAME, Format, SeqMode, parse
from wsfleet.validation import Invalid
from wsfleet.worker import numbering
from wsfleet.worker.frames import receive
from wsfleet.worker.retry import LeaseExpired

TEXT = {"format": "text", "seq": "assigned"}
BINARY = {"format": "binary", "seq": "assigned"}


def refused(value: object) -> Invalid:
    with pytest.raises(Invalid) as caught:
        parse(value, secret_prefix="")
    assert caught.value.code == INVALID
    return caught.value


# --- the declaration ---------------------------------------------------------------------------


def test_text_and_binary_need_seq_assigned():
    for value in ({"format": "text"}, {"format": "binary", "seq": "upstream"}):
        assert "give seq assigned" in str(refused(value))


@pytest.mark.parametrize(
    "value",
    [{"format": "xml"}, {"format": 1}, {"seq": "auto"}, {"seq": None}, {"format": "TEXT", "seq": "assigned"}],
)
def test_an_unknown_format_or_seq_mode_is_invalid_with_the_values_it_takes(value):
    assert "must be one of" in str(refused(value))


def test_assigned_seqs_take_no_seq_pointer_and_text_or_binary_take_no_pointer():
    assert "seq_pointer" in str(refused({"seq": "assigned", "seq_pointer": "/u"}))
    assert "data_pointer" in str(refused({**TEXT, "data_pointer": "/d"}))
    assert "data_pointer" in str(refused({**BINARY, "data_pointer": ""}))


def test_an_assigned_json_feed_stores_the_whole_frame_unless_its_data_pointer_says():
    whole = parse({"seq": "assigned"}, secret_prefix="")
    assert (whole.format, whole.seq, whole.data_pointer) == (Format.JSON, SeqMode.ASSIGNED, WHOLE_FRAME)
    assert whole.item() == {"seq": "assigned"}
    pointed = parse({"seq": "assigned", "data_pointer": "/payload"}, secret_prefix="")
    assert pointed.item() == {"seq": "assigned", "data_pointer": "/payload"}


@pytest.mark.parametrize("value", [TEXT, BINARY, {"seq": "assigned", "data_pointer": "/d"}, {"format": "json"}])
def test_the_stored_form_parses_back_to_the_same_upstream(value):
    up = parse(value, secret_prefix="")
    assert parse(up.item(), secret_prefix="") == up
    assert up.item() == {k: v for k, v in value.items() if (k, v) != ("format", "json")}


def test_an_assigned_feed_opens_its_url_without_from_seq():
    url = "wss://feed.example.com/s?topic=px"
    assert parse(TEXT, secret_prefix="").url(url, 42) == url


# --- parsing -----------------------------------------------------------------------------------


def shape(value: dict):
    return parse(value, secret_prefix="").shape()


def test_a_text_frame_is_stored_as_a_json_string_unnumbered():
    frame = parse_frame("px 101.5 \u00e9".encode(), 7, shape(TEXT))
    stored = json.dumps("px 101.5 \u00e9", ensure_ascii=False)
    assert frame == Frame(UNNUMBERED, stored, 7, data_bytes=len(stored.encode()))


def test_a_text_frame_that_is_not_utf8_is_a_malformed_marker_of_its_size_never_altered():
    frame = parse_frame(b"px \xff\xfe", 7, shape(TEXT))
    assert (frame.seq, frame.is_marker, frame.problem, frame.data_bytes) == (UNNUMBERED, True, Problem.INVALID_UTF8, 5)
    assert frame.reason == schema.SKIPPED_MALFORMED


@pytest.mark.parametrize("payload", [b"", b"\x00\x01\xff", bytes(range(256)), "text too".encode()])
def test_a_binary_frame_is_its_bytes_in_base64_whatever_they_are(payload):
    frame = parse_frame(payload, 7, shape(BINARY))
    assert frame.binary and not frame.is_marker and frame.seq == UNNUMBERED
    assert base64.b64decode(json.loads(frame.data_json)) == payload
    assert frame.data_bytes == len(frame.data_json)


@pytest.mark.parametrize(
    "message, problem",
    [(b"not json", Problem.NOT_JSON), (b"[" * 5000 + b"]" * 5000, Problem.TOO_DEEP), (b"1" * 5000, Problem.NUMBER_TOO_LONG)],
)
def test_an_assigned_json_frame_that_cannot_be_stored_is_a_marker_never_dropped(message, problem):
    frame = parse_frame(message, 7, shape({"seq": "assigned"}))
    assert (frame.seq, frame.is_marker, frame.problem, frame.data_bytes) == (UNNUMBERED, True, problem, len(message))


def test_an_assigned_json_frame_is_stored_whole_or_where_its_data_pointer_says():
    assert parse_frame(b'{"px": 1}', 7, shape({"seq": "assigned"})).data_json == '{"px":1}'
    pointed = shape({"seq": "assigned", "data_pointer": "/d"})
    assert parse_frame(b'{"d": [1]}', 7, pointed).data_json == "[1]"
    assert parse_frame(b'{"e": 1}', 7, pointed).problem is Problem.NO_DATA


def test_a_frame_given_up_unparsed_on_an_assigned_feed_is_an_unnumbered_marker():
    marker = unparsed(b"x" * 100, Problem.OVER_DECODE_BUDGET, 7, shape(BINARY))
    assert (marker.seq, marker.is_marker, marker.data_bytes) == (UNNUMBERED, True, 100)


# --- numbering and the reconnect marker ------------------------------------------------------------


def take(tracker: SeqTracker, payload: bytes, at: int = 1) -> list[tuple[int, str | None]]:
    """One frame through the worker's decision, queued and accepted: (seq, marker reason or None)."""
    got = receive(payload, at, tracker=tracker, shape=shape(TEXT), may_start_fresh=False)
    tracker.accept(got.frames[-1].seq)
    return [(f.seq, f.reason if f.is_marker else None) for f in got.frames]


def test_a_new_connections_first_frame_is_seq_1_and_the_next_ones_follow():
    tracker = SeqTracker(0, assigned=True, fresh=True)
    tracker.opened()
    tracker.opened()  # its first socket closed before any frame: the stream starts at its first frame
    assert [take(tracker, b"a"), take(tracker, b"b"), take(tracker, b"c")] == [[(1, None)], [(2, None)], [(3, None)]]


def test_every_reconnect_puts_one_reconnect_marker_before_the_next_frame():
    tracker = SeqTracker(0, assigned=True, fresh=True)
    tracker.opened()
    take(tracker, b"a")
    tracker.opened()
    assert take(tracker, b"b") == [(2, schema.SKIPPED_RECONNECT), (3, None)]
    assert take(tracker, b"c") == [(4, None)]
    tracker.opened()
    tracker.opened()  # a socket that closed before any frame: still one marker
    assert take(tracker, b"d") == [(5, schema.SKIPPED_RECONNECT), (6, None)]


def test_a_later_owner_numbers_after_where_it_starts_after_a_reconnect_marker_even_with_nothing_stored():
    for begin, fresh in ((0, False), (41, False), (41, True)):
        tracker = SeqTracker(begin, assigned=True, fresh=fresh)
        tracker.opened()
        assert take(tracker, b"a") == [(begin + 1, schema.SKIPPED_RECONNECT), (begin + 2, None)]


def test_a_marker_not_queued_is_put_again_before_the_next_frame():
    tracker = SeqTracker(5, assigned=True)
    tracker.opened()
    first = receive(b"a", 1, tracker=tracker, shape=shape(TEXT), may_start_fresh=False)  # lost before accept
    again = receive(b"b", 2, tracker=tracker, shape=shape(TEXT), may_start_fresh=False)
    assert [f.seq for f in first.frames] == [f.seq for f in again.frames] == [6, 7]
    assert again.gap is not None and again.gap.reason == schema.SKIPPED_RECONNECT


def test_an_assigned_feed_makes_no_over_frame_limit_marker_its_reconnect_marker_says_it():
    tracker = SeqTracker(5, assigned=True)
    assert all(tracker.closed_over_limit(1, 10**9) is None for _ in range(10))


def test_an_upstream_seq_feed_gets_no_reconnect_marker():
    tracker = SeqTracker(5)
    tracker.opened()
    got = receive(b'{"seq": 6, "data": 1}', 1, tracker=tracker, shape=shape({}), may_start_fresh=False)
    assert [(f.seq, f.is_marker) for f in got.frames] == [(6, False)]


def test_an_assigned_feed_taken_from_a_crashed_owner_starts_after_its_reservation():
    assert numbering.start(assigned=True, checkpoint=10, stored_end=14, reserved=110) == 110
    assert numbering.start(assigned=True, checkpoint=10, stored_end=14, reserved=0) == 14  # a clean release: exact
    assert numbering.start(assigned=False, checkpoint=10, stored_end=14, reserved=110) == 14


def test_seqs_are_reserved_a_block_ahead_before_any_is_used_and_a_lost_or_late_reservation_ends_it():
    writes: list[int] = []

    async def write(*, upto: int) -> bool:
        writes.append(upto)
        return True

    reservation = numbering.Reservation(10, write, block=100)

    async def covers() -> list[str | None]:
        return [await reservation.cover(s) for s in (5, 10, 11, 50, 110, 111)]

    assert asyncio.run(covers()) == [None] * 6
    assert writes == [110, 210]

    async def lost(*, upto: int) -> bool:
        return False

    async def late(*, upto: int) -> bool:
        raise LeaseExpired("past the deadline")

    assert asyncio.run(numbering.Reservation(10, lost).cover(11)) == "lost"
    assert asyncio.run(numbering.Reservation(10, late).cover(11)) == "expired"


# --- binary data on its way out ------------------------------------------------------------------


def binary_frame(seq: int, payload: bytes) -> Frame:
    return Frame(seq, json.dumps(base64.b64encode(payload).decode()), 5, data_bytes=10, binary=True)


def test_a_binary_frames_record_carries_data_base64_and_decodes_back_byte_for_byte():
    record = records.decode(records.encode("c1", 3, "w1", binary_frame(4, b"\x00\xff")))
    assert (record.seq, record.has_data, base64.b64decode(record.data_base64)) == (4, False, b"\x00\xff")
    assert batch.fields(record)["data_base64"] == base64.b64encode(b"\x00\xff").decode()


def test_a_large_binary_frames_record_says_its_object_holds_base64():
    raw = records.encode("c1", 3, "w1", binary_frame(4, b"x"), data_ref=("s3://b/k", 10, "ab"))
    record = records.decode(raw)
    assert (record.data_ref, record.data_format) == ("s3://b/k", schema.DATA_FORMAT_BINARY)
    assert batch.fields(record)[schema.DATA_FORMAT] == schema.DATA_FORMAT_BINARY


def test_a_reconnect_marker_is_a_record_the_consumer_takes():
    marker = Frame(9, None, 5, Problem.RECONNECT)
    record = records.decode(records.encode("c1", 3, "w1", marker))
    assert batch.fields(record)["skipped"] == schema.SKIPPED_RECONNECT


def test_the_read_api_shows_a_binary_item_as_data_base64_and_a_large_one_with_its_format():
    encoded = base64.b64encode(b"\x01\x02").decode()
    item = {schema.MSG_SK: 4, schema.MESSAGE_DATA: json.dumps(encoded), schema.DATA_FORMAT: schema.DATA_FORMAT_BINARY}
    assert message_pages.entry(item, lambda b, k: "url") == {"seq": 4, "data_base64": encoded}
    large = {
        schema.MSG_SK: 5,
        schema.DATA_REF: "s3://bucket/messages/c1/5",
        schema.DATA_BYTES: 10,
        schema.DATA_SHA256: "ab",
        schema.DATA_FORMAT: schema.DATA_FORMAT_BINARY,
    }
    assert message_pages.entry(large, lambda b, k: "url")[schema.DATA_FORMAT] == schema.DATA_FORMAT_BINARY


def test_the_cli_prints_binary_data_as_its_size_and_hex():
    line = render.message({"seq": 4, "data_base64": base64.b64encode(b"\x00\x01\xff").decode()})
    assert line == "4  (3 bytes) 00 01 ff"
    assert "not base64" in render.message({"seq": 4, "data_base64": "!!"})
