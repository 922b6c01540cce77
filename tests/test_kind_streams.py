"""The demo's audit of the upstream kinds, fed hand-made books: what counts as lost,
doubled or wrongly stored, and for a stream that cannot replay, which marker each
reconnect must leave."""

from __future__ import annotations

import base64
import json

from wsfleet import schema
from sim.kind_streams import (
    AUTH, BINARY, FLAT_KIND, NONE, SUBSCRIBE, TEXT, audit_assigned, audit_live_only, audit_replaying, kind_streams, leaks,
)
from sim.upstream import Kind, SocketRecord
from wsfleet.upstream_spec import parse

ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/local/demo/k-AbCdEf"
KINDS = {k.connection_id: k for k in kind_streams(ARN)}


def rec(id: int, first: int | None, last: int, *, from_seq: int = 1, subscribed: int | None = None, opened: float = 0.0) -> SocketRecord:
    return SocketRecord(id=id, stream="s", peer="p", path="/", from_seq=subscribed or from_seq, opened_at=opened or float(id),
                        first_seq_sent=first, last_seq_sent=last, subscribed_from=subscribed, kind=Kind())


def data(*seqs: int) -> list[dict]:
    return [{schema.MSG_SK: s, schema.MESSAGE_DATA: f'"d{s}"'} for s in seqs]


def gap(seq: int, to: int) -> dict:
    return {schema.MSG_SK: seq, schema.SKIPPED: schema.SKIPPED_UPSTREAM_GAP, schema.SKIP_TO: to}


def expected(upto: int) -> dict[int, str]:
    return {s: f'"d{s}"' for s in range(1, upto + 1)}


def test_every_kinds_upstream_object_is_valid_for_the_embedded_default():
    for k in KINDS.values():
        assert parse(dict(k.upstream), secret_prefix="wsfleet/local/").item() == dict(k.upstream)
    assert parse(dict(KINDS[SUBSCRIBE].upstream), secret_prefix="").opening(from_seq=7, connection_id="x") == (
        '{"op":"subscribe","stream":"k-subscribe","from_seq":7}'
    )


def test_a_replaying_stream_stored_exactly_once_with_the_sent_data_is_ok():
    a = audit_replaying(KINDS[FLAT_KIND], produced=12, checkpoint=10, items=data(*range(1, 11)), expected=expected(12),
                        sockets=[rec(1, 1, 6), rec(2, 5, 12, from_seq=5)])
    assert a.ok, a.problems
    assert (a.rows, a.first, a.sockets) == (10, 1, 2)


def test_a_replaying_stream_with_a_lost_seq_wrong_data_or_a_marker_fails():
    items = data(1, 2, 4, 5) + [{schema.MSG_SK: 3, schema.SKIPPED: schema.SKIPPED_MALFORMED}]
    items[0][schema.MESSAGE_DATA] = '"other"'
    a = audit_replaying(KINDS[FLAT_KIND], produced=6, checkpoint=6, items=items, expected=expected(6), sockets=[rec(1, 1, 6)])
    assert any("lost: seqs 3, 6" in p for p in a.problems), a.problems
    assert any("differs" in p and "seqs 1" in p for p in a.problems)
    assert any("skip markers at seqs 3" in p for p in a.problems)


def test_a_socket_sent_from_elsewhere_than_it_asked_fails():
    a = audit_replaying(KINDS[AUTH], produced=9, checkpoint=9, items=data(*range(1, 10)), expected=expected(9),
                        sockets=[rec(1, 1, 4), rec(2, 3, 9, from_seq=5)])
    assert a.problems == ["socket 2 asked for 5 but was sent from 3"]


def test_a_subscribing_stream_must_have_subscribed_every_socket_at_its_resume_point():
    good = audit_replaying(KINDS[SUBSCRIBE], produced=8, checkpoint=8, items=data(*range(1, 9)), expected=expected(8),
                           sockets=[rec(1, 1, 4, subscribed=1), rec(2, 5, 8, subscribed=5)])
    assert good.ok and "(1, 5)" in good.notes[0]
    bad = audit_replaying(KINDS[SUBSCRIBE], produced=8, checkpoint=8, items=data(*range(1, 9)), expected=expected(8),
                          sockets=[rec(1, 1, 8)])
    assert bad.problems == ["socket 1 was sent frames without a subscribe message"]


def test_a_live_only_stream_across_a_crash_has_one_marker_covering_what_nobody_was_sent():
    # The first socket started at 5 (the head then): nothing below it. Its worker stored
    # 5..17, was sent up to 20 and was killed; the successor's socket opened when the
    # head was 29, so 21..29 went to nobody and 18..20 died with the worker.
    sockets = [rec(1, 5, 20), rec(2, 30, 40, opened=100.0)]
    items = data(*range(5, 18)) + [gap(18, 29)] + data(*range(30, 41))
    a = audit_live_only(KINDS[NONE], produced=40, checkpoint=40, items=items, expected=expected(40), sockets=sockets)
    assert a.ok, a.problems
    [g] = a.gaps
    assert (g.marker, g.never_sent, g.lost_in_flight, g.next_first) == ((18, 29), (21, 29), (18, 20), 30)


