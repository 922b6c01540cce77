"""Fair share: pure decisions for spreading connections over the fleet (no boto3, no
asyncio).

A worker's fair share is the fleet's held connections split in proportion to each
taking worker's MAX_CONNECTIONS (workers that are shutting down take nothing and are not
counted as capacity). A worker above its share by more than a tolerance band sheds the
excess gradually, by the graceful handoff it already has; workers under their share take
what is shed. No churn:

* hysteresis: nothing moves while a worker is within ``tolerance`` of its share, and a
  worker never sheds below its share;
* a connection held for less than ``min_hold_s`` is never moved (so none moves twice);
* nothing is shed while the fleet is recovering from a crash (a session expired or ended
  and not yet drained);
* at most ``max_moves`` per balance pass, so a big join does not reconnect everything
  at once.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from . import schema
from .leases import SessionTiming


@dataclass(frozen=True)
class FleetLoad:
    """The fleet summary: what the last session of the ring last read of every session."""

    workers: int
    active: int
    capacity: int
    below_share: int
    suspects: int
    at_ms: int
    # The sessions under their share and by how much (the largest UNDER_LISTED), so that
    # a shedder can name where each connection it sheds should go.
    under: Mapping[str, int] = field(default_factory=dict)
    # ... and those above it, by how much: every shedder working from this summary
    # computes the same plan (shed_targets), so together they fill each exactly.
    over: Mapping[str, int] = field(default_factory=dict)

    def share(self, max_connections: int) -> float:
        """This worker's fair share of the fleet's connections."""
        return self.active * max_connections / self.capacity if self.capacity else 0.0

    def as_item(self) -> dict[str, int]:
        return {
            schema.FLEET_WORKERS: self.workers,
            schema.FLEET_ACTIVE: self.active,
            schema.FLEET_CAPACITY: self.capacity,
            schema.FLEET_BELOW_SHARE: self.below_share,
            schema.FLEET_SUSPECTS: self.suspects,
            schema.FLEET_AT_MS: self.at_ms,
            schema.FLEET_UNDER: dict(self.under),
            schema.FLEET_OVER: dict(self.over),
        }

    @classmethod
    def from_item(cls, item: Mapping) -> "FleetLoad":
        return cls(
            workers=int(item.get(schema.FLEET_WORKERS, 0)),
            active=int(item.get(schema.FLEET_ACTIVE, 0)),
            capacity=int(item.get(schema.FLEET_CAPACITY, 0)),
            below_share=int(item.get(schema.FLEET_BELOW_SHARE, 0)),
            suspects=int(item.get(schema.FLEET_SUSPECTS, 0)),
            at_ms=int(item.get(schema.FLEET_AT_MS, 0)),
            under={str(k): int(v) for k, v in (item.get(schema.FLEET_UNDER) or {}).items()},
            over={str(k): int(v) for k, v in (item.get(schema.FLEET_OVER) or {}).items()},
        )


def summarize(sessions: Iterable[Mapping], *, now_ms: int, timing: SessionTiming) -> FleetLoad:
    """The fleet summary from every session in the ring, as read. A session that missed
    a renewal (:meth:`SessionTiming.suspect`) still counts its connections, but takes
    none: its worker is probably gone, and a summary listing it under its share would
    have the others leave free connections to it until it expired."""
    live, suspects = [], 0
    for s in sessions:
        if s.get(schema.SESSION_STATE) == schema.LIVE and int(s.get(schema.EXPIRES_AT_MS, 0)) >= now_ms:
            live.append(s)
        else:
            suspects += 1  # expired, or ENDED and still in the ring: not drained yet
    takers = [
        s
        for s in live
        if not s.get(schema.DRAINING) and not timing.suspect(int(s.get(schema.EXPIRES_AT_MS, 0)), now_ms)
    ]
    active = sum(int(s.get(schema.ACTIVE, 0)) for s in live)
    capacity = sum(int(s.get(schema.MAX_CONNECTIONS, 0)) for s in takers)
    under: dict[str, int] = {}
    over: dict[str, int] = {}
    if capacity:
        for s in takers:
            share = math.ceil(active * int(s.get(schema.MAX_CONNECTIONS, 0)) / capacity)
            held = int(s.get(schema.ACTIVE, 0))
            if share > held:
                under[s[schema.SESSION_ID]] = share - held
            elif held > share:
                over[s[schema.SESSION_ID]] = held - share
    return FleetLoad(
        len(takers), active, capacity, sum(under.values()), suspects, now_ms, _largest(under), _largest(over)
    )


def _largest(amounts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(amounts.items(), key=lambda kv: (-kv[1], kv[0]))[:UNDER_LISTED])


def shed_targets(fleet: FleetLoad, me: str, n: int, rng: random.Random | None = None) -> list[str]:
    """Where to send the ``n`` connections ``me`` sheds now: sessions under their share.

    Every shedder working from one summary computes the same plan: the deficits laid out
    in a row (sessions in id order, each as many times as it is under), the excesses
    likewise, and each shedder sends its excess to the part of the row facing its own.
    So together they fill each session exactly to its share, none more. A shedder the
    summary does not list as over (a stale summary) picks in proportion to the
    deficits. "" for any beyond the row (anyone under share)."""
    row = [sid for sid, deficit in sorted(fleet.under.items()) for _ in range(max(0, int(deficit)))]
    if me in fleet.over:
        offset = sum(excess for sid, excess in sorted(fleet.over.items()) if sid < me)
        chosen = row[offset : offset + n]
    else:
        chosen = (rng or random).sample(row, min(n, len(row)))
    return chosen + [""] * (n - len(chosen))


UNDER_LISTED = 25  # sessions under (and over) their share named in the summary
# A shed hint that names its target is left to that session this long; then any worker
# under its share may take it, and after SHED_ANYONE_AFTER_S anyone (the target may be
# gone, or full, or the summary stale): a shed connection is never left unowned.
SHED_TARGET_WAIT_S = 2.0
SHED_ANYONE_AFTER_S = 4.0


def is_summarizer(me: str, successors: list[str]) -> bool:
    """The last session of the ring writes the summary: its first successor wraps around
    to the start (or it has none). Known from the ring reads it makes anyway."""
    return not successors or successors[0] < me


def shed_count(
    *, active: int, max_connections: int, fleet: FleetLoad, tolerance: float, max_moves: int, recovering: bool
) -> int:
    """How many connections to shed now: down to (never below) the fair share, at most
    ``max_moves``, never while the fleet is recovering; only when above the share by more
    than the tolerance band, or above it at all while the workers under theirs have more
    room than the band (a newcomer is filled to its share, not to its share less the
    band). Shares are rounded up, so in a balanced fleet nobody is above theirs and
    nothing moves."""
    if recovering or fleet.suspects or not fleet.capacity:
        return 0
    target = math.ceil(fleet.share(max_connections))
    band = max(1, math.ceil(tolerance * target))
    if active <= target or (active <= target + band and fleet.below_share <= band):
        return 0
    return min(active - target, max_moves)


def max_moves(max_connections: int) -> int:
    """Moves per balance pass: a fifth of a worker's capacity, at least one: a fleet at
    40 % of its capacity that doubles its workers at once moves in one pass. A second
    pass plans from a newer summary, which may not yet show what the first moved."""
    return max(1, math.ceil(max_connections / 5))


def declines_shed_hint(
    *,
    active: int,
    max_connections: int,
    fleet: FleetLoad | None,
    shed_by_me: bool,
    age_s: float,
    shed_to: str = "",
    me: str = "",
) -> bool:
    """Whether to leave a connection another worker shed. One that names its target
    (``shed_to``) is the target's for ``SHED_TARGET_WAIT_S``; then, like one that names
    none, it is for workers under their share: its shedder never takes it back and a
    worker at or above its share leaves it while the summary says some worker is under
    theirs. After ``SHED_ANYONE_AFTER_S`` anyone takes it, so that neither a stale
    summary nor a target that went away leaves it bouncing."""
    if shed_to and shed_to == me:
        # Ours, unless we are at our share already (counting what we hold now, which
        # the summary the shedder planned from may not show): then it goes on to
        # another worker under its share rather than move again later.
        return fleet is not None and active >= math.ceil(fleet.share(max_connections)) and age_s < SHED_ANYONE_AFTER_S
    if age_s >= SHED_ANYONE_AFTER_S:
        return False
    if shed_to and age_s < SHED_TARGET_WAIT_S:
        return True
    if shed_by_me:
        return True
    if fleet is None or fleet.below_share <= 0:
        return False
    return active >= math.ceil(fleet.share(max_connections))


def hints_per_poll(*, active: int, max_connections: int, room: int, fleet: FleetLoad | None) -> int:
    """How many hints one poll asks for: as many as this worker is under its fair share
    (up to ten, SQS's most, and never past its room), else one. A replacement or a
    newcomer takes a drain's, a leaving worker's or a shedder's hints by the ten; a
    worker at its share takes one at a time, so a START burst on a fleet of idle workers
    spreads over all of them instead of landing by the ten on whichever polls first."""
    under = math.ceil(fleet.share(max_connections)) - active if fleet else 0
    return max(1, min(10, room, under))
