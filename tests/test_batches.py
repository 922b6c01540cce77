"""The writer's decisions without I/O: the caps, when a batch is due, what it takes
(oldest first, fair shares, spread over concurrent batches, never past an upload), what
becomes of it once the store answered, and what is sent after a refusal."""

import pytest

from wsfleet.checkpoint import Tally
from wsfleet.sinks import StoredObject
from wsfleet.stream import MAX_MESSAGE_BYTES, Frame, Problem, upstream_gap
from wsfleet.worker.batches import Lane, Pending, frame_bytes, refusal, tally, within_limit

LARGE = MAX_MESSAGE_BYTES + 1


def f(seq: int, size: int = 10) -> Frame:
    return Frame(seq, '"x"', 0, data_bytes=size)


def pending(*, batch: int = 4, concurrency: int = 1, per_lane: int = 100, frames: int = 1000, max_bytes=None):
    return Pending(
        batch=batch,
        concurrency=concurrency,
        interval_s=0.1,
        max_per_lane=per_lane,
        max_frames=frames,
        max_bytes=max_bytes,
    )


def lanes(p: Pending, *counts: int, now: float = 0.0) -> list[Lane]:
    out = []
    for i, n in enumerate(counts):
        lane = Lane(connection_id=f"c{i}", fence_token=1)
        p.add(lane, [f(s) for s in range(1, n + 1)], 10 * n, now)
        out.append(lane)
    return out


def taken(batch) -> dict[str, list[int]]:
    return {lane.connection_id: [fr.seq for fr, _ in frames] for lane, frames in batch}


def test_a_frames_bytes_are_its_data_and_twice_that_for_data_that_goes_to_an_object():
    assert (frame_bytes(f(1, 10)), frame_bytes(f(1, LARGE))) == (10, 2 * LARGE)
    assert frame_bytes(upstream_gap(1, 5, 0)) == 0


def test_data_over_the_frame_limit_once_re_encoded_becomes_an_over_frame_limit_marker():
    small = f(1, 100)
    assert within_limit(small, 100) is small
    marker = within_limit(f(2, 101), 100)
    assert (marker.seq, marker.is_marker, marker.problem, marker.data_bytes) == (2, True, Problem.TOO_LARGE, 101)


def test_a_receive_loop_waits_at_its_lanes_cap_the_workers_cap_or_the_byte_cap():
    p = pending(per_lane=2, frames=3, max_bytes=25)
    a, b = Lane(connection_id="a", fence_token=1), Lane(connection_id="b", fence_token=1)
    assert not p.full(a, 1000)  # no bytes held: even a frame over the byte cap is taken
    p.add(a, [f(1), f(2)], 20, 0.0)
    assert p.full(a, 0) and not p.full(b, 5) and p.full(b, 6)
    p.add(b, [f(1)], 0, 0.0)
    assert p.full(b, 0)  # the worker's cap: 3 pending
    assert (p.count, p.bytes, p.bytes_high_water) == (3, 20, 20)


def test_the_loop_is_woken_when_a_batch_is_full_or_the_first_lane_starts_waiting():
    p = pending(batch=3)
    a, b = Lane(connection_id="a", fence_token=1), Lane(connection_id="b", fence_token=1)
    assert p.add(a, [f(1)], 10, 0.0)  # the only lane waiting
    assert not p.add(b, [f(1)], 10, 0.0)  # the loop already waits for the first one's time
    assert p.add(b, [f(2)], 10, 0.0)  # a whole batch


def test_a_batch_is_due_an_interval_after_the_oldest_frame_or_at_once_when_full_or_flushed():
    p = pending(batch=4)
    assert p.due_in(5.0) is None
    (a,) = lanes(p, 1, now=5.0)
    assert p.due_in(5.05) == pytest.approx(0.05)
    a.flushing = 1
    assert p.due_in(5.05) == 0.0
    a.flushing = 0
    lanes(p, 0, 3)
    assert p.due_in(5.0) == 0.0  # 4 pending: a batch


def test_a_batch_takes_each_lanes_fair_share_first_then_the_rest_from_the_front():
    p = pending(batch=6)
    a, b = lanes(p, 5, 1, 1)[:2]
    batch = p.take()
    assert taken(batch) == {"c0": [1, 2, 3, 4], "c1": [1], "c2": [1]}  # shares of 2, then c0's next from the front
    assert a.in_flight and b.in_flight and p.count == 1
    assert list(p.waiting) == ["c0"] and p.ready() == []  # one batch in flight per lane


def test_a_lane_with_a_batchs_worth_pending_goes_alone_so_a_throttle_of_its_partition_holds_no_other():
    p = pending(batch=4, concurrency=4)
    lanes(p, 1, 9, 2)
    assert taken(p.take()) == {"c0": [1], "c2": [1, 2]}  # the oldest is shallow: the deep one is left out
    assert taken(p.take()) == {"c1": [1, 2, 3, 4]}
    oldest_deep = pending(batch=4, concurrency=4)
    lanes(oldest_deep, 9, 1)
    assert taken(oldest_deep.take()) == {"c0": [1, 2, 3, 4]}
    assert taken(oldest_deep.take()) == {"c1": [1]}


