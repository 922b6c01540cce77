"""The fleet with SINK=kinesis,firehose, as real processes: an owner killed with -9, its
connections taken over, the survivor then stopped with SIGTERM and its connections handed
over, and the messages stream and the delivery stream's objects each
audited whole (CONTRACT.md section 4: at least once, in order (the delivery stream's in
seq order, as its readers sort it), again only after a takeover and within the bound).
One run serves both sinks: the writer sends every call to each.

Timings as tests/test_fleet.py's, but for checkpoints three seconds apart: the owner is
killed when the stream is well past its checkpoints and the next one is not due yet (the
stream is written every flush, half a second). One emulator process serves every slow
test."""

from __future__ import annotations

import dataclasses

import pytest

from tests.test_fleet import (
    RATE, SCAN_POLL_S, TIMING, busiest, start_connections, start_workers, stored_more, wait_taken_over, watched_by_all,
)
from wsfleet import schema
from sim import report, stream_audit
from sim.fleet import Fleet
from sim.processes import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KINESIS_TIMING = dataclasses.replace(TIMING, checkpoint_s=3.0)


@pytest.fixture
def fleet(emulator, tmp_path):
    with Fleet(run_dir=tmp_path, timing=KINESIS_TIMING, rate=RATE, emulator=emulator, sample_interval=0.25,
               sink=f"{schema.SINK_KINESIS},{schema.SINK_FIREHOSE}") as f:
        yield f


def stream_ahead(fleet: Fleet, connection_ids: set[str], *, by: float) -> bool:
    """Whether the stream holds ``by`` seqs past every one's checkpoint (a read of each)."""
    ends: dict[str, int] = {}
    for d in fleet.read_stream():
        if d.record is not None:
            ends[d.record.connection_id] = max(ends.get(d.record.connection_id, 0), d.record.end)
    states = fleet.scan()
    return all(ends.get(cid, 0) >= states[cid].last_seq + by for cid in connection_ids)


def test_a_kill_9_with_sink_kinesis_and_firehose_delivers_every_seq_in_order_and_again_only_after_the_takeover(fleet):
    start_workers(fleet, "w1", "w2")
    ids = start_connections(fleet, 6)
    watched_by_all(fleet, KINESIS_TIMING)
    victim, affected = busiest(fleet)
    survivor = next(name for name in fleet.live_workers() if name != victim)
    # Kill when the stream is a second of frames past each checkpoint: the next
    # checkpoint is two seconds away, so the survivor must deliver those again.
    eventually(lambda: stream_ahead(fleet, affected, by=RATE), 15, "frames on the stream past the checkpoints", interval=0.2)

    at = fleet.kill(victim)
    event = report.Event(report.CRASH, f"kill -9 {victim}", at, dict.fromkeys(affected, at), KINESIS_TIMING.crash_bound_s, victim)
    wait_taken_over(fleet, event, KINESIS_TIMING.crash_bound_s + 10)
    marks = {cid: c.last_seq for cid, c in fleet.scan().items() if cid in affected}
    eventually(lambda: stored_more(fleet, marks, 3), 15, "the survivor to checkpoint more", interval=SCAN_POLL_S)
    # Then a rolling deploy: w3 comes up and the survivor gets SIGTERM. It flushes and
    # releases at the exact end of what it sent: w3 delivers nothing again.
    start_workers(fleet, "w3")
    at, status = fleet.terminate(survivor, timeout=KINESIS_TIMING.shutdown_s + 5)
    assert status == 0
    event = report.Event(report.DEPLOY, f"SIGTERM {survivor}", at, dict.fromkeys(ids, at), KINESIS_TIMING.graceful_bound_s, survivor)
    wait_taken_over(fleet, event, KINESIS_TIMING.lease_s + 10)
    for cid in ids:
        fleet.stop_connection(cid)
    fleet.wait_quiet(ids, timeout=KINESIS_TIMING.stop_bound_s + KINESIS_TIMING.lease_s + 5)

    deliveries = fleet.read_stream()
    result = fleet.stream_audit(ids, deliveries=deliveries)
    assert result.ok, result.lines()
    assert result.connections == len(ids) and result.records == len(deliveries)
    # Again only where the crash left off: each of the victim's connections, by the
    # fence the survivor took it with, above the checkpoint it was taken with.
    again = {t.connection_id: t for t in result.takeovers if t.again}
    assert again, "a crash with frames since the last checkpoint delivers some again"
    assert set(again) <= affected
    for t in again.values():
        assert t.again <= t.bound and t.checkpoint is not None and not t.clean
        takers = {d.record.worker_id for d in deliveries if d.record.connection_id == t.connection_id
                  and d.record.fence_token == t.fence}
        assert takers == {survivor}
    handed = [t for t in result.takeovers if t.clean]
    assert {t.connection_id for t in handed} == set(ids) and all(t.again == 0 for t in handed)
    # The delivery stream's objects: the same rules, in the order a reader sorts them
    # (by seq, the highest fence kept); again only where the stream had it again.
    lines = fleet.read_delivery()
    delivered = fleet.delivery_audit(ids, deliveries=lines)
    assert delivered.ok, delivered.lines()
    assert delivered.connections == len(ids) and delivered.records == len(lines)
    again_lines = {t.connection_id: t for t in delivered.takeovers if t.again}
    assert again_lines and set(again_lines) <= affected
    assert all(t.again <= t.bound and t.checkpoint is not None for t in again_lines.values())
    assert all(t.again == 0 for t in delivered.takeovers if t.clean)
    kept = stream_audit.consumer_view(lines)
    assert {c: sorted(v) for c, v in kept.items()} == {c: sorted(v) for c, v in stream_audit.consumer_view(deliveries).items()}
    # What a consumer keeps is what the upstream sent, 1..checkpoint, each once.
    audits = fleet.audit(ids)
    assert [a for a in audits if not a.ok] == []
    assert all(a.first == 1 for a in audits)
