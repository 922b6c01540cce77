"""The crash-loop breaker's rules, pure (no I/O): which connection a worker names as its
prime suspect, and what the death of an owner that named it counts against it.

* **The prime suspect.** Every renewal of a worker's session names the connection that
  costs it most right now: the most bytes received from its sockets (frames, pings and
  all: what the worker had to read, hold and parse: a memory death), else the most event
  loop time its frames took (a stalled loop: missed renewals), each summed over the last
  few heartbeats (halved at every renewal). Only a remarkable one is named: at least
  :data:`SUSPECT_MIN_BYTES` (or :data:`SUSPECT_MIN_LOOP_S`) and at least
  :data:`SUSPECT_SHARE` of the worker's whole. A worker with nothing remarkable names
  none. It is written by the renewal the worker makes anyway (no write of its own), with
  the ownership's fence.
* **Strikes.** The worker that ends a dead session counts one strike against the suspect
  that session named, and against nothing else: a neighbour that shared the dead
  workers is never struck. A strike is for one ownership (its fence), so it counts once
  however often it is written (a write applied with its answer lost finds its own
  strike and counts nothing more). None while the ender's own renewals failed within a
  lease: an outage longer than the lease ends every session at once (worker.takeover).
* **Consecutive.** A strike continues the run when it is for the ownership right after
  the one the previous strike was for (fence + 1) and within :data:`WINDOW_MS` of the
  run's first strike; otherwise the run starts again at 1. So an owner that let the
  connection go alive (a STOP, a shed, a shutdown), or that died naming another suspect,
  breaks the run: the next strike's ownership is not the next one.
* **Quarantine.** The ``QUARANTINE_AFTER``-th strike of a run quarantines the connection:
  no acquisition takes it (a condition of the store's), until a new START clears it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import schema

WINDOW_MS = 15 * 60 * 1000  # a run of strikes counts within this of its first
# A connection is named only when it brought at least this much over the last few
# heartbeats (halved at each: about twice one heartbeat's worth) ...
SUSPECT_MIN_BYTES = 256 * 1024
# ... or took at least this much of the event loop ...
SUSPECT_MIN_LOOP_S = 0.25
# ... and at least this share of all the worker received (or of all its loop time): one
# of a hundred busy but alike connections is no suspect.
SUSPECT_SHARE = 0.25


@dataclass(frozen=True)
class Suspect:
    """A worker's prime suspect: one of its ownerships (connection and fence), and why."""

    connection_id: str
    fence_token: int
    why: str

    def item(self) -> dict[str, Any]:
        return {"connection_id": self.connection_id, "fence_token": self.fence_token, "why": self.why}

    @classmethod
    def from_item(cls, value: Any) -> Suspect | None:
        """The suspect a session item names (None: none, or not one)."""
        if not isinstance(value, Mapping):
            return None
        cid, fence, why = value.get("connection_id"), value.get("fence_token"), value.get("why")
        if not isinstance(cid, str) or not cid or fence is None:
            return None
        return cls(cid, int(fence), str(why or ""))


class SuspectWatch:
    """What each ownership cost, halved at every renewal; names the prime suspect."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], tuple[int, float]] = {}  # ownership -> its totals at the previous look
        self._score: dict[tuple[str, int], tuple[float, float]] = {}  # ownership -> (bytes, loop s), decayed

    def look(self, costs: Mapping[tuple[str, int], tuple[int, float]]) -> Suspect | None:
        """``costs``: for each ownership held now (connection id, fence), the bytes its
        sockets received and the loop seconds its frames took, so far. Returns the prime
        suspect, or None when nothing is remarkable."""
        score = {}
        for key, (total_bytes, total_s) in costs.items():
            seen_bytes, seen_s = self._seen.get(key, (0, 0.0))
            old_bytes, old_s = self._score.get(key, (0.0, 0.0))
            score[key] = (old_bytes / 2 + max(0, total_bytes - seen_bytes), old_s / 2 + max(0.0, total_s - seen_s))
        self._seen, self._score = dict(costs), score
        for which, floor, unit, fmt in ((0, SUSPECT_MIN_BYTES, "bytes received", ".0f"), (1, SUSPECT_MIN_LOOP_S, "event-loop seconds", ".2f")):
            if not score:
                return None
            key, top = max(((k, v[which]) for k, v in score.items()), key=lambda kv: (kv[1], kv[0]))
            everything = sum(v[which] for v in score.values())
            if top >= floor and top >= SUSPECT_SHARE * everything:
                return Suspect(key[0], key[1], f"most {unit}: {top:{fmt}} of the worker's {everything:{fmt}} over its last heartbeats")
        return None


@dataclass(frozen=True)
class Strike:
    """What one strike writes on the connection item."""

    strikes: int  # in the run, this one included
    since_ms: int  # the run's first strike
    fence_token: int  # the ownership it is for
    quarantined: dict[str, Any] | None  # {"reason", "at_ms"} when this strike quarantines it


def strike(item: Mapping[str, Any] | None, suspect: Suspect, *, now_ms: int, quarantine_after: int) -> Strike | None:
    """The strike the death of ``suspect``'s owner counts against the connection as read
    (``item``), or None when it counts none: gone, STOPPED, quarantined already, or this
    ownership (or a later one) struck already."""
    if item is None or item.get(schema.DESIRED_STATE) != schema.STARTED or schema.QUARANTINED in item:
        return None
    last = item.get(schema.STRIKE_FENCE)
    if last is not None and int(last) >= suspect.fence_token:
        return None
    run = (
        last is not None
        and int(last) == suspect.fence_token - 1
        and now_ms - int(item.get(schema.STRIKES_SINCE_MS, 0)) <= WINDOW_MS
    )
    strikes = int(item.get(schema.STRIKES, 0)) + 1 if run else 1
    since = int(item.get(schema.STRIKES_SINCE_MS, now_ms)) if run else now_ms
    quarantined = None
    if strikes >= quarantine_after:
        minutes = max(1, round((now_ms - since) / 60_000))
        reason = (
            f"crash_loop: the prime suspect of {strikes} consecutive deaths of its owners within {minutes} min"
            f" (the last: {suspect.why}); START it again (or wsfleet retry) to run it again"
        )
        quarantined = {"reason": reason, "at_ms": now_ms}
    return Strike(strikes, since, suspect.fence_token, quarantined)
