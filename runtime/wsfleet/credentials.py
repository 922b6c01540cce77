"""Where credentials may travel: the START rules that keep a secret out of plain sight
and off cleartext sockets. Pure functions, no I/O.

* ``cleartext_secret``: an upstream with ``secret_headers`` or ``secret_query`` is
  opened only over ``wss://``, or ``ws://`` to a loopback host (``localhost``,
  127.0.0.0/8, ``::1``: local runs, where the bytes never leave the machine).
* ``secret_in_plain``: a credential-like query parameter in ``ws_url`` or a
  credential-like plain header would be stored, returned by GET and copied into hints
  and logs; it belongs in ``secret_query`` / ``secret_headers`` (a Secrets Manager ARN).
  Names are matched case-insensitively, ``-`` and ``_`` alike; the value is never
  repeated in the message.

The router refuses both with a 400 before any write; the worker applies
:func:`check_travel` again at every connect, so an item stored before the rule never
sends a secret in cleartext either.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable
from urllib.parse import parse_qsl, urlsplit

from .upstream_spec import Upstream
from .validation import Invalid

CLEARTEXT_SECRET = "cleartext_secret"
SECRET_IN_PLAIN = "secret_in_plain"

# Query parameter names that carry a credential (compared lower-case, '-' read as '_').
CREDENTIAL_QUERY_NAMES = frozenset(
    {
        "token", "access_token", "id_token", "refresh_token", "auth_token", "api_key", "apikey", "key",
        "secret", "client_secret", "password", "passwd", "pwd", "auth", "authorization", "signature",
        "sig", "jwt", "access_key", "secret_key", "private_key", "session", "sessionid", "session_id", "session_token", "credential", "credentials",
        "x_amz_signature", "x_amz_credential", "x_amz_security_token",
    }
)
# Header names that carry a credential (compared lower-case, '-' read as '_').
CREDENTIAL_HEADER_NAMES = frozenset(
    {
        "authorization", "proxy_authorization", "cookie", "x_api_key", "api_key", "apikey", "x_auth_token",
        "x_access_token", "x_amz_security_token", "x_csrf_token", "x_session_token",
    }
)
# Any name ending so is credential-like too (auth_token, x-client-secret, db_password ...).
_CREDENTIAL_SUFFIXES = ("_token", "_secret", "_password", "_signature", "_api_key", "_apikey")


def _normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def is_credential_query_name(name: str) -> bool:
    normal = _normal(name)
    return normal in CREDENTIAL_QUERY_NAMES or normal.endswith(_CREDENTIAL_SUFFIXES)


def is_credential_header_name(name: str) -> bool:
    normal = _normal(name)
    return normal in CREDENTIAL_HEADER_NAMES or normal.endswith(_CREDENTIAL_SUFFIXES)


def is_loopback_host(host: str) -> bool:
    """``localhost``, an address in 127.0.0.0/8, or ``::1`` (brackets allowed)."""
    host = host.lower().rstrip(".").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_travel(ws_url: str, *, has_secrets: bool) -> None:
    """Raise ``cleartext_secret`` when an upstream with secrets would be opened over
    ``ws://`` to a host that is not loopback."""
    if not has_secrets:
        return
    parts = urlsplit(ws_url)
    if parts.scheme == "ws" and not is_loopback_host(parts.hostname or ""):
        raise Invalid(
            CLEARTEXT_SECRET,
            "upstream has secret_headers or secret_query but ws_url is ws://, which would send the secret in "
            "cleartext; use wss:// (ws:// is allowed only to localhost, 127.0.0.0/8 or ::1).",
        )


def check_start(ws_url: str, upstream: Upstream) -> str:
    """``ws_url`` if a START with ``upstream`` keeps its secrets where they belong; raises
    ``secret_in_plain``, ``invalid_upstream`` (a secret query parameter ws_url has too) or
    ``cleartext_secret`` otherwise."""
    check_plain(ws_url, [name for name, _ in upstream.headers])
    check_secret_query_names(ws_url, [name for name, _ in upstream.secret_query])
    check_travel(ws_url, has_secrets=bool(upstream.secret_refs))
    return ws_url


def check_plain(ws_url: str, header_names: Iterable[str]) -> None:
    """Raise ``secret_in_plain`` for a credential-like query parameter of ``ws_url`` or a
    credential-like plain header name: these are stored and shown, secrets are not."""
    query = urlsplit(ws_url).query
    for name, _ in parse_qsl(query, keep_blank_values=True):
        if is_credential_query_name(name):
            raise Invalid(
                SECRET_IN_PLAIN,
                f"ws_url has the credential-like query parameter {_shown(name)}, which would be stored, returned "
                "by GET and logged; put the value in Secrets Manager and name it in upstream.secret_query "
                "(parameter name -> secret ARN) instead.",
            )
    for name in header_names:
        if is_credential_header_name(name):
            raise Invalid(
                SECRET_IN_PLAIN,
                f"upstream.headers has the credential-like header {_shown(name)}, which would be stored, returned "
                "by GET and logged; put the value in Secrets Manager and name it in upstream.secret_headers "
                "(header name -> secret ARN) instead.",
            )


def check_secret_query_names(ws_url: str, names: Iterable[str]) -> None:
    """Raise ``invalid_upstream`` for a ``secret_query`` parameter that ``ws_url`` already has."""
    given = {name.lower() for name, _ in parse_qsl(urlsplit(ws_url).query, keep_blank_values=True)}
    for name in names:
        if name.lower() in given:
            raise Invalid(
                "invalid_upstream", f"upstream.secret_query: parameter {name} is also in ws_url's query; give it once."
            )


def _shown(name: str) -> str:
    return repr(name if len(name) <= 40 else name[:40] + "...")


# --- secrets bound to hosts ------------------------------------------------------------

SECRET_HOSTS_TAG = "wsfleet:hosts"  # the Secrets Manager tag naming the hosts a secret may go to


def tag_hosts(tags: Iterable[dict] | None) -> tuple[str, ...] | None:
    """The host entries of a secret's ``wsfleet:hosts`` tag (DescribeSecret's ``Tags``),
    lower-case; None when it has no such tag. Tag values cannot hold ``,`` or ``*``, so
    entries are separated by spaces and a leading dot stands for a domain and its
    subdomains."""
    for tag in tags or ():
        if tag.get("Key") == SECRET_HOSTS_TAG:
            return tuple(entry.lower().rstrip(".") for entry in str(tag.get("Value", "")).split())
    return None


def host_allowed(entries: Iterable[str], host: str) -> bool:
    """True when ``host`` is one of ``entries`` (exact), or under a ``.domain`` entry
    (the domain itself or any subdomain)."""
    host = host.lower().rstrip(".")
    for entry in entries:
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False
