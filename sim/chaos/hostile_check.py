"""How a chaos run with hostile peers is judged (``--hostile``): pure, no I/O.

The hostile connections (:data:`KINDS`, one of each) are STARTed with the soak's others
and the nemesis never aims a fault at them (its kills and pauses still hit their
workers). Their own data is excluded from the soak's ``lost`` / ``doubled`` / ``corrupt``
audit, as the attack legitimately keeps frames from being stored; what is still checked
of them:

* ``hostile_data``: every stored row of a hostile connection is a skip marker or exactly
  what its upstream sent as that seq (``firehose``: :func:`sim.upstream.kinds.firehose_data`;
  ``amplify``: the stream's ordinary frame, or at an amplified seq a list of ``{}``);
  ``ping_flood`` and ``slow_handshake`` sockets are sent no numbered frame, so any data
  row is one; and a connection that stored anything stored every seq from 1 to its
  highest (no hole: each socket resumes where the store left off);
* overlaps on their streams and stale fences are the soak's own checks (every stream,
  every stored row's journal entry), and a worker exiting unasked is ``crash``;
* ``hostile_error``: a connection whose kind has a budget (:data:`EXPECTED_ERROR`) carries
  a ``last_error`` naming it within :data:`LAST_ERROR_S` of its first socket (as read by
  the run every :data:`POLL_S`). Kinds with none are reported, not judged: the contract
  names no budget for them (a slow handshake's open timeout writes no ``last_error``);
* ``neighbour_gap``: the healthy connections are untouched: two stored frames
  at consecutive seqs, stored under one fence (one ownership), both received inside a
  quiet window, are at most :data:`NEIGHBOUR_GAP_S` apart (CONTRACT.md section 3). The
  quiet windows are the run from the hostile STARTs (the warm-up has no fault) to the last
  heal, less every fault's span (from its start to the end of its recovery bound, and of
  its slack), so no fault's own gap is counted; an ownership move
  changes the fence, so a takeover's or a shed's gap is not counted either.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Sequence

from ..upstream.kinds import firehose_data, parse_request
from .evidence import Row
from .history import Applied
from .recovery import bound_for
from .schedule import MAX_FRAME_BYTES, Bounds

# Kind -> the URL query of its hostile connection, sized to the chaos workers (their
# MAX_FRAME_BYTES is 1 MiB: an amplification frame below it reaches the decoder's child)
# and to one emulator (the firehose: 200 frames a second, 100 times a healthy stream).
KINDS = {
    "ping_flood": "ping_flood=2000",
    "amplify": f"amplify={MAX_FRAME_BYTES - (64 << 10)}&amplify_every=20",
    "firehose": "firehose=200",
    "slow_handshake": "slow_handshake=3600",
}
AMPLIFY = parse_request("/?" + KINDS["amplify"])[1]
PREFIX = "hostile-"
EXPECTED_ERROR = {"ping_flood": "control_flood"}
LAST_ERROR_S = 30.0
POLL_S = 2.0
NEIGHBOUR_GAP_S = 1.0
VIOLATION_KINDS = ("hostile_data", "hostile_error", "neighbour_gap")


def connection_id(kind: str) -> str:
    return PREFIX + kind


def kind_of(cid: str) -> str:
    return cid[len(PREFIX):]


@dataclass
class HostileEvidence:
    """What the run saw of its hostile connections (epoch seconds)."""

    rows: dict[str, list[Row]]  # per hostile connection
    frames: dict[str, dict[int, str | None]]  # per hostile connection: its stream's books
    first_socket_at: dict[str, float | None]
    errors: dict[str, list[tuple[float, str]]]  # per hostile connection: last_error as polled, when it changed
    chaos: tuple[float, float]  # judged from (the hostile STARTs) to (every fault healed)
    held_handshakes: dict[str, tuple[int, int]] = field(default_factory=dict)


def check_rows(cid: str, rows: Sequence[Row], frames: dict[int, str | None]) -> list[str]:
    kind, out = kind_of(cid), []
    for r in rows:
        if r.skipped:
            continue
        if kind == "firehose":
            want: str | None = json.dumps(firehose_data(cid, r.seq), separators=(",", ":"))
        elif kind == "amplify":
            want = frames.get(r.seq)
            if AMPLIFY.amplifies(r.seq) and (r.data == "" or r.data.startswith("[{}") and set(r.data) <= set("[{},]")):
                continue  # the amplification frame itself, stored (by reference, or inline) within the budgets
        else:
            want = None  # sent no numbered frame
        if r.data != want:
            out.append(f"seq {r.seq}: stored {r.data[:60]!r}, its upstream sent {str(want)[:60]!r}")
    seqs = sorted(r.seq for r in rows)
    if seqs and seqs != list(range(1, seqs[-1] + 1)):
        missing = sorted(set(range(1, seqs[-1] + 1)) - set(seqs))
        out.append(f"{len(missing)} seqs missing below its highest stored ({seqs[-1]}): first {missing[:5]}")
    return out


def check_error(cid: str, first_socket_at: float | None, errors: Sequence[tuple[float, str]], slack_s: float) -> str | None:
    budget = EXPECTED_ERROR.get(kind_of(cid))
    if budget is None:
        return None
    if first_socket_at is None:
        return "no socket was ever opened"
    named = next((t for t, text in errors if text and text.startswith(budget)), None)
    late = first_socket_at + LAST_ERROR_S + POLL_S + slack_s
    if named is None or named > late:
        seen = f"seen {named - first_socket_at:.1f}s after its first socket" if named else "never seen"
        return f"last_error naming {budget} {seen} (bound {LAST_ERROR_S:g}s)"
    return None


def quiet_windows(applied: Sequence[Applied], chaos: tuple[float, float], bounds: Bounds, slack_s: float) -> list[tuple[float, float]]:
    """The chaos phase less every fault's span, as (start, end) intervals."""
    spans = []
    for a in applied:
        ends = [a.started_at, a.healed_at or 0.0, a.resumed_at or 0.0, *a.affected.values()]
        spans.append((a.started_at, max(ends) + bound_for(a, bounds) + slack_s))
    out, at = [], chaos[0]
    for start, end in sorted(spans):
        if start > at:
            out.append((at, min(start, chaos[1])))
        at = max(at, end)
    if at < chaos[1]:
        out.append((at, chaos[1]))
    return [(a, b) for a, b in out if b > a]


