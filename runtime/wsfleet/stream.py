"""The upstream stream, as pure decisions: parse frames, drop replays, track the
checkpoint, build the resume URL. No I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MAX_MESSAGE_BYTES = 350_000  # stay well inside DynamoDB's 400 KB item limit


@dataclass(frozen=True)
class Frame:
    seq: int
    data_json: str  # the frame's data as compact JSON
    received_at_ms: int


def parse_frame(text: str | bytes, received_at_ms: int) -> Frame | None:
    """Parse an upstream text frame ``{"seq": <int>, "data": <any>}``; None if malformed
    (binary, not JSON, not an object, no non-negative integer seq, or too large to store)."""
    if not isinstance(text, str):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return None
    data_json = json.dumps(obj.get("data"), separators=(",", ":"), ensure_ascii=False)
    if len(data_json.encode("utf-8")) > MAX_MESSAGE_BYTES:
        return None
    return Frame(seq, data_json, received_at_ms)


def resume_url(ws_url: str, from_seq: int) -> str:
    """``ws_url`` with ``from_seq`` set (replacing any given one), other query kept."""
    parts = urlsplit(ws_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "from_seq"]
    query.append(("from_seq", str(from_seq)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def contiguous_end(start: int, seqs: Iterable[int]) -> tuple[int, bool]:
    """Walk ascending stored seqs from ``start``: (the last seq reached without a hole,
    whether every seq given was reached). Seqs at or below ``start`` are skipped."""
    end = start
    for seq in seqs:
        if seq <= end:
            continue
        if seq != end + 1:
            return end, False
        end = seq
    return end, True


class SeqTracker:
    """What has been received and what is durably stored, for one owned stream.

    Frames are accepted in increasing seq order; a replayed seq (at or below the last
    accepted) is dropped, so a reconnect or takeover never writes a row twice within
    one ownership. Stored frames are a prefix of accepted ones, so the checkpoint (the
    last stored seq) has no unstored frame below it.
    """

    def __init__(self, checkpoint: int) -> None:
        self.checkpoint = checkpoint
        self.last_accepted = checkpoint
        self.gaps = 0  # times the upstream skipped seqs

    @property
    def next_seq(self) -> int:
        """Where to resume the socket: frames up to ``last_accepted`` are in hand."""
        return self.last_accepted + 1

    def accept(self, seq: int) -> bool:
        if seq <= self.last_accepted:
            return False
        if seq > self.last_accepted + 1:
            self.gaps += 1
        self.last_accepted = seq
        return True

    def stored(self, seq: int) -> None:
        self.checkpoint = max(self.checkpoint, seq)
