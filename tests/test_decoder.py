"""Large frames parsed off the event loop (wsfleet.worker.decoder), without a socket: the
child parses them exactly as the loop would, gives up (a skip marker at the seq) on a
frame past its memory budget or its time limit, and is replaced when it dies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from wsfleet import schema
from wsfleet.pointer import Pointer
from wsfleet.stream import DEFAULT_SHAPE, Frame, FrameShape, Problem, Rejected, SeqTracker, parse_frame
from wsfleet.worker.decoder import IN_LOOP, FrameDecoder
from wsfleet.worker.frames import receive

MAX_FRAME = 4 << 20  # the child's budget: 20 MiB beyond the frame
OFF_LOOP = 64 << 10


def amplifying(seq: int, size: int) -> bytes:
    """``{"seq":<seq>,"data":[{},{},...]}`` of about ``size`` bytes: 72 bytes of objects
    for every 3 sent."""
    return b'{"seq":%d,"data":[' % seq + b"{}," * (size // 3) + b"{}]}"


def ordinary(seq: int, size: int) -> bytes:
    """A valid frame of about ``size`` bytes, non-ASCII (two bytes a character in Python:
    six times its size at the peak of its parse) and nested, within budget."""
    return json.dumps({"seq": seq, "data": {"text": "ü€" + "y" * size, "n": [1, 2.5, None, True]}}).encode()


def decoded(decoder: FrameDecoder, message: bytes, shape: FrameShape = DEFAULT_SHAPE) -> Frame | Rejected:
    async def go():
        try:
            return await decoder.parse(message, 7, shape)
        finally:
            decoder.close()

    return asyncio.run(go())


@pytest.fixture
def decoder():
    d = FrameDecoder(max_frame_bytes=MAX_FRAME, off_loop_bytes=OFF_LOOP)
    yield d
    d.close()


def run(coro):
    return asyncio.run(coro)


def test_a_small_frame_is_parsed_on_the_loop_and_starts_no_child(decoder):
    message = ordinary(3, 1000)
    got = run(decoder.receive(message, 7, SeqTracker(2), DEFAULT_SHAPE, may_start_fresh=False))
    assert got == receive(message, 7, tracker=SeqTracker(2), shape=DEFAULT_SHAPE, may_start_fresh=False)
    assert decoder.stats.children_started == 0 and decoder.child_pid is None


def test_the_default_decoder_parses_every_frame_on_the_loop():
    message = ordinary(3, 1 << 20)
    got = run(IN_LOOP.receive(message, 7, SeqTracker(2), DEFAULT_SHAPE, may_start_fresh=False))
    assert got.frames == receive(message, 7, tracker=SeqTracker(2), shape=DEFAULT_SHAPE, may_start_fresh=False).frames
    assert IN_LOOP.stats.children_started == 0


@pytest.mark.slow
def test_a_large_frame_becomes_exactly_what_the_loop_would_make_of_it(decoder):
    shape = FrameShape(Pointer.parse("/meta/sequence"), Pointer.parse("/payload"))
    cases = [
        (ordinary(5, 1 << 20), DEFAULT_SHAPE),
        (json.dumps({"meta": {"sequence": 6}, "payload": list(range(100_000))}).encode(), shape),
        (b'{"seq": 7, "data": "\xf0\x9f\x98\x80' + b"x" * (300 << 10) + b'"}', DEFAULT_SHAPE),  # 4 bytes a character
        (json.dumps({"seq": 10, "data": "€😀" * 400_000}, ensure_ascii=False).encode(), DEFAULT_SHAPE),  # split by pieces
        (b'{"seq": 8, "data": "\\ud83d' + b"x" * (1 << 20) + b'"}', DEFAULT_SHAPE),  # stored escaped
        (b'{"seq": 9, "data": "\xff' + b"x" * (1 << 20) + b'"}', DEFAULT_SHAPE),  # a marker: invalid UTF-8
        (b"[" * (1 << 17) + b"]" * (1 << 17), DEFAULT_SHAPE),  # rejected: no seq
    ]

    async def go():
        return [await decoder.parse(m, 7, s) for m, s in cases]

    got = run(go())
    assert got == [parse_frame(m, 7, s) for m, s in cases]
    assert got[0].data_bytes == len(json.dumps(json.loads(cases[0][0])["data"], ensure_ascii=False, separators=(",", ":")).encode())
    assert decoder.stats.frames == len(cases) and decoder.stats.children_started == 1 and decoder.stats.given_up == 0


@pytest.mark.slow
def test_a_large_frame_of_a_text_binary_or_seqless_json_feed_becomes_what_the_loop_would_make_of_it(decoder):
    text, binary, seqless = (FrameShape(Pointer.parse("/seq"), Pointer.parse(""), f, True) for f in ("text", "binary", "json"))
    cases = [
        (("é" * (300 << 10)).encode(), text),
        (b"\xff" + b"x" * (300 << 10), text),  # not UTF-8: an unnumbered marker
        (bytes(range(256)) * 2000, binary),
        (json.dumps({"px": list(range(100_000))}).encode(), seqless),
    ]

    async def go():
        return [await decoder.parse(m, 7, s) for m, s in cases]

    got = run(go())
    assert got == [parse_frame(m, 7, s) for m, s in cases]
    assert got[2].binary and got[1].is_marker and decoder.stats.children_started == 1


@pytest.mark.slow
def test_a_frame_of_tiny_objects_past_the_budget_is_a_marker_at_its_seq_and_the_child_goes_on(decoder):
    hostile = amplifying(41, MAX_FRAME - 100)  # under the frame limit, ~50 MB of objects

    async def go():
        marker = await decoder.parse(hostile, 7, DEFAULT_SHAPE)
        after = await decoder.parse(ordinary(42, 1 << 20), 7, DEFAULT_SHAPE)
        return marker, after

    marker, after = run(go())
    assert marker == Frame(41, None, 7, Problem.OVER_DECODE_BUDGET, data_bytes=len(hostile))
    assert marker.reason == schema.SKIPPED_OVER_FRAME_LIMIT
    assert after == parse_frame(ordinary(42, 1 << 20), 7)
    assert decoder.stats.children_started == 1  # a MemoryError in the child, not its death
    assert (decoder.stats.frames, decoder.stats.given_up) == (2, 1)


@pytest.mark.slow
def test_the_marker_is_received_like_any_bad_frame_and_later_frames_follow_in_order(decoder):
    tracker = SeqTracker(40)

    async def go():
        got = []
        for message in (ordinary(41, 10), amplifying(42, MAX_FRAME - 100), ordinary(43, 10)):
            r = await decoder.receive(message, 7, tracker, DEFAULT_SHAPE, may_start_fresh=False)
            tracker.accept(r.frames[-1].seq)
            got.append(r)
        return got

    small, big, after = run(go())
    assert [f.seq for r in (small, big, after) for f in r.frames] == [41, 42, 43]
    assert big.problem is Problem.OVER_DECODE_BUDGET and big.frames[0].is_marker and big.stored_as == "skip_marker"


@pytest.mark.slow
def test_a_frame_with_no_seq_in_its_head_given_up_is_only_counted(decoder):
    hostile = b'{"data":[' + b"{}," * (MAX_FRAME // 3) + b'{}],"seq":5}'
    got = decoded(decoder, hostile)
    assert got == Rejected(Problem.OVER_DECODE_BUDGET, len(hostile))


@pytest.mark.slow
def _dead(pid: int) -> bool:
    """Killed: a zombie, or already reaped (then /proc has no entry, even between a look
    at the directory and a read of its status)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" in status.read()
    except (FileNotFoundError, ProcessLookupError):  # reaped between the open and the read
        return True


