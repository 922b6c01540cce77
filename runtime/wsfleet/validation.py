"""What the event router accepts: connection ids, and ws_url with its host allow-list
and SSRF guard. Pure functions, no I/O.

A refusal raises :class:`Invalid` with an error code and a sentence the caller can act
on. The guard works on the URL as written: it cannot see where a host *name* will
resolve, so names are trusted only through ``ALLOWED_WS_HOSTS``; IP literals are
refused outright when they point inside (loopback, private, link-local, metadata,
multicast, reserved...) unless that very address is listed.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Union
from urllib.parse import urlsplit

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

MAX_CONNECTION_ID_LENGTH = 128
MAX_WS_URL_LENGTH = 2048
WS_SCHEMES = ("ws", "wss")

_CONNECTION_ID = re.compile(r"[A-Za-z0-9._:-]{1,%d}" % MAX_CONNECTION_ID_LENGTH)
_DNS_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# The WHATWG URL rule: a host whose last label is a number is an IPv4 address, however
# it is spelled (2130706433, 0x7f.1, 0177.0.0.1 all reach 127.0.0.1 through inet_aton).
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")
# IPv6 forms that carry an IPv4 address. Mapped, compatible and NAT64 addresses are
# also in ::/8, which ``ipaddress`` calls reserved; the tunnels (6to4, Teredo) are
# deprecated and relay to anywhere, and Python versions disagree on whether they are
# global, so they are refused outright.
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_TUNNELS = (ipaddress.IPv6Network("2002::/16"), ipaddress.IPv6Network("2001::/32"))


class Invalid(ValueError):
    """A request value was refused; ``code`` is the API error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_connection_id(value: object) -> str:
    if not isinstance(value, str) or not _CONNECTION_ID.fullmatch(value):
        raise Invalid(
            "invalid_connection_id",
            f"connection_id must be 1 to {MAX_CONNECTION_ID_LENGTH} characters of "
            "A-Z, a-z, 0-9, '.', '_', ':' or '-'.",
        )
    if not value.strip("."):  # '.' and '..' are path segments in S3 keys and the CLI's paths
        raise Invalid("invalid_connection_id", "connection_id must not be made only of dots ('.', '..').")
    return value


@dataclass(frozen=True)
class Allowlist:
    """``ALLOWED_WS_HOSTS`` compiled: exact host names, ``*.domain`` suffixes (any
    subdomain, not the domain itself) and IP addresses. Empty allows nothing."""

    names: frozenset[str]
    suffixes: tuple[str, ...]
    addresses: frozenset[IPAddress]

    @classmethod
    def of(cls, entries: Iterable[str]) -> "Allowlist":
        names, suffixes, addresses = set(), [], set()
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            address = _ip_or_none(entry[1:-1] if entry.startswith("[") and entry.endswith("]") else entry)
            if address is not None:
                addresses.add(address)
            elif entry.startswith("*."):
                suffixes.append("." + entry[2:].rstrip("."))
            else:
                names.add(entry.rstrip("."))
        return cls(frozenset(names), tuple(suffixes), frozenset(addresses))

    def allows_name(self, host: str) -> bool:
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    def __bool__(self) -> bool:
        return bool(self.names or self.suffixes or self.addresses)


def check_ws_url(value: object, allowlist: Allowlist) -> str:
    """The ws_url unchanged if the worker may open it; :class:`Invalid` otherwise."""
    if not isinstance(value, str) or not value:
        raise _bad_url("ws_url must be a non-empty string.")
    if len(value) > MAX_WS_URL_LENGTH:
        raise _bad_url(f"ws_url must be at most {MAX_WS_URL_LENGTH} characters.")
    # A URI is printable ASCII; anything else (spaces, controls, backslashes, raw
    # Unicode) is where URL parsers disagree with each other, so refuse it.
    if any(not "!" <= c <= "~" or c == "\\" for c in value):
        raise _bad_url("ws_url must be printable ASCII with no spaces or backslashes; percent-encode anything else.")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise _bad_url("ws_url is not a valid URL (check the host and port).") from None
    if parts.scheme not in WS_SCHEMES:
        raise _bad_url("ws_url must start with ws:// or wss://.")
    if "#" in value:
        raise _bad_url("ws_url must not have a fragment ('#').")
    if "@" in parts.netloc:
        raise _bad_url("ws_url must not contain a user name or password.")
    if not parts.hostname:
        raise _bad_url("ws_url must name a host.")
    if port == 0:
        raise _bad_url("ws_url port must be between 1 and 65535.")

    host = parts.hostname  # lower-cased, brackets removed
    if parts.netloc.startswith("["):
        if "%" in host:
            raise _bad_url("ws_url must not use an IPv6 zone id.")
        address = _ip_or_none(host)
        if not isinstance(address, ipaddress.IPv6Address):
            raise _bad_url(f"ws_url host [{host}] is not a valid IPv6 address.")
        return _check_address(value, host, address, allowlist)

    host = host[:-1] if host.endswith(".") else host
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        address = _ip_or_none(host)
        if not isinstance(address, ipaddress.IPv4Address):
            raise _bad_url(
                f"ws_url host {host!r} is not a dotted-quad IPv4 address; "
                "write IP addresses in the standard a.b.c.d form."
            )
        return _check_address(value, host, address, allowlist)

    if len(host) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise _bad_url(f"ws_url host {host!r} is not a valid host name.")
    if not allowlist.allows_name(host):
        raise _not_allowed(f"ws_url host {host!r} is not in ALLOWED_WS_HOSTS.", allowlist)
    return value


