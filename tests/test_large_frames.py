"""Large frames: data over an item's size goes to an S3 object before its item is written.

The writer with the worker's own AWS clients (``wsfleet.aws.Aws``, deadline checks and
all) against the emulator's DynamoDB and S3. Faults are real ones: an upload held in
its thread by a botocore hook on the real client (a slow network), a bucket that does
not exist yet (AccessDenied or NoSuchBucket during a deploy), a deadline that passes
while an upload is held. The worker end to end, with a real upstream, crashes and
takeovers, is in ``test_large_frames_worker.py``."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest

from tests.test_objects import keys
from tests.test_worker import eventually
from wsfleet import clock, schema
from wsfleet import metrics_names as names
from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.sinks import MessagesStore, ObjectsStore
from wsfleet.stream import Frame, parse_frame
from wsfleet.worker.retry import LeaseExpired
from wsfleet.worker.writer import Writer


def frame_of(seq: int, data: object) -> Frame:
    """The frame the worker's parser makes of ``{"seq": seq, "data": data}``."""
    frame = parse_frame(json.dumps({"seq": seq, "data": data}).encode(), 1_000)
    assert isinstance(frame, Frame) and not frame.is_marker
    return frame


def blob(size: int, tag: str = "") -> dict:
    return {"tag": tag, "blob": "é" + "x" * size}


class Rig:
    def __init__(self, aws_env: dict[str, str], *, bucket: str | None = None, **options) -> None:
        self.aws = Aws(WorkerConfig.from_env(aws_env), threads=8)
        self.bucket = bucket or aws_env["MESSAGES_BUCKET_NAME"]
        self.msgs = MessagesStore(self.aws.dynamodb_writes, aws_env["MESSAGES_TABLE_NAME"])
        self.objects = ObjectsStore(self.aws.s3, self.bucket)
        self.counters = Counters()
        self.deadline = clock.now() + 60
        self.stored: dict[str, int] = {}
        self.writer = Writer(
            messages=self.msgs,
            objects=self.objects,
            call=self.aws.call,
            worker_id="w1",
            counters=self.counters,
            log=JsonLogger(),
            flush_interval_s=0.02,
            **options,
        )
        self.held = threading.Event()  # an upload is being held
        self.release = threading.Event()
        self.hold_next = False

    def open(self, *cids: str) -> None:
        for cid in cids:
            self.stored[cid] = 0
            self.writer.open(
                cid, fence_token=1, deadline=lambda: self.deadline, on_stored=lambda s, n, c=cid: self.stored.__setitem__(c, s)
            )

    def hold_uploads(self) -> None:
        """Hold the next PutObject in its thread until :attr:`release` is set, after the
        deadline check of botocore's before-send (so the socket check still runs)."""
        self.hold_next = True

        def hold(request=None, **_) -> None:
            if self.hold_next and request is not None and request.method == "PUT":
                self.hold_next = False
                self.held.set()
                self.release.wait(60)

        self.aws.s3.meta.events.register("before-send.s3", hold)

    def keys(self) -> list[str]:
        return keys(self.aws.s3, self.bucket)

    def rows(self, cid: str) -> dict[int, dict]:
        return {r["sk"]: r for r in self.msgs.read_all(cid)}

    def close(self) -> None:
        self.release.set()
        self.aws.close()


@pytest.fixture
def rig(aws_env):
    r = Rig(aws_env)
    yield r
    r.close()


async def until(predicate, what: str) -> None:
    await eventually(predicate, timeout=30.0, what=what)


def test_a_large_frame_is_stored_as_an_object_before_its_item_and_reads_back_byte_for_byte(rig):
    big = frame_of(2, blob(500_000))

    async def scenario():
        rig.open("c")
        task = asyncio.create_task(rig.writer.run())
        for f in (frame_of(1, {"v": 1}), big, frame_of(3, {"v": 3})):
            await rig.writer.put("c", f)
        await until(lambda: rig.stored["c"] == 3, what="all three stored")
        task.cancel()

    asyncio.run(scenario())
    rows = rig.rows("c")
    assert sorted(rows) == [1, 2, 3] and schema.MESSAGE_DATA not in rows[2]
    assert rows[2][schema.DATA_REF] == f"s3://{rig.bucket}/messages/c/00000000000000000002"
    assert rows[2][schema.DATA_BYTES] == big.data_bytes == len(big.data_json.encode())
    assert rig.objects.data_of(rows[2]) == big.data_json == json.dumps(blob(500_000), separators=(",", ":"), ensure_ascii=False)
    assert rig.keys() == ["messages/c/00000000000000000002"]
    assert rig.counters.total(names.LARGE_FRAMES) == 1 and rig.counters.total(names.MESSAGES_STORED) == 3


def test_a_held_upload_holds_its_own_connections_later_frames_but_not_other_connections(rig):
    rig.hold_uploads()

    async def scenario():
        rig.open("big", "small")
        task = asyncio.create_task(rig.writer.run())
        for f in (frame_of(1, {"v": 1}), frame_of(2, blob(400_000)), frame_of(3, {"v": 3})):
            await rig.writer.put("big", f)
        await until(rig.held.is_set, what="the upload held")
        for seq in range(1, 31):
            await rig.writer.put("small", frame_of(seq, {"v": seq}))
        await until(lambda: rig.stored["small"] == 30, what="the other connection's frames")
        # Meanwhile "big" got only what is ahead of its large frame: its order holds.
        assert rig.stored["big"] == 1 and sorted(rig.rows("big")) == [1]
        assert rig.writer.stats()["uploading"] == 1
        rig.release.set()
        await until(lambda: rig.stored["big"] == 3, what="the large frame and the one after it")
        task.cancel()

    asyncio.run(scenario())
    assert sorted(rig.rows("big")) == [1, 2, 3] and sorted(rig.rows("small")) == list(range(1, 31))


