"""Opening one connection's socket to its upstream, and what a refusal means.

:func:`open_socket` resolves and checks the host, then makes the handshake the
connection's :class:`~wsfleet.upstream_spec.Upstream` asks for: its URL (``from_seq``
only when it resumes by query), its plain and secret headers, its subprotocols. What
the upstream answers decides how soon to try again (:func:`refusal`): a socket error,
a 5xx, 408 or 429 is a fault that passes (the runner's short backoff); any other 4xx
is a refusal that will not pass by itself (a revoked key, a wrong ARN), waited out for
``REFUSED_RETRY_S`` (jittered) so that a fleet of refused connections is not a storm.
A 401/403 is first answered by fetching the connection's secrets again once (a
rotation), and trying again at once.

Header values never reach a log: websockets logs every request header at DEBUG, so the
sockets get a logger (:data:`SOCKET_LOGGER`) that is never enabled for DEBUG, whatever
the process's log level.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from ..upstream_spec import Upstream
from ..validation import Allowlist, check_resolved
from .gate import ReceiveGate, connect_options

REFUSED_RETRY_S = 60.0  # how long a refused connection waits before it tries again
REFUSED_JITTER = 0.2  # +-20%: connections refused together do not all come back together
CLOSE_TIMEOUT_S = 1.0  # a graceful close waits this long for the upstream's half of the handshake
_PASSING = frozenset({408, 429})  # 4xx answers that say "later", not "no"


class _NoDebug(logging.LoggerAdapter):
    """websockets' logger for our sockets, never enabled for DEBUG: its DEBUG lines are
    the handshake's request headers, secret values included. INFO and above pass."""

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        return level > logging.DEBUG and self.logger.isEnabledFor(level)

    def debug(self, *args: Any, **kwargs: Any) -> None:
        return None


SOCKET_LOGGER = _NoDebug(logging.getLogger("websockets.client"), {})


class Refused(Exception):
    """A handshake that will not succeed by trying again soon. ``text`` says why, for
    ``last_error`` and the log (never a header value); ``auth``: 401 or 403."""

    def __init__(self, text: str, *, auth: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.auth = auth


def refusal(exc: BaseException) -> Refused | None:
    """The refusal an exception of the handshake is, or None for a fault that passes."""
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if 400 <= status < 500 and status not in _PASSING:
            return Refused(f"the upstream refused the handshake: HTTP {status}", auth=status in (401, 403))
    return None


def refused_pause_s(base: float) -> float:
    """The wait after a refusal: ``base`` give or take REFUSED_JITTER."""
    return base * random.uniform(1 - REFUSED_JITTER, 1 + REFUSED_JITTER)


@dataclass(frozen=True)
class SocketOptions:
    """What every socket of the worker shares (from the runner's Settings)."""

    connect_timeout_s: float
    ping_interval_s: float
    max_frame_bytes: int
    allowlist: Allowlist
    gate: ReceiveGate | None


async def resolve(ws_url: str, allowlist: Allowlist) -> tuple[str, int]:
    """The address to open the socket to: DNS answers checked against internal
    ranges (validation.check_resolved), so that a host name cannot point the worker
    at the metadata endpoint or the VPC. Raises Invalid, or OSError if DNS fails."""
    parts = urlsplit(ws_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return check_resolved(host, list(dict.fromkeys(info[4][0] for info in infos)), allowlist), port


async def open_socket(
    ws_url: str,
    *,
    upstream: Upstream,
    from_seq: int,
    secret_headers: tuple[tuple[str, str], ...],
    options: SocketOptions,
) -> ClientConnection:
    """The handshake ``upstream`` asks for, to the checked address of ``ws_url``
    (raises Invalid, OSError, TimeoutError or websockets' handshake errors)."""
    address, port = await resolve(ws_url, options.allowlist)
    headers = [*upstream.headers, *secret_headers]
    return await connect(
        upstream.url(ws_url, from_seq),
        host=address,  # pinned: the address checked is the one connected to
        port=port,
        additional_headers=headers or None,
        subprotocols=list(upstream.subprotocols) or None,
        logger=SOCKET_LOGGER,
        compression=None,  # about 4x less memory per socket
        open_timeout=options.connect_timeout_s,
        ping_interval=options.ping_interval_s,
        ping_timeout=options.ping_interval_s,
        close_timeout=CLOSE_TIMEOUT_S,
        max_size=options.max_frame_bytes,
        **connect_options(options.gate),  # the worker's byte budget (worker.gate)
    )
