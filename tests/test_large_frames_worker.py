"""Large frames through the whole worker: a real local upstream sends them, the worker
(in-process, its own AWS clients) stores them through S3 and the messages table of the
emulator; crashes are a dead session that left its writes behind, as in test_worker.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import urllib.request

import pytest

from tests import test_objects
from tests.test_objects import keys
from tests.test_router import Api
from tests.test_router_messages import messages_event
from tests.test_worker import config, dead_session, eventually, running
from wsfleet import metrics_names as names
from wsfleet import schema
from sim.upstream import ThreadedUpstream
from wsfleet.stream import Frame

pytestmark = pytest.mark.slow

s3 = test_objects.s3  # the fixtures: a client of the emulator's S3, the messages bucket's store
objects = test_objects.objects


@pytest.fixture
def upstream():
    """Frames only from publish(): each test says exactly what the upstream holds."""
    with ThreadedUpstream(rate=None) as up:
        yield up


def compact(data: object) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def blob(size: int, seq: int) -> dict:
    return {"seq_was": seq, "text": "ü€" + "y" * size}


def test_a_500_kb_and_a_20_mb_frame_are_stored_whole_and_read_back_byte_for_byte(aws_env, stores, s3, objects, upstream, ddb, sqs):
    conns, msgs = stores
    data = {1: {"v": 1}, 2: blob(500_000, 2), 3: {"v": 3}, 4: blob(20 * 1024 * 1024, 4), 5: {"v": 5}}
    for seq, d in data.items():
        assert upstream.publish("a", d) == seq
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env)

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: len(msgs.read_all("a")) == 5, timeout=60, what="five stored")
            # Attempts, not uploads: on a loaded machine the 20 MB put can be refused before it
            # is sent (the lease's deadline passed while the loop was busy) and tried again.
            uploads_before_replay = worker.aws.requests["s3.PutObject"]
            assert uploads_before_replay >= 2
            # A reconnect whose upstream replays from before the large frames: the replays
            # are dropped, nothing is uploaded again.
            upstream.replay_from("a", -4)
            upstream.drop("a")
            await eventually(lambda: len(upstream.sockets("a")) == 2, timeout=30, what="the reconnect")
            upstream.publish("a", {"v": 6})
            await eventually(lambda: len(msgs.read_all("a")) == 6, timeout=30, what="the frame after the replay")
        # Read once it has stopped: a count is added after its batch is stored.
        assert worker.counters.total(names.LARGE_FRAMES) == 2
        assert worker.aws.requests["s3.PutObject"] == uploads_before_replay

    asyncio.run(scenario())
    rows = {r["sk"]: r for r in msgs.read_all("a")}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for seq in (2, 4):
        assert schema.MESSAGE_DATA not in rows[seq]
        assert rows[seq][schema.DATA_REF] == f"s3://{objects.bucket}/{schema.message_object_key('a', seq)}"
        assert rows[seq][schema.DATA_BYTES] == len(compact(data[seq]).encode())
        assert objects.data_of(rows[seq]) == compact(data[seq])  # size and SHA-256 checked too
    assert rows[1][schema.MESSAGE_DATA] == compact(data[1])
    assert keys(s3, objects.bucket) == [schema.message_object_key("a", 2), schema.message_object_key("a", 4)]
    assert conns.get("a")["last_seq"] == 6

    # And as a user reads them: the read API's page, each large one through its data_url.
    api = Api(aws_env, ddb, sqs)
    status, page = api.call(messages_event("a"))
    assert status == 200 and [e["seq"] for e in page["messages"]] == [1, 2, 3, 4, 5, 6]
    for entry in page["messages"]:
        sent = compact(data[entry["seq"]]).encode() if entry["seq"] in data else compact({"v": 6}).encode()
        if entry["seq"] in (2, 4):
            with urllib.request.urlopen(entry["data_url"], timeout=60) as resp:
                body = resp.read()
            assert body == sent and entry["data_bytes"] == len(sent)
            assert entry["data_sha256"] == hashlib.sha256(sent).hexdigest()
        else:
            assert compact(entry["data"]).encode() == sent


def test_after_a_crash_around_a_large_frame_the_new_owner_resumes_with_no_gap_and_no_double(
    aws_env, stores, sessions, s3, objects, upstream
):
    """Two connections whose owner died at a large frame (seq 3, 600 KB): on "obj" after
    its object was stored but before its item; on "item" after both. The taker resumes
    "obj" at the large frame, rewriting the same object, and "item" after it."""
    conns, msgs = stores
    cfg = config(aws_env)
    data = {cid: {1: {"v": 1}, 2: {"v": 2}, 3: blob(600_000, 3), 4: {"v": 4}, 5: {"v": 5}} for cid in ("obj", "item")}
    for cid in data:
        for d in data[cid].values():
            upstream.publish(cid, d)
        conns.start(cid, upstream.url_for(cid))
    dead_session(sessions, conns, "dead#1", *data, lease_ms=cfg.lease_ms)
    for cid, items in (("obj", [1, 2]), ("item", [1, 2, 3])):
        conns.checkpoint(cid, session_id="dead#1", fence_token=1, last_seq=1)
        stored = objects.put(cid, 3, compact(data[cid][3]))  # the dead owner's upload
        frames = [Frame(s, compact(data[cid][s]), 1) for s in items]
        msgs.put_many([(cid, 1, f) for f in frames], worker_id="dead", objects={(cid, 3): stored})

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: set(data) <= set(worker.holdings.runners), timeout=cfg.lease_ms / 1000 + 10, what="takeover")
            await eventually(lambda: all(len(msgs.read_all(c)) == 5 for c in data), timeout=30, what="all five, each")
            assert worker.aws.requests["s3.PutObject"] == 1  # "obj"'s large frame, again; not "item"'s

    asyncio.run(scenario())
    assert upstream.sockets("obj")[0].from_seq == 3 and upstream.sockets("item")[0].from_seq == 4
    for cid in data:
        rows = {r["sk"]: r for r in msgs.read_all(cid)}
        assert sorted(rows) == [1, 2, 3, 4, 5]
        assert objects.data_of(rows[3]) == compact(data[cid][3])
        assert [objects.data_of(rows[s]) for s in (1, 2, 4, 5)] == [compact(data[cid][s]) for s in (1, 2, 4, 5)]
    assert keys(s3, objects.bucket) == [schema.message_object_key("item", 3), schema.message_object_key("obj", 3)]
    assert msgs.read_all("obj")[2]["fence_token"] == 2  # written by the taker
    assert msgs.read_all("item")[2]["fence_token"] == 1  # the dead owner's, left alone
