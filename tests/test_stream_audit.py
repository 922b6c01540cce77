"""The stream audit (sim.stream_audit): the at-least-once and ordering rules
of CONTRACT.md section 4 over streams made by hand, and the harness's reader against
the emulator's stream (records put with boto3, as a worker's sink would)."""

from __future__ import annotations

import json
import uuid

import boto3

from tests.conftest import REGION
from wsfleet import aggregation, records
from sim import stream_audit as sa
from wsfleet.stream import Frame

T0 = 1_700_000_000_000
WINDOW_S = 10.0


def data(cid: str, seq: int) -> str:
    return json.dumps({"stream": cid, "v": seq}, separators=(",", ":"))


class Stream:
    """A stream being written by hand: one shard, records in the order they are put."""

    def __init__(self) -> None:
        self.out: list[sa.Delivery] = []

    def put(self, cid: str, fence: int, seqs, *, worker: str = "w1", t_ms: int | None = None, gap_to: int | None = None) -> "Stream":
        for seq in seqs:
            received = t_ms if t_ms is not None else T0 + seq * 500  # two frames a second
            frame = Frame(seq, None if gap_to else data(cid, seq), received, skip_to=gap_to)
            raw = records.encode(cid, fence, worker, frame)
            self.out.append(sa.Delivery(len(self.out), "shardId-0", str(1000 + len(self.out)), cid, records.decode(raw)))
        return self

    def raw(self, body: bytes, key: str = "x") -> "Stream":
        try:
            rec, err = records.decode(body), ""
        except records.BadRecord as exc:
            rec, err = None, str(exc)
        self.out.append(sa.Delivery(len(self.out), "shardId-0", str(1000 + len(self.out)), key, rec, err))
        return self


def acquired(cid: str, *entries: tuple[int, int, bool]) -> dict[str, dict[int, sa.Acquisition]]:
    """(fence, checkpoint at its acquisition, clean) per acquisition of ``cid``."""
    return {cid: {f: sa.Acquisition(cid, f, cp, T0, clean) for f, cp, clean in entries}}


def run(stream: Stream, acq=None, **kw) -> sa.StreamAudit:
    expected = {cid: {s: data(cid, s) for s in range(1, 200)} for cid in ("a", "b")}
    return sa.audit(stream.out, acq or {}, window_s=WINDOW_S, check=sa.expected_data(expected), **kw)


def kinds(result: sa.StreamAudit) -> list[str]:
    return [f.kind for f in result.findings]


def test_a_clean_stream_with_a_takeover_and_a_resend_passes_and_counts_both():
    s = Stream().put("a", 1, range(1, 11)).put("b", 1, range(1, 4))
    s.put("a", 1, [9, 10])  # a partly refused PutRecords: 9 and every later record again
    s.put("a", 2, range(8, 14), worker="w2")  # a takeover from checkpoint 7
    s.put("a", 2, [10, 11, 12, 13], worker="w2")  # the taker's own partial failure
    result = run(s, acquired("a", (1, 0, False), (2, 7, False)), checkpoints={"a": 13, "b": 3})

    assert result.ok, result.findings
    assert (result.delivered, result.resent, result.again_after_takeover) == (16, 6, 3)
    (takeover,) = [t for t in result.takeovers if t.again]
    assert (takeover.connection_id, takeover.fence, takeover.checkpoint, takeover.again) == ("a", 2, 7, 3)
    assert takeover.bound >= takeover.again


def test_a_missing_seq_fails_with_a_sentence():
    result = run(Stream().put("a", 1, [1, 2, 4, 5]), checkpoints={"a": 5})

    assert kinds(result) == ["gap"]
    assert "seqs 3 never delivered" in result.findings[0].sentence


def test_a_checkpoint_ahead_of_the_stream_is_a_gap():
    result = run(Stream().put("a", 1, [1, 2]), checkpoints={"a": 4})

    assert kinds(result) == ["gap"] and "3-4" in result.findings[0].sentence


def test_a_marker_fills_its_range():
    s = Stream().put("a", 1, [1, 2]).put("a", 1, [3], gap_to=6).put("a", 1, [7])
    expected = {"a": {s: data("a", s) for s in (1, 2, 7)}}
    result = sa.audit(s.out, {}, window_s=WINDOW_S, checkpoints={"a": 7},
                      check=lambda cid, r: None if r.is_marker else sa.expected_data(expected)(cid, r))

    assert result.ok, result.findings
    assert result.delivered == 7


def test_a_reordered_last_delivery_fails():
    result = run(Stream().put("a", 1, [1, 2, 4, 3]))

    assert kinds(result) == ["order"]
    assert "seq 4" in result.findings[0].sentence and "before seq 3" in result.findings[0].sentence


