"""What the worker checks at every connect (CONTRACT section 3, issue 36), against the
local upstream and the emulator: the host against ALLOWED_WS_HOSTS again (a narrowed
list takes effect without a new START), a 3xx of any origin and a closed port as
refusals (never followed, never a loop error), no proxy from the environment, secret
query parameters added at connect, and secrets sent only to the hosts their tag allows.
``last_error`` never holds an address or a secret."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import uuid

import pytest

from sim.secrets import put_secret
from tests.test_worker import config, seqs
from tests.test_worker_upstreams import eventually, every_item, running, start
from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.logs import JsonLogger
from wsfleet.validation import Allowlist
from wsfleet.worker.upstream_socket import NOT_LISTED, PORT_CLOSED, RESOLVES_INTERNAL, Refused, resolve

pytestmark = pytest.mark.slow


def assert_no_address(text: str) -> None:
    for token in re.findall(r"[0-9A-Fa-f:.]{3,}", text):
        try:
            ipaddress.ip_address(token.strip(".:"))
        except ValueError:
            continue
        raise AssertionError(f"an address in {text!r}")


async def redirecting(location: str) -> tuple[asyncio.AbstractServer, str, list[bytes]]:
    """A server that answers every handshake with a 302 to ``location``."""
    hits: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"ws://127.0.0.1:{port}", hits


def refused_once(worker, conns, cid: str):
    return lambda: schema.LAST_ERROR in (conns.get(cid) or {}) and worker.counters.total(names.UPSTREAM_REFUSALS) >= 1


@pytest.mark.parametrize("origin", ["same", "cross"])
def test_a_redirect_of_any_origin_is_a_refusal_never_followed_and_never_a_loop_error(
    origin, emulator, aws_env, stores, ddb, upstream, captured
):
    conns, _ = stores
    value = f"v-{uuid.uuid4().hex}"
    arn = put_secret(emulator.endpoint_url, f"test/{uuid.uuid4().hex[:8]}", value)

    async def scenario():
        target = upstream.url_for("elsewhere") if origin == "cross" else "/streams/elsewhere"
        server, url, hits = await redirecting(target)
        async with server:
            start(conns, ddb, aws_env, "r", url + "/streams/r", {"secret_headers": {"X-Key": arn}})
            async with running(config(aws_env), JsonLogger(captured.stream), refused_retry_s=30) as worker:
                await eventually(refused_once(worker, conns, "r"), what="the refusal")
                await asyncio.sleep(0.3)  # a followed redirect or a tight loop would show by now
                assert worker.counters.total(names.LOOP_ERRORS) == 0
                assert worker.counters.total(names.UPSTREAM_REFUSALS) == 1
        return hits

    hits = asyncio.run(scenario())
    assert len(hits) == 1  # the redirect's target was never asked (same origin: no second request)
    assert upstream.sockets("elsewhere") == []
    error = conns.get("r")[schema.LAST_ERROR]
    assert error.startswith("redirect") and "302" in error and "elsewhere" not in error
    assert value not in captured.lines() + every_item(ddb, aws_env)


def test_a_closed_port_is_a_refusal_with_a_last_error_and_no_address(aws_env, stores, ddb, captured):
    conns, _ = stores
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start(conns, ddb, aws_env, "c", f"ws://127.0.0.1:{port}/streams/c")

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream), refused_retry_s=30) as worker:
            await eventually(refused_once(worker, conns, "c"), what="the refusal")
            assert worker.counters.total(names.LOOP_ERRORS) == 0

    asyncio.run(scenario())
    assert conns.get("c")[schema.LAST_ERROR] == PORT_CLOSED
    assert_no_address(PORT_CLOSED)


def test_a_host_taken_off_the_allowlist_gets_no_socket_at_the_next_connect(aws_env, stores, ddb, upstream, captured):
    conns, msgs = stores
    start(conns, ddb, aws_env, "n", upstream.url_for("n"))  # started while 127.0.0.1 was allowed

    async def scenario():
        narrowed = config(aws_env, ALLOWED_WS_HOSTS="*.feeds.example.com")
        async with running(narrowed, JsonLogger(captured.stream), refused_retry_s=30) as worker:
            await eventually(refused_once(worker, conns, "n"), what="the refusal")

    asyncio.run(scenario())
    assert upstream.sockets("n") == [] and seqs(msgs, "n") == []
    error = conns.get("n")[schema.LAST_ERROR]
    assert error == NOT_LISTED and error.startswith("host_not_allowed")
    assert_no_address(error)


def test_a_host_resolving_only_to_internal_addresses_names_no_address_in_its_refusal(monkeypatch):
    async def dns(host, port, **_):  # a hostile record: the allowed name points at the metadata endpoint
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

    async def scenario():
        monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", dns)
        with pytest.raises(Refused) as caught:
            await resolve("wss://eu.feeds.example.com/s", Allowlist.of(["*.feeds.example.com"]))
        return caught.value

    refused = asyncio.run(scenario())
    assert refused.text == RESOLVES_INTERNAL and refused.text.startswith("host_not_allowed")
    assert_no_address(refused.text)


def test_upstream_sockets_ignore_the_environments_proxy_variables(monkeypatch, aws_env, stores, ddb, upstream):
    conns, msgs = stores
    # websockets reads ws_proxy first; a proxy at a closed port would fail every connect.
    monkeypatch.setenv("ws_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("all_proxy", "socks5h://127.0.0.1:9")
    start(conns, ddb, aws_env, "p", upstream.url_for("p"))

    async def scenario():
        async with running(config(aws_env), JsonLogger()):
            await eventually(lambda: len(seqs(msgs, "p")) >= 3, what="frames through a direct socket")

    asyncio.run(scenario())


def test_a_secret_query_parameter_is_added_at_connect_and_appears_nowhere_else(
    emulator, aws_env, stores, ddb, upstream, captured
):
    conns, msgs = stores
    value = f"tok-{uuid.uuid4().hex}"
    arn = put_secret(emulator.endpoint_url, f"test/{uuid.uuid4().hex[:8]}", value, hosts="127.0.0.1")
    start(conns, ddb, aws_env, "q", upstream.url_for("q") + "?topic=a", {"secret_query": {"api_key": arn}})

    async def scenario():
        async with running(config(aws_env, SECRET_HOSTS_REQUIRED="on"), JsonLogger(captured.stream)):
            await eventually(lambda: len(seqs(msgs, "q")) >= 3, what="frames")

    asyncio.run(scenario())
    (sock, *_) = upstream.sockets("q")
    assert "topic=a" in sock.path and f"api_key={value}" in sock.path
    assert value not in captured.lines() + every_item(ddb, aws_env)


@pytest.mark.parametrize(
    "hosts, required, sent",
    [
        ("stream.example.com .feeds.example.com", "off", False),  # tagged for other hosts
        (None, "on", False),  # untagged where tags are required (prod)
        (None, "off", True),  # untagged where they are not (dev)
        ("localhost 127.0.0.1", "on", True),
    ],
)
def test_a_secret_is_sent_only_to_a_host_its_tag_allows(
    hosts, required, sent, emulator, aws_env, stores, ddb, upstream, captured
):
    conns, msgs = stores
    value = f"k-{uuid.uuid4().hex}"
    upstream.set_credentials([value])
    arn = put_secret(emulator.endpoint_url, f"test/{uuid.uuid4().hex[:8]}", value, hosts=hosts)
    start(conns, ddb, aws_env, "h", upstream.url_for("h") + "?auth_header=X-Key", {"secret_headers": {"X-Key": arn}})

    async def scenario():
        async with running(config(aws_env, SECRET_HOSTS_REQUIRED=required), JsonLogger(captured.stream),
                           refused_retry_s=30) as worker:
            if sent:
                await eventually(lambda: len(seqs(msgs, "h")) >= 3, what="frames")
            else:
                await eventually(refused_once(worker, conns, "h"), what="the refusal")

    asyncio.run(scenario())
    if not sent:
        assert upstream.sockets("h") == [] and upstream.refusals("h") == {}  # no handshake at all
        error = conns.get("h")[schema.LAST_ERROR]
        assert arn in error and "wsfleet:hosts" in error
    assert value not in captured.lines() + every_item(ddb, aws_env)


def test_a_stored_upstream_with_secrets_over_ws_to_another_host_is_refused_before_any_secret_is_read(
    emulator, aws_env, stores, ddb, captured
):
    conns, _ = stores
    arn = put_secret(emulator.endpoint_url, f"test/{uuid.uuid4().hex[:8]}", "v")
    # Stored before the router refused it: the worker refuses it at connect too.
    start(conns, ddb, aws_env, "w", "ws://eu.feeds.example.com/s", {"secret_headers": {"X-Key": arn}})

    async def scenario():
        allowed = config(aws_env, ALLOWED_WS_HOSTS="*.feeds.example.com")
        async with running(allowed, JsonLogger(captured.stream), refused_retry_s=30) as worker:
            await eventually(refused_once(worker, conns, "w"), what="the refusal")
            assert worker.counters.total(names.SECRET_FETCHES) == 0

    asyncio.run(scenario())
    assert "wss://" in conns.get("w")[schema.LAST_ERROR]