def test_a_graceful_move_of_a_live_only_stream_misses_only_what_nobody_was_sent():
    sockets = [rec(1, 3, 10), rec(2, 14, 20)]
    a = audit_live_only(KINDS[NONE], produced=20, checkpoint=20, items=data(*range(3, 11)) + [gap(11, 13)] + data(*range(14, 21)),
                        expected=expected(20), sockets=sockets)
    assert a.ok and a.gaps[0].lost_in_flight is None and a.gaps[0].never_sent == (11, 13)


def test_a_live_only_stream_without_its_marker_or_with_one_at_the_start_fails():
    sockets = [rec(1, 5, 10), rec(2, 14, 20)]
    silent = audit_live_only(KINDS[NONE], produced=20, checkpoint=20, items=data(*range(5, 11), *range(14, 21)),
                             expected=expected(20), sockets=sockets)
    assert any("lost: seqs 11-13" in p for p in silent.problems)
    assert any("sent to nobody and no marker" in p for p in silent.problems)
    invented = audit_live_only(KINDS[NONE], produced=20, checkpoint=20,
                               items=[gap(1, 4)] + data(*range(5, 11)) + [gap(11, 13)] + data(*range(14, 21)),
                               expected=expected(20), sockets=sockets)
    assert any("below 5" in p for p in invented.problems)
    assert any("marker 1-4 that no reconnect explains" in p for p in invented.problems)


def test_a_marker_that_does_not_reach_back_to_what_nobody_was_sent_fails():
    sockets = [rec(1, 1, 10), rec(2, 16, 20)]
    a = audit_live_only(KINDS[NONE], produced=20, checkpoint=20, items=data(*range(1, 13)) + [gap(13, 15)] + data(*range(16, 21)),
                        expected=expected(20), sockets=sockets)
    assert a.problems == ["the marker 13-15 does not cover 11-15, sent to nobody"]


def test_leaks_names_every_text_holding_a_value():
    texts = {"w1.log": "connect X-Api-Key=demo-abc", "w2.log": "nothing", "GET k-auth": '{"upstream": {}}'}
    assert leaks(["demo-abc", ""], texts) == ["w1.log"]
    assert leaks(["demo-zzz"], texts) == []


# --- assigned seqs: text and binary feeds ----------------------------------------------------------

SENT = {10: b'{"seq":10}', 11: b'{"seq":11}', 12: b'\x00\xff'}


def text_item(seq: int, frame: bytes) -> dict:
    return {schema.MSG_SK: seq, schema.MESSAGE_DATA: json.dumps(frame.decode())}


def reconnect(seq: int) -> dict:
    return {schema.MSG_SK: seq, schema.SKIPPED: schema.SKIPPED_RECONNECT}


def test_an_assigned_feed_stored_as_sent_in_order_with_a_reconnect_marker_per_later_socket_is_ok():
    items = [text_item(1, SENT[10]), reconnect(2), text_item(3, SENT[11])]
    audit = audit_assigned(KINDS[TEXT], produced=12, checkpoint=3, items=items, frames=SENT, sockets=[rec(1, 10, 10), rec(2, 11, 11)])
    assert audit.ok, audit.problems


def test_an_assigned_feed_whose_first_owner_died_before_its_first_write_starts_at_the_next_owners_marker():
    # the first owner (socket 1) was killed before it stored a frame; the next one numbers
    # from its own block (101) and says, with a reconnect marker, that frames are missing
    items = [reconnect(101), text_item(102, SENT[11])]
    sockets = [rec(1, 10, 10), rec(2, 11, 11)]
    audit = audit_assigned(KINDS[TEXT], produced=12, checkpoint=102, items=items, frames=SENT, sockets=sockets)
    assert audit.ok, audit.problems
    # without the marker, a late start is still a problem
    audit = audit_assigned(KINDS[TEXT], produced=12, checkpoint=102, items=items[1:], frames=SENT, sockets=sockets)
    assert any("not 1" in p for p in audit.problems)


def test_a_binary_feed_is_compared_byte_for_byte_through_base64():
    items = [{schema.MSG_SK: 1, schema.MESSAGE_DATA: json.dumps(base64.b64encode(SENT[12]).decode())}]
    audit = audit_assigned(KINDS[BINARY], produced=12, checkpoint=1, items=items, frames=SENT, sockets=[rec(1, 12, 12)])
    assert audit.ok, audit.problems


def test_an_assigned_feed_with_a_frame_twice_out_of_order_invented_or_too_many_markers_fails():
    sockets = [rec(1, 10, 11)]
    twice = [text_item(1, SENT[10]), text_item(2, SENT[10])]
    invented = [text_item(1, b"never sent")]
    markers = [text_item(1, SENT[10]), reconnect(2), text_item(3, SENT[11])]
    late_start = [text_item(2, SENT[10])]
    for items, problem in ((twice, "twice"), (invented, "never sent"), (markers, "reconnect markers"), (late_start, "not 1")):
        audit = audit_assigned(KINDS[TEXT], produced=12, checkpoint=3, items=items, frames=SENT, sockets=sockets)
        assert any(problem in p for p in audit.problems), (problem, audit.problems)


def test_the_assigned_kinds_parse_as_upstreams_with_assigned_seqs():
    for cid in (TEXT, BINARY):
        assert parse(dict(KINDS[cid].upstream), secret_prefix="wsfleet/local/").assigned