def test_a_resend_that_leaves_a_later_seq_behind_fails_on_order():
    """A refused record sent again without the later records of its connection: the
    last delivery of 3 comes after the last of 4."""
    result = run(Stream().put("a", 1, [1, 2, 3, 4]).put("a", 1, [3]))

    assert kinds(result) == ["order"]


def test_a_higher_fence_delivering_again_at_or_below_its_checkpoint_is_unexplained():
    s = Stream().put("a", 1, range(1, 9)).put("a", 2, range(5, 10), worker="w2")
    result = run(s, acquired("a", (1, 0, False), (2, 6, False)))

    assert kinds(result) == ["duplicate"]
    assert "seqs 5-6 again, at or below the checkpoint 6" in result.findings[0].sentence


def test_a_higher_fence_with_no_acquisition_in_the_journal_is_unexplained():
    s = Stream().put("a", 1, range(1, 5)).put("a", 2, [4, 5], worker="w2")
    result = run(s, acquired("a", (1, 0, False)))

    assert kinds(result) == ["duplicate"] and "no acquisition" in result.findings[0].sentence


def test_duplicates_over_the_bound_fail():
    """The previous owner received 40 frames in 20 s; its checkpoint was 30 s old: the
    takeover delivers 40 again, of which only those received in the last 10 s are owed."""
    s = Stream().put("a", 1, range(1, 41)).put("a", 2, range(1, 42), worker="w2")
    result = run(s, acquired("a", (1, 0, False), (2, 0, False)))

    assert kinds(result) == ["bound"]
    assert "delivered 40 seqs again" in result.findings[0].sentence and "received 21 within 10s" in result.findings[0].sentence


def test_a_lower_fence_after_a_higher_one_is_stale_unless_excused():
    s = Stream().put("a", 1, range(1, 6)).put("a", 2, range(4, 8), worker="w2").put("a", 1, [5], worker="w1")
    acq = acquired("a", (1, 0, False), (2, 3, False))

    assert kinds(run(s, acq)) == ["stale"]
    excused = run(s, acq, excuse=lambda d: d.record.worker_id == "w1")
    assert excused.ok and (excused.stale, excused.stale_excused) == (1, 1)


def test_a_seq_only_a_stale_record_delivered_is_a_gap_since_the_consumer_drops_it():
    """The taker (fence 2, acquired at checkpoint 2) delivers 3, 4 and 6 but never 5;
    5 is on the stream only from the frozen first owner, after fence 2's records: the
    reference consumer drops that record as stale (the taker owes 5 itself), so 5 is
    lost downstream, excused writer or not."""
    s = Stream().put("a", 1, range(1, 5)).put("a", 2, [3, 4, 6], worker="w2").put("a", 1, [5], worker="w1")
    result = run(s, acquired("a", (1, 0, False), (2, 2, False)), excuse=lambda d: d.record.worker_id == "w1")

    assert kinds(result) == ["gap"], result.findings
    assert "seqs 5 never delivered" in result.findings[0].sentence


def test_a_checkpoint_covered_only_by_stale_records_is_a_gap():
    s = Stream().put("a", 1, range(1, 4)).put("a", 2, [2, 3], worker="w2").put("a", 1, [4, 5], worker="w1")
    result = run(s, acquired("a", (1, 0, False), (2, 1, False)), checkpoints={"a": 5}, excuse=lambda d: True)

    assert kinds(result) == ["gap"] and "seqs 4-5 never delivered" in result.findings[0].sentence


def test_seqs_missing_before_the_first_delivered_are_a_gap_from_the_first_acquisitions_checkpoint():
    """Acquired at checkpoint 0, checkpointed to 10, but only 5..10 on the stream: the
    owner resumed from 1, so 1..4 are missing (a checkpoint ahead of the stream), not
    a stream that happens to start at 5."""
    s = Stream().put("a", 1, range(5, 11))
    result = run(s, acquired("a", (1, 0, False)), checkpoints={"a": 10})

    assert kinds(result) == ["gap"] and "seqs 1-4 never delivered" in result.findings[0].sentence
    assert run(Stream().put("a", 1, range(5, 11)), acquired("a", (1, 4, False)), checkpoints={"a": 10}).ok


def test_wrong_data_a_bad_record_and_a_foreign_partition_key_are_findings():
    s = Stream().put("a", 1, [1])
    s.raw(records.encode("a", 1, "w1", Frame(2, '{"stream":"a","v":99}', T0)), key="a")
    s.raw(b"not json at all")
    s.raw(records.encode("b", 1, "w1", Frame(1, data("b", 1), T0)), key="a")
    result = run(s)

    assert sorted(kinds(result)) == ["bad_record", "data", "shards"]
    assert "not JSON" in next(f.sentence for f in result.findings if f.kind == "bad_record")


