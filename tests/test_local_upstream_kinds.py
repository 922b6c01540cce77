"""The local upstream's kinds (query parameters on the stream URL), with a plain
websockets client: auth (401/403, rotation), subprotocol, subscribe, shapes, replay none,
and the books they keep (refusals per status, what each socket asked, expected data)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any, Awaitable, Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.sync.client import connect as sync_connect

from sim.upstream import FLAT, NESTED, Kind, ThreadedUpstream, Upstream
from sim.upstream.kinds import BadRequest, amplified, parse_request, parse_subscribe, stored_data

pytestmark = pytest.mark.timeout(30)
SECRET = "s3cr3t-value"


def run(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 20))

    wrapper.__name__ = test.__name__
    return wrapper


async def receive(ws: ClientConnection, count: int) -> list[Any]:
    return [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(count)]


async def refused(url: str, **kwargs: Any) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as error:
        async with connect(url, compression=None, **kwargs):
            pass
    return error.value


async def settled(ws: ClientConnection) -> None:
    """The server has processed everything sent before now (a ping's pong comes after)."""
    await asyncio.wait_for(await ws.ping(), 5)


# --- auth ------------------------------------------------------------------------


@run
async def test_auth_refuses_a_missing_header_with_401_and_a_wrong_one_with_403_and_counts_them():
    async with Upstream(rate=None, credentials=[SECRET]) as up:
        up.publish("a")
        url = up.url_for("a") + "?auth_header=X-Api-Key"
        missing = await refused(url)
        wrong = await refused(url, additional_headers={"X-Api-Key": "guess"})
        assert (missing.response.status_code, wrong.response.status_code) == (401, 403)
        for answer in (missing, wrong):
            assert b"X-Api-Key" in answer.response.body and b"guess" not in answer.response.body
        async with connect(url, compression=None, additional_headers={"x-api-key": SECRET}) as ws:
            assert [f["seq"] for f in await receive(ws, 1)] == [1]
        assert up.refusals("a") == {401: 1, 403: 1}
        assert up.totals("a").refused == 2 and up.totals("a").sockets_opened == 1
        assert up.stats()["refused"] == {"a": {"401": 1, "403": 1}}


@run
async def test_a_refused_handshake_creates_no_stream():
    async with Upstream(rate=None, credentials=[SECRET]) as up:
        await refused(up.url_for("ghost") + "?auth_header=X-Api-Key")
        assert up.streams() == [] and up.refusals("ghost") == {401: 1}


@run
async def test_rotation_revokes_the_old_credential_for_new_handshakes_and_leaves_open_sockets_open():
    async with Upstream(rate=None, credentials=["old"]) as up:
        url = up.url_for("a") + "?auth_header=Authorization"
        async with connect(url, compression=None, additional_headers={"Authorization": "old"}) as before:
            up.publish("a")
            await receive(before, 1)
            up.set_credentials(["new"])
            assert (await refused(url, additional_headers={"Authorization": "old"})).response.status_code == 403
            async with connect(url + "&from_seq=2", compression=None, additional_headers={"Authorization": "new"}) as after:
                up.publish("a")
                assert [f["seq"] for f in await receive(after, 1)] == [2]
            assert [f["seq"] for f in await receive(before, 1)] == [2]  # still open, still sent
        assert up.refusals("a") == {403: 1}


def test_threaded_upstream_rotates_credentials_too():
    with ThreadedUpstream(rate=None, credentials=["one"]) as up:
        up.publish("a")
        url = up.url_for("a") + "?auth_header=X-Key"
        with sync_connect(url, compression=None, additional_headers={"X-Key": "one"}) as ws:
            assert json.loads(ws.recv(timeout=5))["seq"] == 1
        up.set_credentials(["two"])
        with pytest.raises(InvalidStatus) as error:
            sync_connect(url, compression=None, additional_headers={"X-Key": "one"})
        assert error.value.response.status_code == 403
        with sync_connect(url, compression=None, additional_headers={"X-Key": "two"}) as ws:
            assert json.loads(ws.recv(timeout=5))["seq"] == 1
        assert up.refusals("a") == {403: 1}


# --- subprotocol -------------------------------------------------------------------


@run
async def test_subprotocol_must_be_offered_and_is_then_selected():
    async with Upstream(rate=None) as up:
        up.publish("a")
        url = up.url_for("a") + "?subprotocol=feed.v2"
        assert (await refused(url)).response.status_code == 400
        assert (await refused(url, subprotocols=["feed.v1"])).response.status_code == 400
        async with connect(url, compression=None, subprotocols=["feed.v1", "feed.v2"]) as ws:
            assert ws.subprotocol == "feed.v2"
            assert [f["seq"] for f in await receive(ws, 1)] == [1]
        assert up.refusals("a") == {400: 2}
        assert up.sockets("a")[0].subprotocol == "feed.v2"


# --- subscribe ---------------------------------------------------------------------


def subscribe(stream: str, from_seq: Any) -> str:
    return json.dumps({"op": "subscribe", "stream": stream, "from_seq": from_seq})


@run
async def test_subscribe_sends_nothing_before_the_message_and_its_from_seq_overrides_the_urls():
    async with Upstream(rate=None) as up:
        for _ in range(6):
            up.publish("a")
        async with connect(up.url_for("a") + "?subscribe=1&from_seq=2", compression=None) as ws:
            await settled(ws)
            [record] = up.sockets("a")
            assert (record.frames_sent, record.from_seq, record.subscribed_from) == (0, 2, None)
            await ws.send(subscribe("a", 4))
            assert [f["seq"] for f in await receive(ws, 3)] == [4, 5, 6]
            await ws.send("ignored after the subscribe")
            up.publish("a")
            assert [f["seq"] for f in await receive(ws, 1)] == [7]
        [record] = up.sockets("a")
        assert (record.from_seq, record.subscribed_from, record.first_seq_sent) == (4, 4, 4)
        assert record.kind == Kind(subscribe=True)


@pytest.mark.parametrize(
    "message",
    [
        "not json",
        json.dumps({"op": "unsubscribe", "stream": "a", "from_seq": 1}),
        subscribe("other", 1),
        subscribe("a", 0),
        subscribe("a", "3"),
        subscribe("a", 2.0),
        subscribe("a", True),
        json.dumps({"op": "subscribe", "stream": "a"}),
        json.dumps([1, 2]),
        b"\x00binary",
    ],
)
def test_a_bad_subscribe_message_closes_the_socket_with_1008_and_a_reason(message):
    async def body() -> None:
        async with Upstream(rate=None) as up:
            up.publish("a")
            async with connect(up.url_for("a") + "?subscribe=1", compression=None) as ws:
                await ws.send(message)
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason
            [record] = up.sockets("a")
            assert record.frames_sent == 0 and record.subscribe_error == closed.value.rcvd.reason

    asyncio.run(asyncio.wait_for(body(), 20))


# --- shapes ------------------------------------------------------------------------


@run
async def test_nested_shape_frames_and_the_data_a_worker_should_store():
    async with Upstream(rate=None) as up:
        up.create_stream("n", shape=NESTED)
        up.publish("n")
        up.publish("n", {"é": [1, 2]})
        async with connect(up.url_for("n") + "?shape=nested", compression=None) as ws:
            first, second = await receive(ws, 2)
        assert first["type"] == "update" and first["meta"] == {"sequence": 1}
        assert first["payload"] == {"stream": "n", "t": first["payload"]["t"], "v": 1}
        assert second == {"type": "update", "meta": {"sequence": 2}, "payload": {"é": [1, 2]}}
        expected = up.expected_data("n")
        assert json.loads(expected[1]) == first["payload"] and expected[2] == '{"é":[1,2]}'


@run
async def test_flat_shape_frames_are_their_own_data():
    async with Upstream(rate=None) as up:
        async with connect(up.url_for("f") + "?shape=flat", compression=None) as ws:
            assert up.shape("f") == FLAT  # created by the first socket, in its shape
            up.publish("f")
            [frame] = await receive(ws, 1)
        assert list(frame) == ["u", "stream", "t", "v"] and (frame["u"], frame["v"]) == (1, 1)
        assert up.expected_data("f") == {1: json.dumps(frame, separators=(",", ":"))}
        with pytest.raises(ValueError):
            up.publish("f", [1])  # a flat frame's data is an object


@run
async def test_a_socket_asking_another_shape_than_the_streams_is_refused():
    async with Upstream(rate=None) as up:
        up.create_stream("n", shape=NESTED)
        assert (await refused(up.url_for("n"))).response.status_code == 400
        assert (await refused(up.url_for("n") + "?shape=flat")).response.status_code == 400
        assert (await refused(up.url_for("n") + "?shape=round")).response.status_code == 400
        assert up.refusals("n") == {400: 3}
        with pytest.raises(ValueError):
            up.create_stream("n", shape=FLAT)


def test_expected_data_of_byzantine_frames_is_none():
    assert stored_data("default", b"not json") is None
    assert stored_data("default", b'{"seq": 1}') is None
    assert stored_data(NESTED, b'{"meta": {"sequence": 1}}') is None
    assert stored_data(FLAT, b"[1]") is None
    assert stored_data("default", b'{"seq": 1, "data": null}') == "null"
    assert stored_data("default", b'{"seq": 1, "data": NaN}') is None  # not JSON: the worker makes a marker
    assert stored_data("default", b'{"seq": 1, "data": "\\ud83d\xc3\xa9"}') == '"\\ud83d\\u00e9"'  # escaped, as stored
    assert stored_data("default", '{"seq": 1, "data": "é"}'.encode()) == '"é"'


@run
async def test_expected_data_follows_raw_and_skipped_seqs():
    async with Upstream(rate=None) as up:
        up.publish("a", {"k": 1})
        up.publish_raw("a", lambda seq: b"garbage")
        up.skip("a", 2)
        up.publish("a", 5)
        assert up.expected_data("a") == {1: '{"k":1}', 2: None, 5: "5"}


# --- replay none -------------------------------------------------------------------


@run
async def test_replay_none_sends_only_frames_produced_after_the_socket_opened():
    async with Upstream(rate=None) as up:
        for _ in range(5):
            up.publish("a")
        up.inject("a")  # after seq 5, before the socket: not live, never sent to it
        async with connect(up.url_for("a") + "?replay=none&from_seq=2", compression=None) as ws:
            await settled(ws)
            up.publish("a")
            up.publish("a")
            assert [f["seq"] for f in await receive(ws, 2)] == [6, 7]
        [record] = up.sockets("a")
        assert (record.from_seq, record.live_from, record.first_seq_sent, record.injected_sent) == (2, 6, 6, 0)


@run
async def test_replay_none_with_subscribe_keeps_what_was_asked_and_starts_live():
    async with Upstream(rate=None) as up:
        for _ in range(3):
            up.publish("a")
        async with connect(up.url_for("a") + "?replay=none&subscribe=1", compression=None) as ws:
            await ws.send(subscribe("a", 1))
            await settled(ws)
            up.publish("a")
            assert [f["seq"] for f in await receive(ws, 1)] == [4]
        [record] = up.sockets("a")
        assert (record.subscribed_from, record.live_from, record.first_seq_sent) == (1, 4, 4)


# --- all together, and the request parsing ---------------------------------------------


@run
async def test_every_kind_at_once():
    async with Upstream(rate=None, credentials=[SECRET]) as up:
        up.create_stream("x", shape=NESTED)
        for _ in range(3):
            up.publish("x")
        url = up.url_for("x") + "?auth_header=X-Token&subprotocol=v1&subscribe=1&shape=nested"
        async with connect(url, compression=None, subprotocols=["v1"], additional_headers={"X-Token": SECRET}) as ws:
            await ws.send(subscribe("x", 2))
            assert [f["meta"]["sequence"] for f in await receive(ws, 2)] == [2, 3]
        [record] = up.sockets("x")
        assert record.kind.text == "auth_header=X-Token&subprotocol=v1&subscribe&shape=nested"


def test_request_parsing_refuses_unknown_values_in_a_sentence():
    assert parse_request("/streams/a") == (1, Kind())
    assert parse_request("/streams/a?from_seq=7&replay=none&subscribe=0") == (7, Kind(replay="none"))
    assert parse_request("/streams/a?ping_flood=2.5") == (1, Kind(ping_flood=2.5))
    assert Kind(ping_flood=2000).text == "ping_flood=2000"
    for bad in ("from_seq=0", "from_seq=x", "auth_header=", "auth_header=a%20b", "subprotocol=a,b", "subscribe=yes",
                "shape=round", "replay=some", "ping_flood=0", "ping_flood=fast", "ping_flood=nan", "ping_flood=1e9",
                "amplify=0", "amplify=2000000000", "amplify_every=0", "amplify_with=ones"):
        with pytest.raises(BadRequest) as error:
            parse_request("/streams/a?" + bad)
        assert str(error.value)
    with pytest.raises(BadRequest):
        parse_subscribe(subscribe("a", 2**70 * -1), "a")


class _Pinged(ClientConnection):
    """A client connection that notes each PING's payload (websockets answers it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pings: list[bytes] = []

    def process_event(self, event: Any) -> None:
        super().process_event(event)
        if isinstance(event, Frame) and event.opcode is Opcode.PING:
            self.pings.append(bytes(event.data))


async def until(predicate: Callable[[], Any]) -> None:
    while not predicate():
        await asyncio.sleep(0.02)


@run
async def test_a_ping_flood_socket_is_sent_large_pings_and_no_frame_and_closes_though_it_never_reads():
    async with Upstream(rate=None) as up:
        up.publish("f")  # the stream has a frame: a flood socket is never sent it
        url = up.url_for("f") + "?ping_flood=200"
        async with connect(url, compression=None, create_connection=_Pinged, close_timeout=0.5) as ws:
            await until(lambda: len(ws.pings) >= 10)
            [record] = up.open_sockets("f")
        assert record.kind.ping_flood == 200 and record.frames_sent == 0 and record.pings_sent >= 10
        assert all(len(data) == 125 for data in ws.pings)
        await until(lambda: not up.open_sockets("f"))  # our close is seen, though nothing is read


# --- amplify (hostile) -------------------------------------------------------------


@run
async def test_an_amplifying_socket_sends_every_tenth_seq_as_a_large_frame_of_tiny_objects():
    async with Upstream(rate=None) as up:
        for _ in range(21):
            up.publish("h")
        async with connect(up.url_for("h") + "?from_seq=9&amplify=100000", compression=None, max_size=None) as ws:
            frames = await receive(ws, 13)
        ordinary = up.expected_data("h")  # the books keep the ordinary frames
    assert [f["seq"] for f in frames] == list(range(9, 22))
    for f in frames:
        if f["seq"] in (10, 20):
            assert f["data"] == [{}] * len(f["data"]) and 99_000 < len(json.dumps(f, separators=(",", ":"))) <= 100_000
        else:
            assert json.dumps(f["data"], separators=(",", ":")) == ordinary[f["seq"]]
    [record] = up.sockets("h")
    assert record.amplified_sent == 2 and record.kind.text == "amplify=100000"


def test_an_amplification_frame_carries_its_seq_in_each_shape_and_its_size():
    for shape, seq_of in (("default", lambda f: f["seq"]), (NESTED, lambda f: f["meta"]["sequence"]), (FLAT, lambda f: f["u"])):
        frame = amplified(shape, 30, 5000, "zeros")
        assert seq_of(json.loads(frame)) == 30 and 4990 < len(frame) <= 5000 and b"0,0,0" in frame
    assert parse_request("/streams/a?amplify=64&amplify_every=3&amplify_with=zeros")[1].amplifies(6)
    assert not Kind().amplifies(10)


@pytest.mark.slow
def test_process_takes_credentials(python_env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.upstream", "--port", "0", "--rate", "50",
         "--credential", "one", "--credential", "two"],
        env=python_env, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = proc.stdout.readline().strip().split()[1] + "/streams/p?auth_header=X-Key"
        with pytest.raises(InvalidStatus) as error:
            sync_connect(url, compression=None)
        assert error.value.response.status_code == 401
        for credential in ("one", "two"):
            with sync_connect(url, compression=None, additional_headers={"X-Key": credential}) as ws:
                assert json.loads(ws.recv(timeout=5))["seq"] == 1
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
