"""The secrets of the START ``upstream`` object: Secrets Manager ARNs, never values, under
``UPSTREAM_SECRET_PREFIX`` and in the deployment's region (``secret_headers``,
``secret_query``; :mod:`wsfleet.upstream_spec` declares the object). No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .validation import Invalid

INVALID = "invalid_upstream"
SECRET_NOT_ALLOWED = "secret_not_allowed"
MAX_JSON_KEY = 256
# A Secrets Manager secret ARN: the name after "secret:" (with the 6-character suffix
# Secrets Manager adds) is what UPSTREAM_SECRET_PREFIX must prefix.
SECRET_NAME_CHARS = r"A-Za-z0-9/_+=.@-"
_SECRET_ARN = re.compile(
    r"arn:aws[a-z-]*:secretsmanager:(?P<region>[a-z0-9-]+):[0-9]{12}:secret:(?P<name>[" + SECRET_NAME_CHARS + r"]{1,512})"
)
_JSON_KEY = re.compile(r"[\x20-\x7e]{1,%d}" % MAX_JSON_KEY)


def fail(key: str, message: str, code: str = INVALID) -> Invalid:
    """A 400 naming the upstream key."""
    return Invalid(code, f"upstream.{key}: {message}")


def clip(value: object, width: int = 80) -> object:
    """A value shown in an error, cut to ``width``."""
    return value[:width] + "..." if isinstance(value, str) and len(value) > width else value


@dataclass(frozen=True)
class SecretRef:
    """A Secrets Manager secret (its ARN), and the field of its JSON value to use (None:
    the whole SecretString)."""

    arn: str
    json_key: str | None = None

    @property
    def text(self) -> str:
        return self.arn if self.json_key is None else f"{self.arn}#{self.json_key}"


def parse_secret_ref(
    text: object, secret_prefix: str, key: str = "secret_headers", *, header: str = "", region: str | None = None
) -> SecretRef:
    """``ARN`` or ``ARN#json-key``, the secret's name under ``secret_prefix`` and, when
    ``region`` is given, in that region (the workers may read secrets of their own region
    only: one elsewhere could never be read, so it is refused here rather than at every
    connect). ``header``: the header it is for, named in the error. A value that is not
    an ARN is never repeated in the error: it may be the secret itself, pasted in by mistake."""
    where = f"the value of {header}" if header else "a secret"
    if not isinstance(text, str):
        raise fail(key, f"{where} must be a Secrets Manager ARN string (optionally ARN#json-key).")
    arn, sep, json_key = text.partition("#")
    match = _SECRET_ARN.fullmatch(arn)
    if match is None:
        raise fail(
            key,
            f"{where} is not a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>"
            ", optionally #json-key); give the secret's ARN, never its value.",
        )
    if sep and not _JSON_KEY.fullmatch(json_key):
        raise fail(key, f"the JSON key after '#' must be 1 to {MAX_JSON_KEY} printable ASCII characters.")
    if not secret_prefix:
        raise fail(key, "UPSTREAM_SECRET_PREFIX is empty, so no secret is allowed.", SECRET_NOT_ALLOWED)
    if not match.group("name").startswith(secret_prefix):
        raise fail(
            key,
            f"secret {match.group('name')!r} is not under the allowed prefix {secret_prefix!r}.",
            SECRET_NOT_ALLOWED,
        )
    if region is not None and match.group("region") != region:
        raise fail(
            key,
            f"secret {match.group('name')!r} is in region {match.group('region')}; this deployment reads secrets "
            f"in {region} only.",
            SECRET_NOT_ALLOWED,
        )
    return SecretRef(arn, json_key if sep else None)


MAX_SECRET_QUERY = 8
# A secret query parameter's name: URL-unreserved characters, so that it needs no encoding.
_QUERY_NAME = re.compile(r"[A-Za-z0-9._~-]{1,128}")
_RESERVED_QUERY = frozenset({"from_seq"})  # the worker's own parameter (resume: query)


def check_secret_query(value: object, ctx: Any) -> tuple[tuple[str, SecretRef], ...]:
    if not isinstance(value, dict) or not 1 <= len(value) <= MAX_SECRET_QUERY:
        raise fail("secret_query", f"must be an object of 1 to {MAX_SECRET_QUERY} query parameter names to secret ARNs.")
    out = []
    for name, ref in value.items():
        if not isinstance(name, str) or not _QUERY_NAME.fullmatch(name):
            raise fail(
                "secret_query", f"parameter name {clip(name)!r} must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', '~' or '-'."
            )
        if name.lower() in _RESERVED_QUERY:
            raise fail("secret_query", f"parameter {name} is the worker's own (the resume point).")
        out.append((name, parse_secret_ref(ref, ctx.secret_prefix, "secret_query", header=name, region=ctx.region)))
    return tuple(out)
