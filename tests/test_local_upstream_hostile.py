"""The local upstream's hostile kinds that are not about one frame: a peer faster than the
store (``firehose=``) and a slow handshake (``slow_handshake=``), with a plain client."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import pytest
from websockets.asyncio.client import connect
from websockets.protocol import State

from sim.upstream import Kind, Upstream, feed
from sim.upstream.books import Stream
from sim.upstream.kinds import BadRequest, firehose_data, parse_request

pytestmark = pytest.mark.timeout(30)


def run(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 20))

    wrapper.__name__ = test.__name__
    return wrapper


async def until(predicate: Callable[[], Any], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_firehose_and_slow_handshake_parse_and_refuse_in_a_sentence():
    assert parse_request("/streams/a?firehose=500")[1] == Kind(firehose=500.0)
    assert parse_request("/streams/a?slow_handshake=2.5")[1] == Kind(slow_handshake=2.5)
    assert Kind(firehose=500, slow_handshake=3).text == "firehose=500&slow_handshake=3"
    for bad in ("firehose=0", "firehose=x", "firehose=1e9", "slow_handshake=0", "slow_handshake=nan",
                "slow_handshake=1e9"):
        with pytest.raises(BadRequest) as error:
            parse_request("/streams/a?" + bad)
        assert str(error.value)


@run
async def test_a_firehose_sends_its_own_frames_from_from_seq_as_fast_as_read():
    async with Upstream(rate=None) as up:
        up.publish("f")  # the stream's own frame: a firehose socket is never sent it
        url = up.url_for("f") + "?from_seq=5&firehose=5000"
        async with connect(url, compression=None, close_timeout=0.5) as ws:  # unread frames: no close handshake
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(300)]
            assert [f["seq"] for f in frames] == list(range(5, 305))
            assert all(f["data"] == firehose_data("f", f["seq"]) for f in frames)
        assert up.produced("f") == 1 and up.frames("f") == {1: up.frames("f")[1]}  # the books: the stream's frame only
        [record] = up.sockets("f")
        assert record.kind.firehose == 5000 and record.first_seq_sent == 5


@run
async def test_a_slow_handshake_holds_the_upgrade_so_a_short_open_timeout_gives_up_and_a_long_one_connects():
    async with Upstream(rate=None) as up:
        up.publish("s")
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            async with connect(up.url_for("s") + "?slow_handshake=60", compression=None, open_timeout=0.5):
                pass
        assert time.monotonic() - began < 5
        await until(lambda: up.held_handshakes("s") == (1, 1))  # our close was seen during the hold
        assert up.sockets("s") == []
        began = time.monotonic()
        async with connect(up.url_for("s") + "?slow_handshake=0.5", compression=None, open_timeout=5) as ws:
            assert time.monotonic() - began >= 0.5
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["seq"] == 1
        assert up.held_handshakes("s") == (2, 1) and up.stats()["held_handshakes"]["s"] == {"held": 2, "gave_up": 1}


class _Transport:
    """What the firehose asks of a transport: its unsent bytes, and whether it closed."""

    def __init__(self, unsent: int, ticks: int) -> None:
        self.unsent, self.ticks, self.written = unsent, ticks, 0

    def is_closing(self) -> bool:
        self.ticks -= 1
        return self.ticks < 0

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def write(self, data: bytes) -> None:
        self.written += len(data)


@pytest.mark.parametrize("unsent, writes", [(0, True), (feed.FLOOD_UNSENT_BYTES, False)])
def test_a_firehose_writes_nothing_while_its_unsent_bytes_are_at_the_mark(unsent, writes):
    transport = _Transport(unsent, ticks=10)
    ws, record = SimpleNamespace(transport=transport, state=State.OPEN), SimpleNamespace(from_seq=1, frames_sent=0, first_seq_sent=None)
    asyncio.run(feed.firehose(ws, Stream("f", None), record, 100_000))
    assert (transport.written > 0) is writes and (record.frames_sent > 0) is writes
