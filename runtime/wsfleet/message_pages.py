"""The read API's pages (``GET /connections/{connection_id}/messages``), decided without
I/O: the query string checked, stored items turned into the entries a caller sees, and a
page cut by count and by bytes. The router reads the items and presigns the URLs.

A page ends at ``limit`` entries or when one more entry would take the Lambda response
past :data:`MAX_PAGE_BYTES`, whichever comes first. Lambda refuses a response over 6 MB,
and the size that counts is the proxy response's, whose body is a JSON string inside
JSON: every ``"`` and ``\\`` of the body is escaped once more. Entries are measured that
way, exactly. One inline item is at most ~350 KB of data (a few times that once escaped
twice), so a page always holds at least one entry and paging always moves on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from . import schema
from .stream import MAX_SEQ
from .validation import Invalid

AFTER_SEQ = "after_seq"
LIMIT = "limit"
PARAMETERS = (AFTER_SEQ, LIMIT)
# Seqs start at 0 (CONTRACT.md section 3; a fresh connection asks its upstream for
# from_seq=1, but an upstream may send 0): the default reads from before the first one.
FIRST_AFTER_SEQ = -1
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Under Lambda's 6 MB response limit with room for the envelope and headers.
MAX_PAGE_BYTES = 4_000_000
# Items past their expiry (MESSAGE_TTL_DAYS) that DynamoDB has not deleted yet (it takes
# up to a few days) are not shown: their S3 object may be gone already. A page passes at
# most this many of them before it ends, so a request over a long expired stretch stays
# short; next_after_seq then points past them.
MAX_EXPIRED_PASSED = 1000
# How long a data_url stays valid. A URL presigned with a role's temporary credentials
# stops working when those expire, if that comes first.
DATA_URL_SECONDS = 900

_INTEGER = re.compile(r"-?[0-9]{1,25}")  # digits only: no '+', spaces, '_' or other scripts' digits


@dataclass(frozen=True)
class PageRequest:
    after_seq: int = FIRST_AFTER_SEQ
    limit: int = DEFAULT_LIMIT


def page_request(query: Mapping[str, str] | None, multi: Mapping[str, list[str]] | None = None) -> PageRequest:
    """The page asked for by an API Gateway event's ``queryStringParameters`` (and
    ``multiValueQueryStringParameters``, to refuse a parameter given twice rather than
    silently keep its last value). Raises :class:`Invalid` with a sentence."""
    query, multi = query or {}, multi or {}
    if not isinstance(query, Mapping) or not isinstance(multi, Mapping):  # a direct invocation's junk
        raise Invalid("invalid_query", "The query string parameters must be a map of names to values.")
    for name in query:
        if name not in PARAMETERS:
            raise Invalid(
                "unknown_parameter",
                f"Unknown query parameter {_shown(name)}; this route takes {AFTER_SEQ} and {LIMIT}.",
            )
    for name, values in multi.items():
        if name in PARAMETERS and isinstance(values, list) and len(values) > 1:
            raise Invalid("repeated_parameter", f"The query parameter {name} must be given at most once.")
    return PageRequest(
        after_seq=_integer(query, AFTER_SEQ, FIRST_AFTER_SEQ, FIRST_AFTER_SEQ, MAX_SEQ),
        limit=_integer(query, LIMIT, DEFAULT_LIMIT, 1, MAX_LIMIT),
    )


def _integer(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    if name not in query:
        return default
    raw = query[name]
    if not isinstance(raw, str) or not _INTEGER.fullmatch(raw) or not low <= int(raw) <= high:
        raise Invalid(f"invalid_{name}", f"{name} must be an integer from {low} to {high}, got {_shown(raw)}.")
    return int(raw)


def _shown(value: object) -> str:
    """A caller's value quoted in a sentence, cut short: it may be any length."""
    text = repr(value)
    return text if len(text) <= 42 else text[:40] + "..."


def entry(
    item: Mapping[str, Any], presign: Callable[[str, str], str], data: Callable[[str | None], Any] | None = None
) -> dict[str, Any]:
    """What a caller sees of one stored item (CONTRACT.md section 2): a skip marker
    (with ``to_seq`` for a range, ``data_bytes`` where known), large data as a presigned
    ``data_url`` with its size and SHA-256 (``data_format`` binary for a binary feed's:
    its object holds the base64 as a JSON string), a binary feed's bytes in base64
    (``data_base64``), or the data itself (``data``: what to make of the stored text
    [parsed]; pages keep it as text, :func:`entry_text`)."""
    seq = int(item[schema.MSG_SK])
    binary = item.get(schema.DATA_FORMAT) == schema.DATA_FORMAT_BINARY
    if schema.SKIPPED in item:
        marker: dict[str, Any] = {"seq": seq, "skipped": item[schema.SKIPPED]}
        if schema.SKIP_TO in item:
            marker["to_seq"] = int(item[schema.SKIP_TO])
        if schema.DATA_BYTES in item:
            marker["data_bytes"] = int(item[schema.DATA_BYTES])
        return marker
    if schema.DATA_REF in item:
        bucket, key = schema.parse_data_ref(item[schema.DATA_REF])
        return {
            "seq": seq,
            "data_url": presign(bucket, key),
            "data_bytes": int(item[schema.DATA_BYTES]),
            "data_sha256": item[schema.DATA_SHA256],
            **({schema.DATA_FORMAT: schema.DATA_FORMAT_BINARY} if binary else {}),
        }
    if binary:
        return {"seq": seq, "data_base64": _data(item.get(schema.MESSAGE_DATA))}
    return {"seq": seq, "data": (data or _data)(item.get(schema.MESSAGE_DATA))}


