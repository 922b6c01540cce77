"""Upstream frames and checkpoints, without I/O."""

from urllib.parse import parse_qsl, urlsplit

from wsfleet.stream import MAX_MESSAGE_BYTES, SeqTracker, parse_frame, resume_url


def test_a_well_formed_frame_keeps_its_data_as_compact_json():
    f = parse_frame('{"seq": 7, "data": {"a": [1, 2], "b": "é"}}', 123)
    assert (f.seq, f.data_json, f.received_at_ms) == (7, '{"a":[1,2],"b":"é"}', 123)


def test_malformed_frames_are_rejected():
    for text in [
        "not json",
        "[1,2]",
        '{"data": 1}',
        '{"seq": "3"}',
        '{"seq": 1.5}',
        '{"seq": true}',
        '{"seq": -1}',
        b'{"seq": 1}',
    ]:
        assert parse_frame(text, 0) is None, text


def test_a_frame_too_large_for_a_dynamodb_item_is_rejected():
    assert parse_frame('{"seq": 1, "data": "%s"}' % ("x" * MAX_MESSAGE_BYTES), 0) is None


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
