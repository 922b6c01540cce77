"""The worker with SINK=kinesis (and both sinks), in-process against the emulator and a
real local upstream: frames reach the stream in order, a graceful handoff delivers
nothing twice, a takeover after a crash delivers again only what came after the dead
owner's checkpoint, with the higher fence."""

from __future__ import annotations

import asyncio
import json

import boto3
import pytest

from tests.kinesis_reading import by_connection, check_order, kinesis_env
from tests.test_worker import FAST, dead_session, eventually, running
from wsfleet.config import WorkerConfig
from wsfleet.sinks import MessagesStore, StreamSink
from wsfleet.store import ConnectionsStore, SessionsStore
from wsfleet.stream import Frame

pytestmark = pytest.mark.slow


@pytest.fixture
def env(emulator, request):
    return kinesis_env(emulator.endpoint_url, sink=getattr(request, "param", "kinesis"))


@pytest.fixture
def kinesis(emulator, env):
    return boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=env["AWS_REGION"])


def stores(emulator, env):
    ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=env["AWS_REGION"])
    conns = ConnectionsStore(ddb, env["TABLE_NAME"], state_shards=4, sessions_table_name=env["SESSIONS_TABLE_NAME"])
    return conns, SessionsStore(ddb, env["SESSIONS_TABLE_NAME"]), MessagesStore(ddb, env["MESSAGES_TABLE_NAME"])


def test_frames_reach_the_stream_in_order_and_a_graceful_handoff_delivers_none_twice(emulator, env, kinesis, upstream):
    conns, _, _ = stores(emulator, env)
    stream = env["MESSAGES_STREAM_NAME"]
    for cid in ("a", "b", "c"):
        conns.start(cid, upstream.url_for(cid))
    cfg = WorkerConfig.from_env({**env, **FAST})
    assert cfg.sinks == ("kinesis",)

    def delivered(n: int):
        got = by_connection(kinesis, stream)
        return got if all(len(got.get(c, [])) >= n for c in ("a", "b", "c")) else None

    async def scenario():
        async with running(cfg, "w1") as worker:
            await eventually(lambda: delivered(10), what="10 records each")
            assert worker.counters.total("RecordsResent") == 0
        first = {c: conns.get(c)["last_seq"] for c in ("a", "b", "c")}
        async with running(cfg, "w2"):
            await eventually(lambda: all(conns.get(c)["lease_owner"] == "w2" for c in ("a", "b", "c")), what="w2 holds")
            await eventually(lambda: delivered(20), what="10 more each")
        return first

    first = asyncio.run(scenario())
    got = by_connection(kinesis, stream)
    for cid in ("a", "b", "c"):
        recs = got[cid]
        seqs = [r.seq for r in recs]
        assert seqs == list(range(1, len(seqs) + 1)), f"{cid}: gap or duplicate after a graceful handoff: {seqs}"
        check_order(recs)
        assert {r.worker_id for r in recs if r.seq <= first[cid]} == {"w1"}
        assert {r.worker_id for r in recs if r.seq > first[cid]} == {"w2"}
        expected = upstream.expected_data(cid)
        assert all(r.has_data and json.dumps(r.data, separators=(",", ":")) == expected[r.seq] for r in recs)
        assert conns.get(cid)["last_seq"] == seqs[-1]  # the release's checkpoint: what the stream acknowledged
        item = conns.get(cid)  # counted once each, by two owners' checkpoints
        assert (item["frames"], item["bytes"]) == (len(seqs), sum(len(expected[s].encode()) for s in seqs))


@pytest.mark.parametrize("env", ["dynamodb,kinesis"], indirect=True)
def test_a_takeover_after_a_crash_delivers_again_from_the_checkpoint_with_the_higher_fence(emulator, env, kinesis, upstream):
    conns, sessions, msgs = stores(emulator, env)
    stream = env["MESSAGES_STREAM_NAME"]
    cfg = WorkerConfig.from_env({**env, **FAST})
    assert cfg.sinks == ("dynamodb", "kinesis")
    conns.start("a", upstream.url_for("a"))
    dead_session(sessions, conns, "dead#1", "a", lease_ms=cfg.lease_ms)
    for _ in range(40):
        upstream.publish("a", {"v": 1})
    # The dead owner checkpointed 10 and had put 1..30 on the stream and in the table.
    conns.checkpoint("a", session_id="dead#1", fence_token=1, last_seq=10)
    dead = [Frame(s, '{"v":1}', 1) for s in range(1, 31)]
    StreamSink(kinesis, stream).put_many([("a", 1, f) for f in dead], worker_id="dead")
    msgs.put("a", dead, fence_token=1, worker_id="dead")

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: "a" in worker.holdings.runners, timeout=cfg.lease_ms / 1000 + 5, what="takeover")
            await eventually(lambda: len(by_connection(kinesis, stream).get("a", [])) >= 30 + 35, what="frames past the crash")

    asyncio.run(scenario())
    recs = by_connection(kinesis, stream)["a"]
    check_order(recs)
    twice = sorted({r.seq for r in recs if r.fence_token == 2} & {r.seq for r in recs if r.fence_token == 1})
    assert twice == list(range(11, 31))  # again: only what came after the checkpoint, at fence 2
    assert upstream.sockets("a")[0].from_seq == 11
    table = [row["sk"] for row in msgs.read_all("a")]
    assert table == list(range(1, len(table) + 1)) and len(table) >= 30
    assert all(row["fence_token"] == 2 for row in msgs.read_all("a") if row["sk"] > 10)  # rewritten by the new owner
    item = conns.get("a")  # 11..30 delivered twice, counted once (the bare checkpoint at 10 counted nothing)
    data = [len(row["message_data"].encode()) for row in msgs.read_all("a") if 10 < row["sk"] <= item["last_seq"]]
    assert (item["frames"], item["bytes"]) == (len(data), sum(data))