def _data(raw: str | None) -> Any:
    # The worker stores the compact JSON the parser produced, so this parses; text that
    # does not is shown as the text rather than failing every page that holds it.
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def payload_bytes(text: str) -> int:
    """Bytes ``text`` (ASCII JSON, as ``json.dumps`` writes it) takes inside the Lambda
    proxy response, where the body is itself a JSON string."""
    return len(text) + text.count('"') + text.count("\\")


_ENVELOPE = payload_bytes(json.dumps({"messages": [], "next_after_seq": MAX_SEQ}, separators=(",", ":")))


class _Stored(str):
    """Stored data text, to be spliced into the page as it is (see :func:`entry_text`)."""


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group(0))
    if code > 0xFFFF:  # a UTF-16 surrogate pair, as JSON writes characters beyond the BMP
        code -= 0x10000
        return "\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))
    return "\\u%04x" % code


def entry_text(item: Mapping[str, Any], presign: Callable[[str, str], str]) -> str:
    """One entry of a page as JSON text (:func:`_entry_parts` joined)."""
    return "".join(_entry_parts(item, presign))


def _entry_parts(item: Mapping[str, Any], presign: Callable[[str, str], str]) -> tuple[str, ...]:
    """:func:`entry` as compact ASCII JSON text, the stored data spliced in as stored, never
    parsed: parsing each item of a 4 MB page to write it out again took ~100 MB of a 256 MB
    Lambda. Outside strings JSON is ASCII, so escaping every other character as ``\\uXXXX``
    keeps the value and makes the text what ``json.dumps`` would write. The compromise: the
    text is trusted to be the JSON the worker wrote (``stream._stored``)."""
    one = entry(item, presign, data=lambda raw: None if raw is None else _Stored(raw))
    raw = one.get("data")
    if not isinstance(raw, _Stored):
        return (json.dumps(one, separators=(",", ":")),)
    head = json.dumps({k: v for k, v in one.items() if k != "data"}, separators=(",", ":"))
    # In parts, joined once for the whole page: the stored text is not copied per entry.
    return head[:-1] + ',"data":', raw if raw.isascii() else _NON_ASCII.sub(_escaped, raw), "}"


def build_page(
    items: Iterable[Mapping[str, Any]],
    *,
    limit: int,
    presign: Callable[[str, str], str],
    max_bytes: int = MAX_PAGE_BYTES,
    now_s: float | None = None,
    max_expired: int = MAX_EXPIRED_PASSED,
) -> dict[str, Any]:
    """The page of :func:`page_text` as objects (for tools and tests; the router sends the text)."""
    text, _ = page_text(items, limit=limit, presign=presign, max_bytes=max_bytes, now_s=now_s, max_expired=max_expired)
    return json.loads(text)


def page_text(
    items: Iterable[Mapping[str, Any]],
    *,
    limit: int,
    presign: Callable[[str, str], str],
    max_bytes: int = MAX_PAGE_BYTES,
    now_s: float | None = None,
    max_expired: int = MAX_EXPIRED_PASSED,
) -> tuple[str, int]:
    """(``{"messages": [...], "next_after_seq": N or null}`` as JSON text, its number of
    entries), from items in
    seq order, at most ``limit`` entries and ``max_bytes`` (the first entry always).
    ``items`` is read one past what the page takes (the store reads ``limit + 1`` per
    Query) to tell a full page with more after it (``next_after_seq``: the last seq it
    passed) from the end of what is stored now (null). With ``now_s``, items expired by
    then are passed over (at most ``max_expired`` of them, then the page ends). Entries are
    built from the stored text (:func:`entry_text`), never parsed."""
    parts: list[str] = []
    count = 0
    used = _ENVELOPE
    more = False
    passed: int | None = None  # the last seq this page went past: an entry's, or an expired item's
    expired = 0
    for item in items:
        if count >= limit:
            more = True
            break
        if now_s is not None and _expired(item, now_s):
            expired += 1
            passed = int(item[schema.MSG_SK])
            if expired >= max_expired:
                more = True
                break
            continue
        one = _entry_parts(item, presign)
        size = sum(map(payload_bytes, one)) + 1  # and its comma
        if count and used + size > max_bytes:
            more = True
            break
        parts += (",", *one) if count else one
        count += 1
        used += size
        passed = int(item[schema.MSG_SK])
    after = passed if more else None
    return "".join(('{"messages":[', *parts, '],"next_after_seq":', json.dumps(after), "}")), count


def _expired(item: Mapping[str, Any], now_s: float) -> bool:
    expires = item.get(schema.MESSAGE_TTL_ATTRIBUTE)
    return expires is not None and int(expires) < now_s
