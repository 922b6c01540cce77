"""The local upstream: protocol (CONTRACT.md section 3), books and fault injection."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from typing import Any, Awaitable, Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK, InvalidStatus
from websockets.sync.client import connect as sync_connect

from sim.upstream import NO_SEQ, NOT_JSON, ThreadedUpstream, Upstream, stream_name, stream_path

pytestmark = pytest.mark.timeout(30)


def run(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run an async test body in a fresh event loop, with a deadline."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 20))

    wrapper.__name__ = test.__name__
    return wrapper


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def receive(ws: ClientConnection, count: int) -> list[Any]:
    """The next ``count`` frames, JSON-decoded where possible."""
    out = []
    for _ in range(count):
        text = await asyncio.wait_for(ws.recv(), 5)
        try:
            out.append(json.loads(text))
        except ValueError:
            out.append(text)
    return out


def seqs(frames: list[Any]) -> list[Any]:
    return [f["seq"] if isinstance(f, dict) and "seq" in f else f for f in frames]


def test_stream_names_round_trip_through_paths():
    assert stream_name("/streams/a%20b?from_seq=3") == "a b"
    assert stream_path("a b") == "/streams/a%20b"
    assert stream_name("/other/x") == "/other/x"
    assert stream_path("/other/x") == "/other/x"


@run
async def test_replay_from_seq_then_live_without_gap_or_duplicate():
    async with Upstream(rate=None) as up:
        for _ in range(10):
            up.publish("s")
        async with connect(up.url_for("s") + "?from_seq=4", compression=None) as ws:
            replayed = await receive(ws, 7)
            for _ in range(5):
                up.publish("s")
            live = await receive(ws, 5)
        assert seqs(replayed + live) == list(range(4, 16))
        assert [f["data"] for f in replayed[:1]] == [{"stream": "s", "t": replayed[0]["data"]["t"], "v": 4}]


@run
async def test_missing_from_seq_starts_at_one_and_beyond_head_waits_for_new_frames():
    async with Upstream(rate=None) as up:
        up.publish("s")
        up.publish("s")
        async with connect(up.url_for("s"), compression=None) as ws:
            assert seqs(await receive(ws, 2)) == [1, 2]
        async with connect(up.url_for("s") + "?from_seq=5", compression=None) as ws:
            pending = asyncio.ensure_future(ws.recv())
            for _ in range(3):
                up.publish("s")
                await asyncio.sleep(0)
            assert not pending.done()
            up.publish("s")
            assert json.loads(await asyncio.wait_for(pending, 5))["seq"] == 5


@run
async def test_stream_produces_at_the_rate_with_nobody_connected_once_created():
    async with Upstream(rate=100) as up:
        up.create_stream("busy")
        await eventually(lambda: up.produced("busy") >= 20)
        assert up.produced("never-asked") == 0 and "never-asked" not in up.streams()
        async with connect(up.url_for("busy"), compression=None) as ws:
            frames = await receive(ws, up.produced("busy") + 10)  # replay, then live
        assert seqs(frames) == list(range(1, len(frames) + 1))


@run
async def test_retention_cap_starts_an_old_from_seq_at_the_oldest_retained_frame():
    async with Upstream(rate=None, history=3) as up:
        for _ in range(10):
            up.publish("s")
        async with connect(up.url_for("s") + "?from_seq=2", compression=None) as ws:
            assert seqs(await receive(ws, 3)) == [8, 9, 10]
        assert up.totals("s").oldest_retained == 8
        assert up.sockets("s")[0].first_seq_sent == 8


@run
async def test_invalid_from_seq_is_refused_with_http_400():
    async with Upstream(rate=None) as up:
        for bad in ("0", "x"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(up.url_for("s") + f"?from_seq={bad}", compression=None):
                    pass
            assert refused.value.response.status_code == 400


@run
async def test_two_sockets_open_on_one_stream_are_recorded_as_an_overlap():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("solo"), compression=None):
            pass
        async with connect(up.url_for("solo"), compression=None):
            pass
        await eventually(lambda: not up.open_sockets("solo"))
        assert up.overlaps() == [] and up.max_concurrent("solo") == 1

        first = await connect(up.url_for("s"), compression=None)
        second = await connect(up.url_for("s"), compression=None)
        await eventually(lambda: len(up.open_sockets("s")) == 2)
        [overlap] = up.overlaps("s")
        assert overlap.socket_ids == tuple(r.id for r in up.sockets("s"))
        assert overlap.ended_at is None
        await second.close()
        await eventually(lambda: up.overlaps("s")[0].ended_at is not None)
        assert up.max_concurrent("s") == 2 and len(up.open_sockets("s")) == 1
        [closed] = [r for r in up.sockets("s") if r.closed_at is not None]
        assert overlap.started_at <= closed.closed_at == up.overlaps("s")[0].ended_at
        await first.close()


@run
async def test_abrupt_drop_closes_the_streams_sockets_without_a_closing_handshake():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None) as ws, connect(
            up.url_for("other"), compression=None
        ) as bystander:
            await eventually(lambda: len(up.open_sockets("s")) == 1)
            assert up.drop("s") == 1
            with pytest.raises(ConnectionClosedError):
                await asyncio.wait_for(ws.recv(), 5)
            await eventually(lambda: not up.open_sockets("s"))
            [record] = up.sockets("s")
            assert record.dropped and record.closed_at is not None
            assert len(up.open_sockets("other")) == 1
            up.publish("other")
            assert seqs(await receive(bystander, 1)) == [1]


@run
async def test_graceful_drop_closes_with_going_away():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None) as ws:
            await eventually(lambda: len(up.open_sockets("s")) == 1)
            up.drop("s", abrupt=False)
            with pytest.raises(ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1001


@run
async def test_injected_malformed_frames_arrive_once_between_the_frames_around_them():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None) as live:
            up.publish("s")
            up.publish("s")
            up.inject("s", NOT_JSON)
            up.inject("s", NO_SEQ)
            up.publish("s")
            assert seqs(await receive(live, 5)) == [1, 2, NOT_JSON, {"data": 1}, 3]
        async with connect(up.url_for("s") + "?from_seq=2", compression=None) as replay:
            assert seqs(await receive(replay, 4)) == [2, NOT_JSON, {"data": 1}, 3]
        async with connect(up.url_for("s") + "?from_seq=4", compression=None) as past:
            up.publish("s")
            assert seqs(await receive(past, 1)) == [4]
        assert up.totals("s").injected == 2


@run
async def test_injected_bytes_go_out_as_they_are_in_a_text_frame_even_when_not_utf8():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None) as ws:
            up.inject("s", b'{"seq": 1, "data": "\xc3\xa9"}')
            up.inject("s", b'{"seq": 2, "data": "\xff"}')
            assert await asyncio.wait_for(ws.recv(), 5) == '{"seq": 1, "data": "é"}'  # a text frame: decoded
            assert await asyncio.wait_for(ws.recv(decode=False), 5) == b'{"seq": 2, "data": "\xff"}'


@run
async def test_a_raw_frame_takes_the_next_seq_and_is_replayed_as_sent():
    async with Upstream(rate=None) as up:
        up.publish("s")
        assert up.publish_raw("s", lambda seq: b'{"seq": %d, "data": "\xff"}' % seq) == 2
        up.publish("s")
        async with connect(up.url_for("s") + "?from_seq=2", compression=None) as ws:
            assert await asyncio.wait_for(ws.recv(decode=False), 5) == b'{"seq": 2, "data": "\xff"}'
            assert seqs(await receive(ws, 1)) == [3]
        assert up.frames("s")[2] == b'{"seq": 2, "data": "\xff"}' and up.produced("s") == 3


@run
async def test_skipped_seqs_never_exist_and_no_socket_is_sent_them():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None) as live:
            up.publish("s")
            assert up.skip("s", 3) == 4
            up.publish("s")
            assert seqs(await receive(live, 2)) == [1, 5]
        async with connect(up.url_for("s") + "?from_seq=2", compression=None) as replay:
            assert seqs(await receive(replay, 1)) == [5]
        assert sorted(up.frames("s")) == [1, 5] and up.produced("s") == 5
        assert [(r.first_seq_sent, r.last_seq_sent, r.frames_sent) for r in up.sockets("s")] == [(1, 5, 2), (5, 5, 1)]


@run
async def test_the_next_socket_replays_from_another_seq_than_asked_and_its_record_says_so():
    async with Upstream(rate=None) as up:
        for _ in range(10):
            up.publish("s")
        up.replay_from("s", -3)
        async with connect(up.url_for("s") + "?from_seq=6", compression=None) as early:
            assert seqs(await receive(early, 2)) == [3, 4]
        up.replay_from("s", 2)
        async with connect(up.url_for("s") + "?from_seq=6", compression=None) as late:
            assert seqs(await receive(late, 1)) == [8]
        async with connect(up.url_for("s") + "?from_seq=6", compression=None) as honest:  # once only
            assert seqs(await receive(honest, 1)) == [6]
        assert [(r.from_seq, r.offset, r.first_seq_sent) for r in up.sockets("s")] == [(6, -3, 3), (6, 2, 8), (6, 0, 6)]


@run
async def test_a_stalled_stream_sends_nothing_and_answers_no_ping_then_delivers_its_backlog_in_order():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None) as ws, connect(up.url_for("other"), compression=None) as bystander:
            up.publish("s")
            assert seqs(await receive(ws, 1)) == [1]
            assert up.stall("s") == 1
            for _ in range(3):
                up.publish("s")
            up.publish("other")
            pong = await ws.ping()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.3)
            assert not pong.done()  # not even a pong: open but silent
            assert seqs(await receive(bystander, 1)) == [1]  # other streams flow
            assert up.totals("s").sent_head == 1

            up.stall("s", False)
            assert seqs(await receive(ws, 3)) == [2, 3, 4]
            await asyncio.wait_for(pong, 5)
            assert up.totals("s").sent_head == 4


@run
async def test_a_client_closing_its_socket_on_a_stalled_stream_is_booked_closed_when_it_does():
    async with Upstream(rate=None) as up:
        ws = await connect(up.url_for("s"), compression=None, close_timeout=0.2)
        await eventually(lambda: len(up.open_sockets("s")) == 1)
        up.stall("s")
        await ws.close()  # no closing handshake comes back: the stream reads nothing
        closed_at = time.time()
        await eventually(lambda: not up.open_sockets("s"), timeout=2)
        [record] = up.sockets("s")
        assert record.closed_at - closed_at < 1.0
        up.stall("s", False)


@run
async def test_a_socket_opened_on_a_stalled_stream_is_silent_too():
    async with Upstream(rate=None) as up:
        up.publish("s")
        up.stall("s")
        async with connect(up.url_for("s"), compression=None) as ws:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.3)
            up.stall("s", False)
            assert seqs(await receive(ws, 1)) == [1]


@run
async def test_a_slowed_stream_sends_one_frame_per_delay_and_catches_up_as_soon_as_it_is_switched_off():
    async with Upstream(rate=None) as up:
        for _ in range(6):
            up.publish("s")
        up.slow("s", 0.4)
        async with connect(up.url_for("s"), compression=None) as ws:
            started = time.monotonic()
            assert seqs(await receive(ws, 3)) == [1, 2, 3]
            assert time.monotonic() - started >= 0.75  # two delays between three frames
            up.slow("s", 0)
            started = time.monotonic()
            assert seqs(await receive(ws, 3)) == [4, 5, 6]
            assert time.monotonic() - started < 0.3  # no waiting out the last delay


@run
async def test_an_oversized_frame_goes_once_to_the_sockets_open_now_and_takes_no_seq():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("s"), compression=None, max_size=None) as ws:
            await eventually(lambda: len(up.open_sockets("s")) == 1)
            assert up.oversize("s", 100_000) == 1
            up.publish("s")
            big, first = await receive(ws, 2)
            assert len(big) == 100_000 and first["seq"] == 1
            assert up.sockets("s")[0].oversized_sent == 1
        async with connect(up.url_for("s"), compression=None) as later:
            assert seqs(await receive(later, 1)) == [1]  # never replayed
        async with connect(up.url_for("s"), compression=None, max_size=1000) as small:
            assert seqs(await receive(small, 1)) == [1]
            up.oversize("s", 2000)
            with pytest.raises(ConnectionClosedError) as closed:
                await asyncio.wait_for(small.recv(), 5)
            assert closed.value.sent.code == 1009  # "message too big": the reader gives up the socket


@run
async def test_two_hundred_streams_with_one_socket_each_all_flow():
    async with Upstream(rate=20) as up:
        names = [f"s{i}" for i in range(200)]
        sockets = await asyncio.gather(*(connect(up.url_for(n), compression=None) for n in names))
        try:
            received = await asyncio.gather(*(receive(ws, 3) for ws in sockets))
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))
        assert all(seqs(frames) == [1, 2, 3] for frames in received)
        assert all(f["data"]["stream"] == n for n, frames in zip(names, received, strict=True) for f in frames)
        assert up.overlaps() == []
        assert {up.max_concurrent(n) for n in names} == {1}


@run
async def test_stats_endpoint_answers_json_on_the_websocket_port():
    async with Upstream(rate=None) as up:
        up.publish("s")
        async with connect(up.url_for("s"), compression=None) as ws:
            await receive(ws, 1)
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(up.stats_url, timeout=5).read())
        stats = json.loads(body)
        assert stats["streams"]["s"]["produced"] == 1
        assert stats["streams"]["s"]["sockets_opened"] == 1
        assert stats["overlaps"] == []


def test_threaded_upstream_serves_synchronous_callers():
    with ThreadedUpstream(rate=None) as up:
        up.publish("s")
        with sync_connect(up.url_for("s"), compression=None) as ws:
            assert json.loads(ws.recv(timeout=5))["seq"] == 1
            assert len(up.open_sockets("s")) == 1
        deadline = time.monotonic() + 5
        while up.open_sockets("s"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert up.totals("s").frames_sent == 1


@pytest.mark.slow
def test_process_prints_ready_and_serves_streams(python_env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.upstream", "--port", "0", "--rate", "50"],
        env=python_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("READY ws://127.0.0.1:")
        url = line.split()[1]
        with sync_connect(url + "/streams/p", compression=None) as ws:
            assert [json.loads(ws.recv(timeout=5))["seq"] for _ in range(3)] == [1, 2, 3]
        stats = json.loads(urllib.request.urlopen(url.replace("ws:", "http:") + "/_stats", timeout=5).read())
        assert stats["streams"]["p"]["produced"] >= 3
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