def neighbour_gaps(rows: Sequence[Row], quiet: Sequence[tuple[float, float]], bound_s: float) -> tuple[int, int, list[str]]:
    """(pairs judged, longest gap ms among them, the gaps over ``bound_s``) of one healthy
    connection's rows."""
    judged, longest, over = 0, 0, []
    ordered = sorted(rows, key=lambda r: r.seq)
    for a, b in itertools.pairwise(ordered):
        if b.seq != a.seq + 1 or a.skipped or b.skipped or a.fence != b.fence:
            continue
        ta, tb = a.received_at_ms / 1000, b.received_at_ms / 1000
        if not any(lo <= ta and tb <= hi for lo, hi in quiet):
            continue
        judged += 1
        gap = b.received_at_ms - a.received_at_ms
        longest = max(longest, gap)
        if gap > bound_s * 1000:
            over.append(f"seqs {a.seq}-{b.seq} received {gap} ms apart at {ta:.3f} (fence {a.fence}, {a.worker})")
    return judged, longest, over


def check(ev: HostileEvidence, healthy_rows: dict[str, list[Row]], applied: Sequence[Applied], bounds: Bounds,
          slack_s: float) -> tuple[list[tuple[str, str, str]], dict[str, int], list[str]]:
    """(violations as (kind, what, detail), totals, notes)."""
    violations: list[tuple[str, str, str]] = []
    totals: dict[str, int] = {}
    notes = []
    for cid, rows in ev.rows.items():
        violations += [("hostile_data", cid, d) for d in check_rows(cid, rows, ev.frames.get(cid, {}))]
        problem = check_error(cid, ev.first_socket_at.get(cid), ev.errors.get(cid, []), slack_s)
        if problem is not None:
            violations.append(("hostile_error", cid, problem))
        totals[f"hostile_{kind_of(cid)}_rows"] = sum(1 for r in rows if not r.skipped)
        totals[f"hostile_{kind_of(cid)}_markers"] = sum(1 for r in rows if r.skipped)
        first = ev.first_socket_at.get(cid)
        seen = [(t, text) for t, text in ev.errors.get(cid, []) if text]
        notes.append(f"{cid}: " + (f"last_error {seen[0][1].split(':')[0]!r} seen {seen[0][0] - first:.1f}s after its "
                                   f"first socket" if seen and first else "no last_error seen")
                     + f"; {totals[f'hostile_{kind_of(cid)}_rows']} data rows, "
                     f"{totals[f'hostile_{kind_of(cid)}_markers']} skip markers")
    for cid, (held, gave_up) in ev.held_handshakes.items():
        notes.append(f"{cid}: {held} upgrades held back, {gave_up} given up by the worker first")
    quiet = quiet_windows(applied, ev.chaos, bounds, slack_s)
    judged = longest = 0
    for cid, rows in healthy_rows.items():
        n, most, over = neighbour_gaps(rows, quiet, NEIGHBOUR_GAP_S + slack_s)
        judged, longest = judged + n, max(longest, most)
        violations += [("neighbour_gap", cid, d) for d in over]
    totals["neighbour_pairs_judged"] = judged
    totals["neighbour_longest_gap_ms"] = longest
    totals["quiet_s"] = int(sum(b - a for a, b in quiet))
    return violations, totals, notes
