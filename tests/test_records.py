"""The Kinesis sink's record: what the worker writes is what the consumer and audits read."""

import json

import pytest

from wsfleet import records
from wsfleet.stream import Frame, Problem


def test_a_frame_a_reference_and_a_marker_round_trip():
    frame = Frame(seq=7, data_json='{"text":"h\\u00e9","n":[1,2]}', received_at_ms=1_700_000_000_123)
    rec = records.decode(records.encode("c-1", 3, "w-1", frame))
    assert (rec.connection_id, rec.seq, rec.fence_token, rec.worker_id, rec.received_at_ms) == ("c-1", 7, 3, "w-1", 1_700_000_000_123)
    assert rec.has_data and rec.data == {"text": "hé", "n": [1, 2]} and not rec.is_marker and rec.end == 7

    ref = records.decode(records.encode("c-1", 3, "w-1", frame, data_ref=("s3://b/k", 999_999, "ab" * 32)))
    assert not ref.has_data and (ref.data_ref, ref.data_bytes, ref.data_sha256) == ("s3://b/k", 999_999, "ab" * 32)

    gap = Frame(seq=10, data_json=None, received_at_ms=5, problem=Problem.UPSTREAM_GAP, skip_to=19)
    marker = records.decode(records.encode("c-1", 4, "w-2", gap))
    assert marker.is_marker and marker.skipped == "upstream_gap" and marker.end == 19 and not marker.has_data


def test_data_that_is_json_null_is_data_not_a_marker():
    rec = records.decode(records.encode("c", 1, "w", Frame(seq=1, data_json="null", received_at_ms=0)))
    assert rec.has_data and rec.data is None and not rec.is_marker


def test_a_hostile_connection_id_or_worker_id_cannot_break_the_json():
    rec = records.decode(records.encode('c"},"seq":99,"x":{"', 1, 'w\n"', Frame(seq=2, data_json="1", received_at_ms=0)))
    assert rec.connection_id == 'c"},"seq":99,"x":{"' and rec.seq == 2 and rec.worker_id == 'w\n"'


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"\xff", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b"[" * 200_000 + b"]" * 200_000, "nested too deep"),
        (json.dumps({"connection_id": "c", "seq": 1, "fence_token": 1, "worker_id": "w", "received_at_ms": 0}), "exactly one"),
        (json.dumps({"connection_id": "c", "seq": "1", "fence_token": 1, "worker_id": "w", "received_at_ms": 0, "data": 1}), "seq"),
        (json.dumps({"connection_id": "c", "seq": 1, "fence_token": True, "worker_id": "w", "received_at_ms": 0, "data": 1}), "fence_token"),
        (json.dumps({"connection_id": "c", "seq": 1, "fence_token": 1, "worker_id": "w", "received_at_ms": 0, "skipped": "bored"}), "skipped"),
    ],
)
def test_bytes_that_are_not_a_record_are_refused_with_a_sentence(raw, why):
    with pytest.raises(records.BadRecord, match=why):
        records.decode(raw)


def test_the_consumer_rule_keeps_the_highest_fence():
    old = records.decode(records.encode("c", 1, "w1", Frame(seq=5, data_json="1", received_at_ms=0)))
    new = records.decode(records.encode("c", 2, "w2", Frame(seq=5, data_json="1", received_at_ms=0)))
    assert records.newer(new, old) and not records.newer(old, new) and not records.newer(old, old)
