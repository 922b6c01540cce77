"""Secret header values, read from Secrets Manager for the worker's sockets.

One :class:`Secrets` per worker, shared by its connections: a value is fetched
(GetSecretValue, through the worker's AWS call wrapper: never on the event loop) when a
socket needs it and kept ``SECRET_TTL_S``; connections that need one ARN at once share
one fetch. After a handshake refused with 401/403 the connection asks for a
:meth:`~Secrets.refresh` "newer than the values I used": the first such ask fetches
again, and every connection refused for the same rotation finds that newer value
already there, so a hundred refusals after one rotation cost one fetch.

Values never leave this module except as the header values handed to the socket: no
log line, exception, metric or trace carries one. An error names the ARN (and JSON
key), never the value.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from botocore.exceptions import BotoCoreError, ClientError

from .. import clock
from .. import metrics_names as names
from ..metrics import Counters
from ..store import is_transient
from ..credentials import SECRET_HOSTS_TAG, host_allowed, tag_hosts
from ..upstream_spec import MAX_HEADER_VALUE, SecretRef, is_header_value

SECRET_TTL_S = 300.0  # a value fetched is used this long; a 401/403 fetches it again sooner


class SecretError(Exception):
    """A secret that cannot be used (missing, access denied, not JSON, no such field,
    binary, not a header value): a refusal. The message names the ARN, never a value."""


class SecretUnavailable(Exception):
    """A transient fault reading a secret (throttling, timeout, 5xx): retried like a
    socket error, not a refusal."""


@dataclass(frozen=True)
class _Value:
    fetched_at: float  # clock.now() when the request that got it left
    string: str | None  # SecretString; None for a binary secret
    hosts: tuple[str, ...] | None = None  # its wsfleet:hosts tag's entries; None: untagged


@dataclass(frozen=True)
class Resolved:
    """Secret header values for one handshake, and when the newest of them was fetched:
    after a refusal every value used is fetched again unless one newer than that is
    there already (fetched for another connection refused the same way)."""

    headers: tuple[tuple[str, str], ...]
    fetched_at: float


class Secrets:
    def __init__(
        self,
        *,
        client: Any,
        call: Callable[..., Awaitable[Any]],
        counters: Counters,
        ttl_s: float = SECRET_TTL_S,
        hosts_required: bool = False,
    ) -> None:
        """``hosts_required``: a secret with no ``wsfleet:hosts`` tag is refused
        (SECRET_HOSTS_REQUIRED); otherwise it may go to any host the allowlist allows."""
        self._client = client
        self._hosts_required = hosts_required
        self._call = call
        self._counters = counters
        self._ttl = ttl_s
        self._values: dict[str, _Value] = {}
        self._fetching: dict[str, tuple[float, asyncio.Future]] = {}  # arn -> (started, fetch)

    async def resolve(self, secret_headers: Iterable[tuple[str, SecretRef]], *, host: str) -> Resolved:
        """The values of ``secret_headers`` (name, ref) pairs, from the cache or fetched,
        each checked to be meant for ``host`` (its ``wsfleet:hosts`` tag). Raises
        :class:`SecretError` or :class:`SecretUnavailable`."""
        pairs = list(secret_headers)
        values = await asyncio.gather(*(self._value(ref.arn, newer_than=None) for _, ref in pairs))
        for (_, ref), value in zip(pairs, values, strict=True):
            self._check_host(ref, value, host)
        headers = tuple((name, _field(ref, value)) for (name, ref), value in zip(pairs, values, strict=True))
        return Resolved(headers, max((v.fetched_at for v in values), default=clock.now()))

    async def refresh(self, arns: Iterable[str], since: float) -> None:
        """Make sure the values of ``arns`` are newer than ``since`` (the ``fetched_at``
        of the values a refused handshake used): fetched again only if what is cached
        (or being fetched) is not. Raises like :meth:`resolve`."""
        await asyncio.gather(*(self._value(arn, newer_than=since) for arn in dict.fromkeys(arns)))

    async def _value(self, arn: str, *, newer_than: float | None) -> _Value:
        now = clock.now()
        cached = self._values.get(arn)
        if cached is not None and now - cached.fetched_at < self._ttl:
            if newer_than is None or cached.fetched_at > newer_than:
                return cached
        fetching = self._fetching.get(arn)
        if fetching is None or (newer_than is not None and fetching[0] <= newer_than):
            fetching = (now, asyncio.ensure_future(self._fetch(arn, now)))
            self._fetching[arn] = fetching
            fetching[1].add_done_callback(lambda f, arn=arn, mine=fetching: self._done(arn, mine))
        # Shielded: one caller cancelled (its connection stopped) does not cancel the
        # fetch the others wait for.
        return await asyncio.shield(fetching[1])

    def _done(self, arn: str, fetching: tuple[float, asyncio.Future]) -> None:
        if self._fetching.get(arn) is fetching:
            del self._fetching[arn]
        if not fetching[1].cancelled():
            fetching[1].exception()  # retrieved: an error nobody awaits any more is not "never retrieved"

    async def _fetch(self, arn: str, started: float) -> _Value:
        self._counters.add(names.SECRET_FETCHES)
        try:
            resp = await self._call(self._client.get_secret_value, SecretId=arn)
        except (ClientError, BotoCoreError) as exc:
            if is_transient(exc):
                raise SecretUnavailable(f"secret {arn} could not be read just now ({_code(exc)})") from None
            raise SecretError(f"secret {arn} cannot be read: {_code(exc)}") from None
        try:
            # The tags say which hosts the secret is for (GetSecretValue does not return them).
            described = await self._call(self._client.describe_secret, SecretId=arn)
        except (ClientError, BotoCoreError) as exc:
            if is_transient(exc):
                raise SecretUnavailable(f"secret {arn}'s tags could not be read just now ({_code(exc)})") from None
            raise SecretError(f"secret {arn}'s tags cannot be read (DescribeSecret): {_code(exc)}") from None
        value = _Value(started, resp.get("SecretString") if "SecretString" in resp else None, tag_hosts(described.get("Tags")))
        self._forget_expired()
        cached = self._values.get(arn)
        if cached is None or cached.fetched_at < started:  # a slower, older fetch never replaces a newer value
            self._values[arn] = value
        return value

    def _forget_expired(self) -> None:
        """Values past their time are dropped (not kept in memory for ARNs no longer used)."""
        now = clock.now()
        for arn in [a for a, v in self._values.items() if now - v.fetched_at >= self._ttl]:
            del self._values[arn]


    def _check_host(self, ref: SecretRef, value: _Value, host: str) -> None:
        """A secret goes only to a host its ``wsfleet:hosts`` tag lists; an untagged one
        anywhere the allowlist allows, unless hosts are required."""
        if value.hosts is None:
            if self._hosts_required:
                raise SecretError(
                    f"secret {ref.arn} has no {SECRET_HOSTS_TAG} tag, and SECRET_HOSTS_REQUIRED is on: tag it with "
                    "the hosts it is for"
                )
            return
        if not host_allowed(value.hosts, host):
            raise SecretError(f"secret {ref.arn} is not for host {host}: its {SECRET_HOSTS_TAG} tag does not list it")


def _code(exc: BaseException) -> str:
    """What an AWS error was, without its message (which is the service's text)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "error"))
    return type(exc).__name__


def _field(ref: SecretRef, value: _Value) -> str:
    """The header value a ref names: the SecretString, or one string field of it as JSON."""
    where = f"secret {ref.text}"
    if value.string is None:
        raise SecretError(f"{where} is binary; a header needs a SecretString")
    text = value.string
    if ref.json_key is not None:
        try:
            obj = json.loads(text)
        except ValueError:
            raise SecretError(f"{where}: the SecretString is not JSON, so it has no field {ref.json_key!r}") from None
        if not isinstance(obj, dict) or ref.json_key not in obj:
            raise SecretError(f"{where}: the SecretString has no field {ref.json_key!r}")
        text = obj[ref.json_key]
        if not isinstance(text, str):
            raise SecretError(f"{where}: the field {ref.json_key!r} is not a string")
    if not is_header_value(text):
        raise SecretError(
            f"{where} is not a valid header value (at most {MAX_HEADER_VALUE} printable ASCII characters, "
            "no CR, LF or other control characters)"
        )
    return text
