"""Upstream sockets and proxies: the environment's proxy variables never reroute an
upstream socket; ``UPSTREAM_PROXY`` tunnels it through CONNECT to the address the worker
checked (never the name, which the proxy would resolve again), with the upstream's name
still in the upgrade request; a proxy's refusal is a refusal; a bad value is a start-up
error naming the variable."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.server import serve

from sim.egress_proxy import EgressProxy
from wsfleet import config
from wsfleet.proxy_tunnel import parse_proxy
from wsfleet.upstream_spec import DEFAULT
from wsfleet.validation import Allowlist
from wsfleet.worker import socket_budget
from wsfleet.worker.upstream_socket import Refused, SocketOptions, open_socket


async def _upstream():
    hosts: list[str] = []

    async def handler(ws):
        hosts.append(ws.request.headers["Host"])
        await ws.send('{"seq": 1}')
        await ws.wait_closed()

    server = await serve(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], hosts


def _options(proxy=None) -> SocketOptions:
    return SocketOptions(5.0, 20.0, 1 << 20, Allowlist.of(("localhost",)), None, proxy)


async def _open(port: int, options: SocketOptions):
    return await open_socket(
        f"ws://localhost:{port}/feed", upstream=DEFAULT, from_seq=1, secret_headers=(), options=options,
        stats=socket_budget.BudgetStats(),
    )


def test_a_named_proxy_carries_the_socket_to_the_checked_address_and_the_environments_proxy_never_does(monkeypatch):
    async def scenario():
        server, port, hosts = await _upstream()
        proxy = await EgressProxy().start()
        ignored = await EgressProxy().start()
        monkeypatch.setenv("HTTPS_PROXY", ignored.url)
        monkeypatch.setenv("HTTP_PROXY", ignored.url)
        monkeypatch.setenv("ALL_PROXY", ignored.url)
        try:
            ws = await _open(port, _options())  # no UPSTREAM_PROXY: straight to the upstream
            assert await ws.recv() == '{"seq": 1}'
            await ws.close()
            assert ignored.targets == []

            ws = await _open(port, _options(parse_proxy("http://ops:s3cret@127.0.0.1:%d" % proxy.port)))
            assert await ws.recv() == '{"seq": 1}'
            await ws.close()
            assert proxy.targets == [f"127.0.0.1:{port}"]  # the checked address, not "localhost"
            assert proxy.authorizations[0].startswith("Basic ")
            assert hosts == [f"localhost:{port}", f"localhost:{port}"]  # the upgrade names the upstream

            proxy.refuse = 403
            with pytest.raises(Refused, match=r"^proxy_refused: .*HTTP 403"):
                await _open(port, _options(parse_proxy(proxy.url)))
        finally:
            await proxy.stop()
            await ignored.stop()
            server.close()

    asyncio.run(scenario())


def test_a_host_the_allowlist_refuses_never_reaches_the_proxy():
    async def scenario():
        proxy = await EgressProxy().start()
        try:
            options = SocketOptions(5.0, 20.0, 1 << 20, Allowlist.of(()), None, parse_proxy(proxy.url))
            with pytest.raises(Refused, match="host_not_allowed"):
                await _open(9, options)  # localhost resolves to loopback, not listed
            assert proxy.targets == []
        finally:
            await proxy.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("value", ["https://p:3128", "socks5://p:1080", "http://p:3128/path", "http://p:x", "p:3128"])
def test_upstream_proxy_must_be_an_http_proxy_url(value):
    with pytest.raises(config.ConfigError, match=r"^UPSTREAM_PROXY must be the URL of an HTTP proxy"):
        config.upstream_proxy({"UPSTREAM_PROXY": value})
    assert "s3cret" not in str(parse_proxy("http://u:s3cret@p:1"))
