"""The stored data against the upstream's books: what the checker's ``lost``,
``doubled`` and ``corrupt`` say of one connection. Pure functions, no I/O.

Every row must be what the upstream sent as its seq, on one of the streams the
connection's ws_url named: the same JSON value (a byzantine frame stored with its
non-ASCII characters escaped is), or a skip marker where the frame rules make one (the
history says which seqs those are: :mod:`.byzantine`). Every seq up to the stored end
and the checkpoint must be stored, but for the ones the upstream itself skipped on a
socket that asked for them (its books say so: never produced, or before where a replay
from the wrong seq began).
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence

from wsfleet import schema
from ..timing import Timing
from ..upstream import SocketRecord, stream_name
from .byzantine import CLASSES, MARKER
from .evidence import Evidence, Row
from .history import Applied, Op

UPSTREAM_GAP = "upstream_gap"  # a skip marker for a range the upstream skipped (CONTRACT.md section 4)


def byzantine_expectations(applied: Sequence[Applied]) -> dict[tuple[str, int], str]:
    """(stream, seq) -> what the frame rules make of the byzantine frame sent as that seq
    (:data:`.byzantine.ESCAPED` or :data:`.byzantine.MARKER`), from the history."""
    return {(stream, seq): CLASSES[name].expect for a in applied for stream, sent in a.sent.items() for seq, name in sent.items()}


def upstream_skipped(sockets: Iterable[SocketRecord], frames: Mapping[str, Mapping[int, object]]) -> set[int]:
    """Seqs a socket that asked for them went past without sending, by the upstream's
    books: below the first seq it sent (a replay from a later seq than asked), or never
    produced by its stream (a forward jump). Nobody owes those."""
    holes = {name: set(range(1, max(f, default=0) + 1)) - f.keys() for name, f in frames.items()}
    out: set[int] = set()
    for r in sockets:
        if r.first_seq_sent is None:
            continue
        out.update(range(r.from_seq, r.first_seq_sent))
        out.update(s for s in holes.get(r.stream, ()) if r.from_seq <= s <= r.last_seq_sent)
    return out


def check_data(cid: str, ev: Evidence, ops: Sequence[Op], timing: Timing, totals: dict[str, int],
               expected: Mapping[tuple[str, int], str]) -> list[tuple[str, str]]:
    """What is wrong with one connection's stored data, as (kind, detail) pairs; adds
    its rows and the frames of the streams it read to ``totals``."""
    out = []
    streams = ev.streams_of(cid)
    frames = {s: ev.frames.get(s, {}) for s in streams}
    produced_top = max((max(f, default=0) for f in frames.values()), default=0)
    skipped = upstream_skipped(ev.sockets_of(cid), frames)
    rows = sorted(ev.rows.get(cid, []), key=lambda r: r.seq)
    for row in rows:
        problem = _row_problem(row, streams, frames, expected, skipped)
        if problem is not None:
            out.append(problem)
    present = {r.seq for r in rows}
    top = max((r.seq for r in rows if 1 <= r.seq <= produced_top), default=0)
    checkpoint = ev.checkpoints.get(cid, 0)
    if checkpoint > produced_top:
        out.append(("lost", f"checkpoint {checkpoint} is past anything the upstream produced ({produced_top})"))
    end = max(top, min(checkpoint, produced_top))
    missing = [s for s in range(1, end + 1) if s not in present and s not in skipped]
    if missing:
        out.append(("lost", f"{len(missing)} seqs missing below {end} "
                             f"(checkpoint {checkpoint}), first {missing[:5]}"))
    # Produced well before the last STOP, never stored: the socket closed with them unread
    # only if they were sent at the very end.
    stops = [op.t for op in ops if op.connection_id == cid and op.action == "STOP"]
    if stops:
        last_stop = max(stops)
        cutoff_ms = (last_stop - timing.stop_bound_s - timing.flush_ms / 1000 - 1.0) * 1000
        current = _stream_at(cid, last_stop, ops, streams)
        unstored = [s for s, data in frames.get(current, {}).items()
                    if s > top and s not in skipped and data is not None and _produced_ms(data) < cutoff_ms]
        if unstored:
            out.append(("lost", f"{len(unstored)} frames produced before the last STOP were never "
                                 f"stored (stored 1..{top}, first unstored {min(unstored)})"))
    totals["stored"] += len(rows)
    read = [s for s in streams if ev.sockets.get(s)] or streams[:1]
    totals["produced"] += sum(len(frames[s]) for s in read)
    return out


def _row_problem(row: Row, streams: Sequence[str], frames: Mapping[str, Mapping[int, str | None]],
                 expected: Mapping[tuple[str, int], str], skipped: set[int]) -> tuple[str, str] | None:
    """(kind, detail) of what is wrong with one stored row, None if nothing is."""
    sent = [s for s in streams if row.seq in frames[s]]
    if row.skipped:
        if row.skipped == schema.SKIPPED_MALFORMED and any(expected.get((s, row.seq)) == MARKER for s in sent):
            return None
        if row.skipped == UPSTREAM_GAP and row.seq in skipped:
            return None
        return "corrupt", f"seq {row.seq} is a skip marker ({row.skipped}); the upstream sent {_sent(frames, sent, row.seq)}"
    if not sent:
        return "corrupt", f"seq {row.seq} holds {row.data[:80]!r}; the upstream never produced that seq"
    named = _field(row.data, "stream")
    stream = named if named in sent else sent[0]
    if expected.get((stream, row.seq)) == MARKER:
        return "corrupt", f"seq {row.seq} holds {row.data[:80]!r}; the upstream sent a frame the rules make a skip marker"
    want = frames[stream][row.seq]
    if want is not None and _same(row.data, want):
        return None
    v = _field(row.data, "v")
    if isinstance(v, int) and v != row.seq and v in frames[stream] and _same(row.data, frames[stream][v] or ""):
        return "doubled", f"seq {v}'s frame stored again as seq {row.seq} (fence {row.fence}, {row.worker})"
    return "corrupt", f"seq {row.seq} holds {row.data[:80]!r}, the upstream sent {_sent(frames, sent, row.seq)}"


def _sent(frames: Mapping[str, Mapping[int, str | None]], sent: Sequence[str], seq: int) -> str:
    if not sent:
        return "nothing as that seq"
    data = frames[sent[0]][seq]
    return repr(data[:80]) if data is not None else "a byzantine frame"


def _stream_at(cid: str, t: float, ops: Sequence[Op], streams: Sequence[str]) -> str:
    """The stream the connection's ws_url named at ``t`` (its last START's)."""
    starts = [op for op in ops if op.connection_id == cid and op.action == "START" and op.ws_url and op.t <= t]
    return stream_name(max(starts, key=lambda op: op.t).ws_url) if starts else streams[0]


def _produced_ms(data: str) -> float:
    try:
        return float(json.loads(data).get("t", 0))
    except (ValueError, AttributeError):
        return 0.0


def _field(data: str, name: str) -> object:
    """A member of a row's data, if it is a JSON object (None otherwise)."""
    try:
        return json.loads(data).get(name)
    except (ValueError, AttributeError):
        return None


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False
