"""Upstream sockets through an HTTP proxy, only when ``UPSTREAM_PROXY`` names one.

The environment's proxy variables (``HTTPS_PROXY`` and the like) are for the AWS calls
and never reroute a tenant's socket. An operator whose upstreams must leave through an
egress proxy names it in ``UPSTREAM_PROXY`` (``http://[user:password@]host:port``); the
worker then opens each upstream socket as an HTTP ``CONNECT`` tunnel through it, to the
address it checked (the allowlist and the internal-range check, as without a proxy), so
that the proxy cannot be asked for an address the worker did not check, and the TLS
handshake and the WebSocket upgrade still name the upstream's host. A proxy that answers
``CONNECT`` with anything but 2xx refuses the connection (``proxy_refused``: waited out
like any refusal); one that cannot be reached is a fault that passes.

The proxy's own address is the operator's: it is not checked against the internal
ranges (an egress proxy usually sits in the VPC). Its URL may hold credentials, so it is
never logged or put in ``last_error``.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

MAX_ANSWER_BYTES = 8192  # a CONNECT answer's status line and headers


class ProxyError(ValueError):
    """``UPSTREAM_PROXY`` is not an http:// proxy URL (the message names no credentials)."""


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None = None  # the Proxy-Authorization header's value, from the URL's user:password

    def __repr__(self) -> str:  # never the credentials
        return f"Proxy({self.host!r}, {self.port})"


def parse_proxy(raw: str) -> Proxy | None:
    """``UPSTREAM_PROXY``'s value: None when empty; :class:`ProxyError` unless it is
    ``http://[user:password@]host[:port]`` (port 80 if not given) with no path or query."""
    raw = raw.strip()
    if not raw:
        return None
    parts = urlsplit(raw)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or port == -1 or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ProxyError("must be the URL of an HTTP proxy, http://[user:password@]host:port (no path or query)")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    return Proxy(parts.hostname, port or 80, authorization)


class ProxyRefused(Exception):
    """The proxy answered ``CONNECT`` with ``status`` (not 2xx)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"proxy_refused: the upstream proxy answered CONNECT with HTTP {status}")
        self.status = status


def _target(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ipaddress.ip_address(address).version == 6 else f"{address}:{port}"


async def open_tunnel(proxy: Proxy, address: str, port: int) -> socket.socket:
    """A connected socket to ``address``:``port`` (an address the caller checked)
    through ``proxy``'s ``CONNECT``; raises :class:`ProxyRefused`, OSError (the proxy
    unreachable, or it closed the tunnel) or ConnectionError (an answer that is not
    HTTP). The caller bounds the time (the handshake's open timeout)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, sockaddr)
        target = _target(address, port)
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
        answer = b""
        # The upstream speaks only after the client (TLS or the upgrade request), so
        # nothing of the tunnel's own bytes can be read here with the proxy's answer.
        while b"\r\n\r\n" not in answer:
            chunk = await loop.sock_recv(sock, MAX_ANSWER_BYTES - len(answer))
            if not chunk:
                raise ConnectionError("the upstream proxy closed the connection before answering CONNECT")
            answer += chunk
            if len(answer) >= MAX_ANSWER_BYTES and b"\r\n\r\n" not in answer:
                raise ConnectionError("the upstream proxy's answer to CONNECT is not HTTP")
        status_line = answer.split(b"\r\n", 1)[0].split()
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/") or not status_line[1].isdigit():
            raise ConnectionError("the upstream proxy's answer to CONNECT is not HTTP")
        status = int(status_line[1])
        if not 200 <= status < 300:
            raise ProxyRefused(status)
        return sock
    except BaseException:
        sock.close()
        raise
