"""Recovery: how long each connection a fault touched took to be whole again, against
the fault's bound. Pure functions over the evidence and the history.

"Whole" depends on the fault. After a takeover (kill, SIGSTOP, SIGTERM, the clock swap,
SIGTERM during a drain or a START burst, a close the upstream stalls) or a dropped or
oversized socket (or one dropped to replay from another seq), or a START with a new
url: a new socket on the connection's streams, the upstream's books say when. A
graceful handoff (SIGTERM or the clock swap, a replacement up) is timed from the close
of the socket that was open at the SIGTERM, not from the SIGTERM: the leaver hands its
connections over a few at a time, each socket open and its frames stored until its own
turn (``worker.shutdown.HANDOFF_CONCURRENCY``), so the connection is whole until then
and the time without a socket is its gap; from the SIGTERM, the last of 21 waited 3.6 s
with its socket up (``Recovery.since_signal_s`` keeps that figure for the report). After a
START (storm, SQS outage): a new socket, or owned by a live session with one socket
open (its owner may have kept it). After a stall or a slow stream: its socket has been
sent everything produced until the fault healed. After a DynamoDB fault (ambiguous
writes included): owned by a live session, with one socket open (the observer's
snapshots). After a bad frame: nothing to recover, the socket must stay up (the
checker's ``malformed_closed``).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Sequence

from .evidence import Evidence, Snapshot
from .history import Applied
from .schedule import FRAMES, Bounds

TAKEOVERS = (
    "kill", "pause", "term", "clock", "drop", "oversize", "replay_offset", "drain_term", "burst_term", "close_stall", "flip",
)
STARTS = ("storm", "sqs_outage")  # timed from a START
GRACEFUL = ("term", "clock")  # timed from the close of the socket open at the SIGTERM
CATCH_UP = ("stall", "slow")


@dataclass
class Recovery:
    """How long each connection a fault affected took to be whole again."""

    applied: Applied
    bound_s: float
    took_s: dict[str, float | None]
    since_signal_s: float | None = None  # a graceful handoff's whole handover (see GRACEFUL)

    @property
    def done(self) -> list[float]:
        return sorted(t for t in self.took_s.values() if t is not None)

    @property
    def time_s(self) -> float | None:
        """The fault's recovery time: until its last affected connection was whole."""
        return self.done[-1] if self.done and len(self.done) == len(self.took_s) else (0.0 if not self.took_s else None)

    def span(self) -> tuple[float, float]:
        """From the first reference time of the fault to when its last connection was
        whole again (its bound, for one that never was): epoch seconds."""
        a = self.applied
        if not a.affected:
            return a.started_at, a.healed_at or a.started_at
        ends = [ref + (took if took is not None else self.bound_s) for cid, ref in a.affected.items()
                for took in [self.took_s.get(cid)]]
        return min(a.affected.values()), max(ends)


def bound_for(a: Applied, bounds: Bounds) -> float:
    bound = bounds.for_kind(a.kind, a.trigger)
    crash = a.kind in ("kill", "pause", "drain_term") or a.trigger == "lost"
    if crash and (a.victim_session_age_s is None or a.victim_session_age_s < bounds.settle_s):
        bound += bounds.unwatched_extra_s  # a session this young may not be watched yet
    return bound


def recovery(a: Applied, ev: Evidence, bounds: Bounds, slack_s: float, times: Sequence[float]) -> Recovery:
    took: dict[str, float | None] = {}
    since_signal: list[float | None] = []  # a graceful handoff's, each from the SIGTERM
    for cid, ref in a.affected.items():
        sockets = ev.sockets_of(cid)
        opened = [s.opened_at - ref for s in sockets if s.opened_at >= ref]
        if a.kind in GRACEFUL:
            since_signal.append(min(opened) if opened else None)
        if a.kind in GRACEFUL and opened:
            took[cid] = max(0.0, min(opened) - _open_until(sockets, ref))
        elif a.kind in TAKEOVERS:
            # A new socket: the victim's (killed, frozen, leaving) or the dropped one is gone.
            took[cid] = min(opened) if opened else None
        elif a.kind in STARTS:
            # A new socket, or the one its owner kept (the STOP before had not reached it).
            whole = _first_whole(ev.snapshots, times, ref, cid, caught_up=False)
            took[cid] = min([t for t in (*opened, whole) if t is not None], default=None)
        elif a.kind in FRAMES:
            took[cid] = 0.0  # the socket must simply stay up: see malformed_closed
        else:
            took[cid] = _first_whole(ev.snapshots, times, ref, cid, caught_up=a.kind in CATCH_UP)
    whole = max(since_signal) if since_signal and None not in since_signal else None
    return Recovery(a, bound_for(a, bounds) + slack_s, took, whole)


def _open_until(sockets: Sequence, ref: float) -> float:
    """Seconds from ``ref`` to the close of the last socket open at ``ref`` (0 if none
    was, or it is still open: then the new socket's time counts from ``ref``)."""
    closes = [s.closed_at for s in sockets if s.opened_at < ref and s.closed_at is not None and s.closed_at > ref]
    still_open = any(s.opened_at < ref and s.closed_at is None for s in sockets)
    return max(closes) - ref if closes and not still_open else 0.0


def _first_whole(
    snapshots: Sequence[Snapshot], times: Sequence[float], ref: float, cid: str, *, caught_up: bool
) -> float | None:
    """Seconds from ``ref`` to the first snapshot (from the last one before it) in which
    the connection has a live owner and one open socket, and with ``caught_up`` that
    socket has been sent everything produced by ``ref``; 0 if it already was at ``ref``.
    ``times``: the snapshots' times."""
    first = max(0, bisect.bisect_right(times, ref) - 1)
    head = snapshots[first].heads.get(cid, 0) if snapshots and times[first] <= ref else 0
    for s in snapshots[first:]:
        if s.owners.get(cid) and s.open_sockets.get(cid) == 1 and (not caught_up or s.sent_heads.get(cid, 0) >= head):
            return max(0.0, s.t - ref)
    return None


def kind_summary(recoveries: Sequence[Recovery]) -> dict[str, dict[str, float | int | None]]:
    """Per fault kind: how many, recovery p50 and max (of each fault's recovery time), bound."""
    out: dict[str, dict[str, float | int | None]] = {}
    for kind in dict.fromkeys(r.applied.kind for r in recoveries):
        rs = [r for r in recoveries if r.applied.kind == kind]
        times = [r.time_s for r in rs if r.time_s is not None]
        out[kind] = {
            "faults": len(rs),
            "connections": sum(len(r.took_s) for r in rs),
            "p50_s": statistics.median(times) if times else None,
            "max_s": max(times) if times else None,
            "bound_s": max(r.bound_s for r in rs),
            "over_bound": sum(1 for r in rs if r.time_s is None or r.time_s > r.bound_s),
        }
    return out