def test_records_of_one_connection_on_two_shards_fail():
    s = Stream().put("a", 1, [1, 2])
    s.out[1] = sa.Delivery(1, "shardId-1", "9", "a", s.out[1].record)

    assert kinds(run(s)) == ["shards"]


def test_the_consumer_view_keeps_the_highest_fence_and_reads_as_table_items():
    s = Stream().put("a", 1, [1, 2, 3]).put("a", 2, [2, 3], worker="w2").put("a", 1, [3], worker="w1")
    view = sa.consumer_view(s.out)["a"]

    assert {seq: r.fence_token for seq, r in view.items()} == {1: 1, 2: 2, 3: 2}
    items = sa.as_items(view)
    assert [(i["sk"], i["fence_token"], json.loads(i["message_data"])["v"]) for i in items] == [(1, 1, 1), (2, 2, 2), (3, 2, 3)]


def test_acquisitions_read_the_checkpoint_each_fence_was_acquired_with_from_the_journal():
    journal = [
        {"op": "update", "pk": "CONN#a", "fence": 1, "t_ms": 1},
        {"op": "checkpoint", "pk": "CONN#a", "last_seq": 5, "fence": 1, "t_ms": 2},
        {"op": "update", "pk": "CONN#a", "fence": 2, "t_ms": 3},  # a takeover after a crash
        {"op": "release", "pk": "CONN#a", "last_seq": 9, "fence": 2, "t_ms": 4},
        {"op": "update", "pk": "CONN#a", "fence": 3, "t_ms": 5},  # after a clean release
        {"op": "ended", "session": "s1", "by": "s2", "t_ms": 6},
    ]
    found = sa.acquisitions(journal)["a"]

    assert [(a.fence, a.checkpoint, a.clean) for a in found.values()] == [(1, 0, False), (2, 5, False), (3, 9, True)]


def test_read_stream_returns_every_record_of_every_shard_in_shard_order(emulator):
    kinesis = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=REGION)
    name = f"audit-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})
    cids = [f"c{i}" for i in range(6)]
    for first in (1, 4):
        batch = [{"Data": records.encode(cid, 1, "w1", Frame(seq, data(cid, seq), T0)), "PartitionKey": cid}
                 for seq in range(first, first + 3) for cid in cids]
        assert kinesis.put_records(StreamName=name, Records=batch)["FailedRecordCount"] == 0
    kinesis.put_record(StreamName=name, Data=b"\xff not a record", PartitionKey="c0")

    read = sa.read_stream(kinesis, name)

    assert len(read) == 6 * 6 + 1
    assert len({d.shard_id for d in read}) == 2  # six keys over two shards
    for cid in cids:
        assert [d.record.seq for d in read if d.record and d.record.connection_id == cid] == list(range(1, 7))
    result = sa.audit(read, {}, window_s=WINDOW_S, checkpoints=dict.fromkeys(cids, 6),
                      check=sa.expected_data({cid: {s: data(cid, s) for s in range(1, 7)} for cid in cids}))
    assert kinds(result) == ["bad_record"] and result.delivered == 36
    assert all(d.arrived_at for d in read)


def test_read_stream_unpacks_an_aggregate_into_its_records_each_judged_as_a_plain_ones_would_be(emulator):
    kinesis = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=REGION)
    name = f"audit-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})
    body = lambda cid, seq: records.encode(cid, 1, "w1", Frame(seq, data(cid, seq), T0))  # noqa: E731
    kinesis.put_records(StreamName=name, Records=[
        {"Data": aggregation.pack("a", [body("a", s) for s in (1, 2, 3)]), "PartitionKey": "a"},
        {"Data": body("a", 4), "PartitionKey": "a"},
        {"Data": aggregation.pack("b", [body("b", 1)]), "PartitionKey": "a"},  # a record under another key
    ])

    read = sa.read_stream(kinesis, name)

    assert [(d.position, d.record.seq if d.record else None, d.sub_sequence) for d in read] == [
        (0, 1, 0), (1, 2, 1), (2, 3, 2), (3, 4, None), (4, None, 0)]
    assert len({d.sequence_number for d in read[:3]}) == 1 and "under partition key 'a'" in read[4].error
    result = sa.audit(read, {}, window_s=WINDOW_S, checkpoints={"a": 4},
                      check=sa.expected_data({"a": {s: data("a", s) for s in range(1, 5)}}))
    assert kinds(result) == ["bad_record"] and (result.records, result.kinesis_records, result.delivered) == (5, 3, 4)