def test_an_upload_the_bucket_refuses_for_a_while_is_retried_and_nothing_is_dropped(aws_env):
    # A bucket that does not exist yet: NoSuchBucket, as AccessDenied during a deploy,
    # is no transient fault; it is retried with backoff until it goes through.
    rig = Rig(aws_env, bucket=f"late-{uuid.uuid4().hex[:8]}")
    big = frame_of(1, blob(400_000))
    try:

        async def scenario():
            rig.open("c")
            task = asyncio.create_task(rig.writer.run())
            await rig.writer.put("c", big)
            await rig.writer.put("c", frame_of(2, {"v": 2}))
            await until(lambda: rig.counters.total(names.LOOP_ERRORS) >= 2, what="two refusals")
            assert rig.rows("c") == {} and rig.writer.stats()["pending"] == 2
            await asyncio.to_thread(rig.aws.s3.create_bucket, Bucket=rig.bucket)
            await until(lambda: rig.stored["c"] == 2, what="stored once the bucket is there")
            task.cancel()

        asyncio.run(scenario())
        rows = rig.rows("c")
        assert sorted(rows) == [1, 2] and rig.objects.data_of(rows[1]) == big.data_json
        assert rig.counters.total(names.FRAMES_DROPPED) == 0
    finally:
        rig.close()


def test_cancelled_mid_upload_the_frames_stay_queued_and_the_next_run_stores_them_once(rig):
    rig.hold_uploads()
    big = frame_of(1, blob(400_000))

    async def scenario():
        rig.open("c")
        task = asyncio.create_task(rig.writer.run())
        await rig.writer.put("c", big)
        await rig.writer.put("c", frame_of(2, {"v": 2}))
        await until(rig.held.is_set, what="the upload held")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: rig.writer.stats()["uploading"] == 0, what="the upload cancelled")
        assert rig.writer.stats()["pending"] == 2 and rig.rows("c") == {}
        rig.release.set()  # the cancelled upload's thread goes on and may land: harmless
        task = asyncio.create_task(rig.writer.run())
        await until(lambda: rig.stored["c"] == 2, what="stored by the next run")
        task.cancel()

    asyncio.run(scenario())
    rows = rig.rows("c")
    assert sorted(rows) == [1, 2] and rig.objects.data_of(rows[1]) == big.data_json
    assert rig.keys() == ["messages/c/00000000000000000001"]  # one object, however many uploads


def test_past_its_deadline_an_upload_is_refused_at_the_socket_and_goes_on_only_if_the_deadline_moves_on(rig):
    rig.hold_uploads()
    answered = threading.Event()  # the held request is over, whatever became of it
    rig.aws.s3.meta.events.register("needs-retry.s3", lambda **_: answered.set())

    async def scenario():
        rig.deadline = clock.now() + 1.0  # and no renewal moves it: it passes while the upload is held
        rig.open("c")
        task = asyncio.create_task(rig.writer.run())
        await rig.writer.put("c", frame_of(1, blob(400_000)))
        await until(rig.held.is_set, what="the upload held")
        with pytest.raises(LeaseExpired):
            await rig.writer.flush("c")
        rig.release.set()  # the held request now meets the socket check
        await until(answered.is_set, what="the held request refused")
        assert rig.keys() == [] and rig.rows("c") == {}
        assert rig.writer.stats()["pending"] == 1  # still queued, never dropped on a guess
        rig.deadline = clock.now() + 60  # a renewal answered late after all: it is ours again
        await until(lambda: rig.stored["c"] == 1, what="stored once the deadline moved on")
        task.cancel()

    asyncio.run(scenario())
    assert rig.keys() == ["messages/c/00000000000000000001"] and sorted(rig.rows("c")) == [1]


def test_data_over_the_frame_limit_is_stored_as_an_over_frame_limit_marker(aws_env):
    rig = Rig(aws_env, max_data_bytes=450_000)
    try:

        async def scenario():
            rig.open("c")
            task = asyncio.create_task(rig.writer.run())
            await rig.writer.put("c", frame_of(1, blob(500_000)))
            await rig.writer.put("c", frame_of(2, blob(400_000)))
            await until(lambda: rig.stored["c"] == 2, what="the marker and the next frame")
            task.cancel()

        asyncio.run(scenario())
        rows = rig.rows("c")
        assert rows[1][schema.SKIPPED] == schema.SKIPPED_OVER_FRAME_LIMIT and rows[1][schema.DATA_BYTES] > 500_000
        assert schema.DATA_REF not in rows[1] and schema.DATA_REF in rows[2]
        assert rig.keys() == ["messages/c/00000000000000000002"]
        assert rig.counters.total(names.MALFORMED_FRAMES) == 1 and rig.counters.total(names.LARGE_FRAMES) == 1
    finally:
        rig.close()