def check_resolved(host: str, addresses: list[str], allowlist: Allowlist) -> str:
    """The first address the worker may connect to for ``host``, from what DNS returned.

    The router checks the URL as written; a host *name* can still resolve to an internal
    address (a DNS record pointing at 169.254.169.254, or rebinding between the router's
    check and the connect). Internal addresses are allowed only for a host listed
    exactly (not through a ``*.`` pattern) or an address listed itself. Raises
    :class:`Invalid` when no address is allowed."""
    host = host.lower().rstrip(".")
    exact = host in allowlist.names
    for text in addresses:
        address = _ip_or_none(text.split("%", 1)[0])
        if address is not None and (exact or address in allowlist.addresses or not is_internal(address)):
            return text
    raise Invalid(
        "ws_host_not_allowed",
        f"{host} resolves only to loopback, private, link-local, multicast or reserved addresses "
        f"({', '.join(addresses) or 'none'}); list the host exactly in ALLOWED_WS_HOSTS to allow it.",
    )


def is_internal(address: IPAddress) -> bool:
    """True for any address that is not plainly a public unicast one, including IPv6
    forms that embed an IPv4 address (mapped, compatible, NAT64) and IPv6 tunnels."""
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in net for net in _TUNNELS):
            return True
        if address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        elif address in _IPV4_COMPATIBLE or any(address in net for net in _NAT64):
            candidates.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return any(
        not a.is_global
        or a.is_private
        or a.is_loopback
        or a.is_link_local
        or a.is_multicast
        or a.is_unspecified
        or a.is_reserved
        for a in candidates
    )


def _check_address(url: str, host: str, address: IPAddress, allowlist: Allowlist) -> str:
    # An IP literal is matched only by the same address, never by a '*.' pattern.
    if address in allowlist.addresses:
        return url
    shown = f"[{host}]" if address.version == 6 else host
    if is_internal(address):
        raise Invalid(
            "ws_host_not_allowed",
            f"ws_url host {shown} is a loopback, private, link-local, multicast or reserved "
            "address; it is refused unless that exact address is listed in ALLOWED_WS_HOSTS.",
        )
    raise _not_allowed(f"ws_url host {shown} is not in ALLOWED_WS_HOSTS.", allowlist)


def _ip_or_none(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _bad_url(message: str) -> Invalid:
    return Invalid("invalid_ws_url", message)


def _not_allowed(message: str, allowlist: Allowlist) -> Invalid:
    if not allowlist:
        message += " ALLOWED_WS_HOSTS is empty, so no host is allowed."
    return Invalid("ws_host_not_allowed", message)


_IPV4_LIKE = re.compile(r"(?<![0-9.])[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?![0-9])")
_IPV6_LIKE = re.compile(r"(?<![0-9A-Za-z:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:%[0-9A-Za-z._-]+)?")


def without_addresses(text: str) -> str:
    """``text`` with every IP address in it replaced by ``<address>``: what a name
    resolved to is internal knowledge, never for an API caller (``last_error``)."""

    def hide(match: re.Match) -> str:
        word = match.group(0)
        return "<address>" if _ip_or_none(word.split("%", 1)[0]) is not None else word

    return _IPV6_LIKE.sub(hide, _IPV4_LIKE.sub(hide, text))


def plain_numbers(value: Any) -> Any:
    """``value`` with every Decimal (how DynamoDB returns a number) as an int or a float."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: plain_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_numbers(v) for v in value]
    return value
