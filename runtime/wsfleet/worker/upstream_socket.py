"""Opening one connection's socket to its upstream, and what a refusal means.

:func:`open_socket` checks the host against the allowlist again (it may have narrowed
since the START), resolves it and checks the addresses, then makes the handshake the
connection's :class:`~wsfleet.upstream_spec.Upstream` asks for, to the checked address,
through a proxy only when ``UPSTREAM_PROXY`` names one (:mod:`wsfleet.proxy_tunnel`): its URL (``from_seq`` only when it resumes by query, its secret
query parameters), its plain and secret headers, its subprotocols. What the upstream
answers decides how soon to try again (:func:`refusal`): a socket error, a 5xx, 408 or
429 is a fault that passes (the runner's short backoff); any other 4xx, any 3xx (a
redirect is never followed), a closed port or a host not allowed is a refusal that will
not pass by itself (a revoked key, a wrong ARN, a moved feed), waited out for
``REFUSED_RETRY_S`` (jittered) so that a fleet of refused connections is not a storm.
A 401/403 is first answered by fetching the connection's secrets again once (a
rotation), and trying again at once.

Every socket keeps to its budgets (:mod:`.socket_budget`: unsent bytes bounded, a
control-frame flood closed), and to the worker's receive gate (:mod:`.gate`) when it has
one; what a connection's sockets measured is in its dialer's ``budget`` stats.

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
from urllib.parse import urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as _connect
from websockets.exceptions import InvalidStatus

from .. import clock, upstream_spec
from .. import metrics_names as names
from ..logs import JsonLogger
from ..upstream_spec import Upstream
from ..credentials import check_travel
from ..validation import Allowlist, Invalid, check_resolved, check_ws_url
from . import socket_budget
from .gate import ReceiveGate, connect_options
from ..proxy_tunnel import Proxy, ProxyRefused, open_tunnel
from .secrets import Resolved, SecretError, Secrets

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

    counter, event = names.UPSTREAM_REFUSALS, "upstream_refused"  # as the wait counts and logs it

    def __init__(self, text: str, *, auth: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.auth = auth


HOST_NOT_ALLOWED = "host_not_allowed"  # last_error's first word when the allowlist refuses the host at connect
# last_error's sentences name no address: what DNS answered is internal knowledge.
NOT_LISTED = (
    f"{HOST_NOT_ALLOWED}: the ws_url host is not allowed by this worker's ALLOWED_WS_HOSTS (checked again at every "
    "connect); no socket was opened"
)
RESOLVES_INTERNAL = (
    f"{HOST_NOT_ALLOWED}: the ws_url host resolves only to loopback, private, link-local or reserved addresses; "
    "no socket was opened (list the host exactly in ALLOWED_WS_HOSTS to allow it)"
)
PORT_CLOSED = "port_closed: the upstream's port refused the connection (nothing listens there)"


class _Connect(_connect):
    """websockets' ``connect`` that never follows a redirect: a 3xx is answered like any
    refusal (the caller's InvalidStatus), so a redirect can neither take the handshake's
    headers (secrets included) elsewhere nor become a tight retry loop."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def refusal(exc: BaseException) -> Refused | None:
    """The refusal an exception of the handshake is, or None for a fault that passes."""
    if isinstance(exc, ConnectionRefusedError):
        return Refused(PORT_CLOSED)
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if 300 <= status < 400:
            return Refused(
                f"redirect: the upstream answered the handshake with HTTP {status}; redirects are never followed "
                "(point ws_url at where it leads)"
            )
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
    proxy: Proxy | None = None  # UPSTREAM_PROXY: sockets tunnel through it (.proxy_tunnel)


async def resolve(ws_url: str, allowlist: Allowlist) -> tuple[str, int]:
    """The address to open the socket to: the URL checked against the allowlist again
    (validation.check_ws_url), then DNS answers checked against internal ranges
    (validation.check_resolved), so that a host name cannot point the worker at the
    metadata endpoint or the VPC. Raises :class:`Refused` (``host_not_allowed``), or
    OSError if DNS fails."""
    try:
        check_ws_url(ws_url, allowlist)  # the list may have narrowed since the START
    except Invalid:
        raise Refused(NOT_LISTED) from None
    parts = urlsplit(ws_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    try:
        return check_resolved(host, list(dict.fromkeys(info[4][0] for info in infos)), allowlist), port
    except Invalid:
        raise Refused(RESOLVES_INTERNAL) from None


async def open_socket(
    ws_url: str,
    *,
    upstream: Upstream,
    from_seq: int,
    secret_headers: tuple[tuple[str, str], ...],
    options: SocketOptions,
    stats: socket_budget.BudgetStats,
    secret_query: tuple[tuple[str, str], ...] = (),
) -> ClientConnection:
    """The handshake ``upstream`` asks for, to the checked address of ``ws_url``
    (raises Refused, OSError, TimeoutError or websockets' handshake errors); the
    socket's budgets count into ``stats``. ``secret_query`` is added to the URL here,
    and the URL is never logged. The environment's proxy variables are ignored (they are
    for the AWS calls): the address checked is the one connected to, directly, or through
    the tunnel ``UPSTREAM_PROXY`` names (:mod:`wsfleet.proxy_tunnel`), which raises Refused for a
    proxy's refusal."""
    address, port = await resolve(ws_url, options.allowlist)
    headers = [*upstream.headers, *secret_headers]
    gated = connect_options(options.gate)  # the worker's byte budget (worker.gate)
    factory = socket_budget.connection_factory(gated.pop("create_connection", None), stats)
    if options.proxy is None:
        to: dict[str, Any] = {"host": address, "port": port}  # pinned: the address checked is the one connected to
    else:
        try:
            sock = await asyncio.wait_for(open_tunnel(options.proxy, address, port), options.connect_timeout_s)
        except ProxyRefused as exc:
            raise Refused(str(exc)) from None
        to = {"sock": sock}  # a tunnel to the checked address
        if urlsplit(ws_url).scheme == "wss":
            to["server_hostname"] = urlsplit(ws_url).hostname  # TLS still checks the upstream's name
    return await _Connect(
        with_query(upstream.url(ws_url, from_seq), secret_query),
        **to,
        additional_headers=headers or None,
        subprotocols=list(upstream.subprotocols) or None,
        logger=SOCKET_LOGGER,
        compression=None,  # about 4x less memory per socket
        open_timeout=options.connect_timeout_s,
        ping_interval=options.ping_interval_s,
        ping_timeout=options.ping_interval_s,
        close_timeout=CLOSE_TIMEOUT_S,
        max_size=options.max_frame_bytes,
        create_connection=factory,
        proxy=None,
        **socket_budget.connect_options(),
        **gated,
    )


def with_query(url: str, pairs: tuple[tuple[str, str], ...]) -> str:
    """``url`` with ``pairs`` appended to its query (percent-encoded)."""
    if not pairs:
        return url
    parts = urlsplit(url)
    extra = urlencode(pairs)
    return urlunsplit(parts._replace(query=f"{parts.query}&{extra}" if parts.query else extra))


async def close_socket(ws: ClientConnection, *, abort: bool) -> None:
    """Close the socket: with a close handshake bounded by ``CLOSE_TIMEOUT_S`` (an
    upstream that stalls it is cut off), or, when ``abort``, by dropping the TCP
    connection at once."""
    if abort:
        ws.transport.abort()
        return
    try:
        await asyncio.wait_for(ws.close(), timeout=CLOSE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - closing is best effort; abort the transport
        ws.transport.abort()


class Dialer:
    """How one connection opens its socket: its upstream (parsed from the stored item
    with this worker's secret prefix; one it refuses is a refusal at every connect), its
    secret header values, and the refusal rule."""

    def __init__(
        self,
        ws_url: str,
        upstream_item: dict | None,
        *,
        options: SocketOptions,
        secret_prefix: str,
        region: str | None = None,
        secrets: Secrets,
        log: JsonLogger,
    ) -> None:
        self._ws_url = ws_url
        self._options = options
        self._secrets = secrets
        self._log = log
        self._refused: Refused | None = None
        self.budget = socket_budget.BudgetStats()  # what its sockets measured
        try:
            self.upstream = upstream_spec.parse(upstream_item or None, secret_prefix=secret_prefix, region=region)
            check_travel(ws_url, has_secrets=bool(self.upstream.secret_refs))  # an item stored before the rule
        except Invalid as exc:
            self.upstream = upstream_spec.DEFAULT
            self._refused = Refused(f"the stored upstream is refused by this worker: {exc.message}")
            log.error("stored_upstream_refused", error=self._refused.text)

    async def open(self, from_seq: int) -> ClientConnection:
        """The socket, as the upstream asks for it. A 401/403 is answered once by
        fetching the secrets again (newer than the ones refused) and trying again at
        once; a refusal (that one again, another 4xx, a 3xx, a closed port, a secret that
        cannot be read or is not for this host, a host not allowed, a stored upstream
        refused) raises :class:`Refused`."""
        if self._refused is not None:
            raise self._refused
        secret = await self._secret_values()
        split = len(self.upstream.secret_headers)  # secret headers first, then secret query parameters
        for again in (False, True):
            try:
                return await open_socket(
                    self._ws_url,
                    upstream=self.upstream,
                    from_seq=from_seq,
                    secret_headers=secret.headers[:split],
                    secret_query=secret.headers[split:],
                    options=self._options,
                    stats=self.budget,
                )
            except (InvalidStatus, ConnectionRefusedError) as exc:
                refused = refusal(exc)
                if refused is None:
                    raise
                if again or not (refused.auth and self.upstream.secret_refs):
                    raise refused from None
                self._log.info("refreshing_secrets_after_refusal", status=exc.response.status_code)
                secret = await self._secret_values(refresh_since=secret.fetched_at)
        raise AssertionError("unreachable: the second try returns or raises")

    async def _secret_values(self, *, refresh_since: float | None = None) -> Resolved:
        """The secret header values (fetched again first when values newer than
        ``refresh_since`` are wanted); a secret that cannot be used is a refusal."""
        refs = self.upstream.secret_refs
        if not refs:
            return Resolved((), clock.now())
        try:
            if refresh_since is not None:
                await self._secrets.refresh([ref.arn for _, ref in refs], since=refresh_since)
            return await self._secrets.resolve(refs, host=urlsplit(self._ws_url).hostname or "")
        except SecretError as exc:
            raise Refused(str(exc)) from None