def test_deep_lanes_are_spread_over_concurrent_batches_and_shallow_ones_fill_one():
    p = pending(batch=25, concurrency=4)
    lanes(p, 30, 30)
    assert taken(p.take()) == {"c0": list(range(1, 26))}
    assert taken(p.take()) == {"c1": list(range(1, 26))}
    shallow = pending(batch=25, concurrency=4)
    lanes(shallow, *[1] * 26)
    assert len(taken(shallow.take())) == 25 and len(taken(shallow.take())) == 1


def test_a_lanes_frames_behind_data_still_uploading_wait_for_its_object():
    p = pending(batch=4)
    lane = Lane(connection_id="a", fence_token=1)
    p.add(lane, [f(1), f(2, LARGE), f(3)], 0, 0.0)
    assert taken(p.take()) == {"a": [1]}  # up to the upload
    p.settle([(lane, [(f(1), 0.0)])], stored=True, is_open=lambda _: True, is_live=lambda _: True)
    assert p.take() == [] and p.due_in(0.0) is None
    lane.objects[2] = StoredObject("s3://bucket/k", LARGE, "00")
    assert taken(p.take()) == {"a": [2, 3]}


def test_a_stored_batch_tells_each_open_lane_its_last_seq_and_frees_its_bytes():
    p = pending(batch=4)
    a, b = lanes(p, 1, 1)
    gap = upstream_gap(2, 9, 0)
    p.add(a, [gap], 0, 0.0)
    batch = p.take()
    settled = p.settle(batch, stored=True, is_open=lambda lane: lane is a, is_live=lambda _: True)
    assert [(lane, end) for lane, end, _ in settled.stored] == [(a, 9)]  # a range marker's end
    assert settled.stored[0][2] == Tally(frames=1, bytes=10, last_frame_at_ms=0)  # the marker counts no frame
    assert settled.freed == 20 and p.bytes == 0 and not a.in_flight and not b.in_flight


def test_a_stored_batch_counts_its_data_frames_their_bytes_and_the_newest_ones_time_not_its_markers():
    frames = [Frame(1, '"ab"', 5_000), Frame(2, None, 9_000, Problem.TOO_DEEP, data_bytes=7), Frame(3, '"é"', 6_000)]
    assert tally((fr, 0.0) for fr in frames) == Tally(frames=2, bytes=4 + 4, last_frame_at_ms=6_000)
    assert not tally([(upstream_gap(4, 9, 9_500), 0.0)])  # nothing to count: no piece to add


def test_a_batch_not_stored_goes_back_in_front_of_live_lanes_and_is_given_up_for_the_others():
    p = pending(batch=4)
    a, b = lanes(p, 3, 1)
    batch = p.take()
    assert taken(batch) == {"c0": [1, 2, 3], "c1": [1]}
    settled = p.settle(batch, stored=False, is_open=lambda _: True, is_live=lambda lane: lane is a)
    assert settled.stored == [] and settled.freed == 10  # b's: past its deadline
    assert [fr.seq for fr, _ in a.frames] == [1, 2, 3] and not b.frames
    assert next(iter(p.waiting)) == "c0" and p.count == 3


def test_the_objects_of_a_stored_batch_are_counted_and_forgotten():
    p = pending(batch=4)
    lane = Lane(connection_id="a", fence_token=1)
    lane.objects[1] = StoredObject("s3://bucket/k", LARGE, "00")
    p.add(lane, [f(1, LARGE)], 2 * LARGE, 0.0)
    settled = p.settle(p.take(), stored=True, is_open=lambda _: True, is_live=lambda _: True)
    assert settled.large == 1 and lane.objects == {} and p.bytes == 0


def test_a_refused_batch_is_split_until_the_item_is_found_which_becomes_a_marker_and_a_marker_is_dropped():
    entries = [("a", 1, f(s)) for s in range(1, 6)]
    halves = refusal(entries)
    assert halves.again == (entries[:2], entries[2:]) and halves.malformed is None and halves.dropped is None
    one = refusal(entries[:1])
    ((cid, fence, marker),) = one.again[0]
    assert (cid, fence, marker.seq, marker.problem, one.malformed) == ("a", 1, 1, Problem.STORE_REFUSED, entries[0])
    dropped = refusal([("a", 1, marker)])
    assert dropped.again == () and dropped.dropped == ("a", 1, marker)


def test_a_closed_lanes_pending_frames_are_forgotten_with_their_bytes():
    p = pending(batch=10)
    a, b = lanes(p, 3, 1)
    assert p.drop(a) == 3 and not a.frames
    assert (p.count, p.bytes, list(p.waiting)) == (1, 10, ["c1"])