def test_a_killed_child_is_replaced_and_the_next_frame_parsed(decoder):
    async def go():
        first = await decoder.parse(ordinary(1, 1 << 20), 7, DEFAULT_SHAPE)
        pid = decoder.child_pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not _dead(pid):
            assert time.monotonic() < deadline, "the killed child lingered"
            await asyncio.sleep(0.01)
        second = await decoder.parse(ordinary(2, 1 << 20), 7, DEFAULT_SHAPE)
        return first, pid, second

    first, pid, second = run(go())
    assert first == parse_frame(ordinary(1, 1 << 20), 7) and second == parse_frame(ordinary(2, 1 << 20), 7)
    assert decoder.stats.children_started == 2 and decoder.child_pid != pid and decoder.stats.given_up == 0


@pytest.mark.slow
def test_a_frame_over_the_time_limit_is_a_marker_and_its_child_is_replaced(decoder):
    slow = json.dumps({"seq": 3, "data": [0] * 400_000}).encode()

    async def go():
        await decoder.parse(ordinary(1, 1 << 20), 7, DEFAULT_SHAPE)  # the child is up: the limit is the parse's
        decoder.timeout_s = 0.001
        marker = await decoder.parse(slow, 7, DEFAULT_SHAPE)
        decoder.timeout_s = 30
        after = await decoder.parse(slow, 7, DEFAULT_SHAPE)
        return marker, after

    marker, after = run(go())
    assert marker == Frame(3, None, 7, Problem.OVER_DECODE_BUDGET, data_bytes=len(slow))
    assert after == parse_frame(slow, 7)
    assert decoder.stats.timeouts == 1 and decoder.stats.children_started == 2


@pytest.mark.slow
def test_a_large_frame_being_parsed_holds_back_no_small_frame(decoder):
    order = []

    async def big():
        await decoder.parse(amplifying(1, MAX_FRAME - 100), 7, DEFAULT_SHAPE)
        order.append("big")

    async def small():
        await asyncio.sleep(0)  # the big one has gone to the child
        await decoder.receive(ordinary(5, 10), 7, SeqTracker(4), DEFAULT_SHAPE, may_start_fresh=False)
        order.append("small")

    async def go():
        await asyncio.gather(big(), small())

    run(go())
    assert order == ["small", "big"]


@pytest.mark.slow
def test_a_parse_cancelled_midway_kills_its_child_so_the_next_frame_gets_its_own_answer(decoder):
    slow = json.dumps({"seq": 3, "data": [0] * 400_000}).encode()

    async def go():
        await decoder.parse(ordinary(1, 10 << 10), 7, DEFAULT_SHAPE)  # the child is up
        task = asyncio.create_task(decoder.parse(slow, 7, DEFAULT_SHAPE))
        await asyncio.sleep(0.005)  # sent, being parsed
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await decoder.parse(ordinary(4, 300 << 10), 7, DEFAULT_SHAPE)

    assert run(go()) == parse_frame(ordinary(4, 300 << 10), 7)
    assert decoder.stats.children_started == 2
