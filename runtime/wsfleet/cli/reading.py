"""``wsfleet messages``: a connection's stored messages read through the API
(``GET /connections/{id}/messages``), page after page; with ``follow``, polled for new
ones like ``tail -f``; with ``fetch_urls``, large data fetched from its presigned
``data_url`` and checked against its size and SHA-256 before it is shown."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.parse
import urllib.request
from typing import Any, Callable

from .api import ApiClient, is_local, urlopen
from .errors import CliError

MAX_PAGE = 1000  # the API's largest limit
# At the end of what is stored, a seq missing below a newer one is most likely a write
# still in flight (one batch's items land one by one): a follower waits this many polls
# for it before it shows what lies past the hole.
HOLE_POLLS = 3
# A follower outlives a brief outage: an API out of reach, throttled or answering 5xx is
# asked again at the next poll, up to this many times in a row, before it gives up.
FOLLOW_RETRIES = 5
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

Entry = dict[str, Any]


def read(
    client: ApiClient,
    connection_id: str,
    *,
    after_seq: int,
    limit: int | None,
    show: Callable[[Entry], None],
    follow: bool = False,
    interval: float = 2.0,
    fetch_urls: bool = False,
    fetch: Callable[[str], tuple[int, bytes]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show the entries after ``after_seq`` in seq order, at most ``limit`` (None: no
    limit); returns how many were shown. Without ``follow`` it returns at the end of
    what is stored; with it, it polls every ``interval`` seconds until ``limit`` or
    until interrupted (KeyboardInterrupt is the caller's), riding out up to
    :data:`FOLLOW_RETRIES` failed polls in a row. An API error or an object that does
    not match its hash raises :class:`CliError`."""
    fetch = fetch or _fetch
    shown = 0
    failures = 0  # polls in a row that failed in a way worth retrying (follow only)
    covered: int | None = None  # the last seq the entries shown account for
    hole: tuple[int, int] | None = None  # (the seq before a hole at the end, polls it was seen)
    while limit is None or shown < limit:
        want = MAX_PAGE if limit is None else min(MAX_PAGE, limit - shown)
        retry = follow and failures < FOLLOW_RETRIES
        try:
            reply = client.messages(connection_id, after_seq=after_seq, limit=want)
        except CliError:  # the API out of reach
            if not retry:
                raise
            reply = None
        if reply is not None and not reply.ok and not (retry and reply.status in _RETRY_STATUSES):
            raise CliError(reply.sentence())
        if reply is None or not reply.ok:
            failures += 1
            sleep(interval)
            continue
        failures = 0
        entries, next_after_seq = _page(reply.body)
        if follow and next_after_seq is None:
            kept, before_hole = _gap_free(entries, covered)
            if before_hole is None:
                hole = None
            else:
                polls = hole[1] + 1 if hole and hole[0] == before_hole else 1
                hole = None if polls > HOLE_POLLS else (before_hole, polls)
                if hole is not None:
                    entries = entries[:kept]
        for entry in entries:
            show(_resolved(entry, fetch) if fetch_urls and "data_url" in entry else entry)
            shown += 1
            after_seq = entry["seq"]
            covered = max(covered if covered is not None else -1, entry.get("to_seq", entry["seq"]))
            if limit is not None and shown >= limit:
                return shown
        if next_after_seq is not None:
            after_seq = next_after_seq
            continue
        if not follow:
            return shown
        sleep(interval)
    return shown


def _page(body: dict) -> tuple[list[Entry], int | None]:
    entries, next_after_seq = body.get("messages"), body.get("next_after_seq", None)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and type(e.get("seq")) is int for e in entries):
        raise CliError("the API answered a page of messages without a list of entries with seqs")
    if next_after_seq is not None and type(next_after_seq) is not int:
        raise CliError(f"the API answered a next_after_seq that is not an integer: {next_after_seq!r}")
    return entries, next_after_seq


def _gap_free(entries: list[Entry], covered: int | None) -> tuple[int, int | None]:
    """How many leading entries follow on from ``covered`` without a hole (an
    upstream_gap marker accounts for its whole range), and the seq before the first
    hole (None: no hole). Before anything is shown, the first entry starts the run."""
    for i, entry in enumerate(entries):
        if covered is not None and entry["seq"] > covered + 1:
            return i, covered
        end = entry.get("to_seq", entry["seq"])
        covered = end if covered is None else max(covered, end)
    return len(entries), None


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        return urlopen(urllib.request.Request(url, method="GET"), direct=is_local(url))
    except CliError:
        # Not the API's sentence, and not the URL either: it grants a read while valid.
        host = urllib.parse.urlsplit(url).netloc
        raise CliError(f"cannot reach {host} to fetch a data_url") from None


def _resolved(entry: Entry, fetch: Callable[[str], tuple[int, bytes]]) -> Entry:
    """A ``data_url`` entry as ``{"seq", "data"}`` (``data_base64`` for a binary feed's),
    its object fetched and checked."""
    seq = entry["seq"]
    try:
        status, raw = fetch(entry["data_url"])
    except CliError as error:
        raise CliError(f"seq {seq}: {error}") from None
    if status != 200:
        hint = " (its URL has expired: read the page again)" if status == 403 else ""
        raise CliError(f"seq {seq}: fetching its data_url answered HTTP {status}{hint}")
    digest = hashlib.sha256(raw).hexdigest()
    if len(raw) != entry.get("data_bytes") or digest != entry.get("data_sha256"):
        raise CliError(
            f"seq {seq}: the data fetched ({len(raw)} bytes, SHA-256 {digest[:12]}...) does not match its "
            f"data_bytes {entry.get('data_bytes')} and data_sha256 {str(entry.get('data_sha256'))[:12]}..."
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise CliError(f"seq {seq}: the data fetched is not UTF-8 JSON") from None
    # A binary feed's object holds its base64 as a JSON string: shown as data_base64.
    return {"seq": seq, "data_base64" if entry.get("data_format") == "binary" else "data": data}
