"""The worker with feeds whose seqs it assigns (upstream ``seq: assigned``), in-process
against the local upstream: text and binary frames numbered from 1, one ``reconnect``
marker after a socket is lost, seqs reserved in the connection item before they are
used, and a takeover from a dead owner numbering past what it reserved."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from tests.test_worker import config, dead_session, seqs
from tests.test_worker_upstreams import eventually, quiet_upstream, running, start  # noqa: F401 - a fixture
from wsfleet import schema
from wsfleet.logs import JsonLogger
from wsfleet.stream import Frame
from wsfleet.worker.numbering import RESERVE_BLOCK

pytestmark = pytest.mark.slow

TEXT = {"format": "text", "seq": "assigned"}
BINARY = {"format": "binary", "seq": "assigned"}


def sent(up, cid: str) -> list[bytes]:
    frames = up.frames(cid)
    return [frames[s] for s in sorted(frames)]


def test_text_and_binary_frames_are_numbered_from_1_and_a_lost_socket_leaves_one_reconnect_marker(
    aws_env, stores, ddb, quiet_upstream  # noqa: F811
):
    conns, msgs = stores
    up = quiet_upstream
    start(conns, ddb, aws_env, "t", up.url_for("t") + "?replay=none", TEXT)
    start(conns, ddb, aws_env, "b", up.url_for("b") + "?replay=none&format=binary", BINARY)

    async def scenario():
        async with running(config(aws_env), JsonLogger()):
            await eventually(lambda: up.open_sockets("t") and up.open_sockets("b"), what="connected")
            for cid in ("t", "b"):
                for _ in range(3):
                    up.publish(cid)
            await eventually(lambda: all(len(seqs(msgs, c)) == 3 for c in ("t", "b")), what="3 stored each")
            for cid in ("t", "b"):
                up.drop(cid)
            await eventually(lambda: up.open_sockets("t") and up.open_sockets("b"), what="connected again")
            for cid in ("t", "b"):
                up.publish(cid)
            await eventually(lambda: all(seqs(msgs, c) == [1, 2, 3, 4, 5] for c in ("t", "b")), what="all stored")

    asyncio.run(scenario())
    for cid in ("t", "b"):
        rows = msgs.read_all(cid)
        assert [r.get(schema.SKIPPED) for r in rows] == [None, None, None, schema.SKIPPED_RECONNECT, None]
        data = [json.loads(r[schema.MESSAGE_DATA]) for r in rows if schema.SKIPPED not in r]
        frames = [base64.b64decode(d) for d in data] if cid == "b" else [d.encode() for d in data]
        assert frames == sent(up, cid)
        assert [r.get(schema.DATA_FORMAT) for r in rows if schema.SKIPPED not in r] == [
            schema.DATA_FORMAT_BINARY if cid == "b" else None
        ] * 4
        item = conns.get(cid)
        assert item[schema.LAST_SEQ] == 5 and item[schema.SEQ_RESERVED] >= 5  # reserved before used
        assert "from_seq" not in up.sockets(cid)[0].path  # an assigned seq means nothing to the upstream


def test_a_takeover_from_a_dead_owner_numbers_past_its_reservation_after_a_reconnect_marker(
    aws_env, stores, sessions, ddb, quiet_upstream  # noqa: F811
):
    conns, msgs = stores
    up = quiet_upstream
    start(conns, ddb, aws_env, "t", up.url_for("t") + "?replay=none", TEXT)
    cfg = config(aws_env)
    dead_session(sessions, conns, "dead#1", "t", lease_ms=cfg.lease_ms)
    # The dead owner stored 1..3 and reserved up to 40; its last checkpoint says 2.
    assert conns.checkpoint("t", session_id="dead#1", fence_token=1, last_seq=2)
    assert conns.reserve_seqs("t", session_id="dead#1", fence_token=1, upto=40)
    msgs.put("t", [Frame(s, f'"old {s}"', 1) for s in (1, 2, 3)], fence_token=1, worker_id="dead")

    async def scenario():
        async with running(cfg, JsonLogger()):
            await eventually(lambda: up.open_sockets("t"), timeout=15, what="taken")
            up.publish("t")
            up.publish("t")
            await eventually(lambda: seqs(msgs, "t")[-1:] == [43], what="stored past the reservation")

    asyncio.run(scenario())
    rows = msgs.read_all("t")
    assert [(r["sk"], r.get(schema.SKIPPED)) for r in rows] == [
        (1, None), (2, None), (3, None), (41, schema.SKIPPED_RECONNECT), (42, None), (43, None)
    ]
    assert conns.get("t")[schema.SEQ_RESERVED] == 42 + RESERVE_BLOCK - 1
