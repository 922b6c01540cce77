"""Fair share: pure decisions for spreading connections over the fleet (no boto3, no
asyncio).

A worker's fair share is the fleet's held connections split in proportion to each
taking worker's MAX_CONNECTIONS (workers that are shutting down take nothing and are not
counted as capacity). A worker above its share by more than a tolerance band sheds the
excess gradually, by the graceful handoff it already has; workers under their share take
what is shed. No churn:

* exact targets: each worker's share rounded by the largest remainder, so that the
  targets add up to the fleet's connections (:func:`exact_targets`, :func:`target`);
* hysteresis: nothing moves while a worker is within ``tolerance`` of its target and
  every other within one of theirs, and a worker never sheds below its target;
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
from .leases import SessionTiming, Watched


SUMMARY_MAX_AGE_MS = 60_000  # a summary older than this is not acted on (FleetLoad.fresh_at)


@dataclass(frozen=True)
class FleetLoad:
    """The fleet summary: what the last session of the ring last read of every session."""

    workers: int
    active: int
    capacity: int
    below_share: int
    suspects: int
    at_ms: int
    # The sessions under their target and by how much (the largest UNDER_LISTED), so
    # that a shedder can name where each connection it sheds should go.
    under: Mapping[str, int] = field(default_factory=dict)
    # ... and those above it, by how much: every shedder working from this summary
    # computes the same plan (shed_targets), so together they fill each exactly.
    over: Mapping[str, int] = field(default_factory=dict)
    # Where the largest remainders end (see :func:`target`): the remainder
    # ``active * max_connections % capacity`` of the last taker given one more than its
    # floor, and its session id. None: a summary without a cut (rounded up, as before).
    cut_rem: int | None = None
    cut_id: str = ""
    # Every taker's (held, max_connections), in a fleet of at most LOADS_LISTED takers
    # (empty in a larger one), and the sessions being recovered with the connections
    # they last reported (the largest LOADS_LISTED): what a drain plans from
    # (:func:`drain_targets`) without reading the ring.
    loads: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    dead: Mapping[str, int] = field(default_factory=dict)

    def target(self, session_id: str, max_connections: int) -> int:
        """This worker's exact target: see :func:`target`."""
        return target(self, session_id, max_connections)

    def fresh_at(self, now_ms: int) -> bool:
        """Young enough to act on: an older summary's writer may be gone."""
        return now_ms - self.at_ms <= SUMMARY_MAX_AGE_MS

    @property
    def max_deficit(self) -> int:
        """How far the worker furthest under its target is under it (the list names the
        largest deficits, so this is exact)."""
        return max(self.under.values(), default=0)

    def figures(self) -> dict:
        """Everything but the time it was taken: what tells a changed summary."""
        return {k: v for k, v in self.as_item().items() if k != schema.FLEET_AT_MS}

    def as_item(self) -> dict:
        item = {
            schema.FLEET_WORKERS: self.workers,
            schema.FLEET_ACTIVE: self.active,
            schema.FLEET_CAPACITY: self.capacity,
            schema.FLEET_BELOW_SHARE: self.below_share,
            schema.FLEET_SUSPECTS: self.suspects,
            schema.FLEET_AT_MS: self.at_ms,
            schema.FLEET_UNDER: dict(self.under),
            schema.FLEET_OVER: dict(self.over),
        }
        if self.cut_rem is not None:
            item[schema.FLEET_CUT_REM] = self.cut_rem
            item[schema.FLEET_CUT_ID] = self.cut_id
        if self.loads:
            item[schema.FLEET_LOADS] = {sid: list(load) for sid, load in self.loads.items()}
        if self.dead:
            item[schema.FLEET_DEAD] = dict(self.dead)
        return item

    @classmethod
    def from_item(cls, item: Mapping) -> "FleetLoad":
        cut = item.get(schema.FLEET_CUT_REM)
        return cls(
            workers=int(item.get(schema.FLEET_WORKERS, 0)),
            active=int(item.get(schema.FLEET_ACTIVE, 0)),
            capacity=int(item.get(schema.FLEET_CAPACITY, 0)),
            below_share=int(item.get(schema.FLEET_BELOW_SHARE, 0)),
            suspects=int(item.get(schema.FLEET_SUSPECTS, 0)),
            at_ms=int(item.get(schema.FLEET_AT_MS, 0)),
            under={str(k): int(v) for k, v in (item.get(schema.FLEET_UNDER) or {}).items()},
            over={str(k): int(v) for k, v in (item.get(schema.FLEET_OVER) or {}).items()},
            cut_rem=None if cut is None else int(cut),
            cut_id=str(item.get(schema.FLEET_CUT_ID, "")),
            loads={str(k): (int(v[0]), int(v[1])) for k, v in (item.get(schema.FLEET_LOADS) or {}).items()},
            dead={str(k): int(v) for k, v in (item.get(schema.FLEET_DEAD) or {}).items()},
        )


# --- exact targets: the largest remainder --------------------------------------------


def exact_targets(takers: Mapping[str, int], active: int) -> tuple[dict[str, int], int, str]:
    """Split ``active`` connections over ``takers`` ({session id: MAX_CONNECTIONS}) in
    proportion to their capacity, exactly: everyone gets the floor of its share, and the
    largest fractional remainders one more each (ties to the smaller session id, so that
    every worker computes the same), as many as the floors leave over. Integers only
    (``active * max`` stays far below DynamoDB's 38 digits). Returns (targets, the cut's
    remainder, the cut's session id): a worker given one more has a remainder above the
    cut's, or equal to it and an id not above it (:func:`target`); with nothing left over
    the cut is (capacity, ""), which no remainder reaches."""
    capacity = sum(takers.values())
    if not capacity:
        return {sid: 0 for sid in takers}, 0, ""
    floors = {sid: active * m // capacity for sid, m in takers.items()}
    rems = {sid: active * m % capacity for sid, m in takers.items()}
    extra = active - sum(floors.values())
    ranked = sorted(takers, key=lambda sid: (-rems[sid], sid))[:extra]
    for sid in ranked:
        floors[sid] += 1
    cut_rem, cut_id = (rems[ranked[-1]], ranked[-1]) if ranked else (capacity, "")
    return floors, cut_rem, cut_id


def target(fleet: FleetLoad, session_id: str, max_connections: int) -> int:
    """A worker's exact target from the summary alone (it lists neither every worker nor
    every target): the floor of its share, plus one if its remainder is at or before the
    cut (see :func:`exact_targets`). The targets of the summary's takers add up to its
    ``active`` exactly. A summary without a cut (written by an older worker) rounds up."""
    if not fleet.capacity:
        return 0
    base, rem = divmod(fleet.active * max_connections, fleet.capacity)
    if fleet.cut_rem is None:
        return base + (rem > 0)
    return base + (rem > fleet.cut_rem or (rem == fleet.cut_rem and session_id <= fleet.cut_id))


def summarize(
    sessions: Iterable[Mapping],
    *,
    now_ms: int,
    timing: SessionTiming,
    watched: Mapping[str, Watched] | None = None,
    active_at_least: int = 0,
) -> FleetLoad:
    """The fleet summary from every session in the ring, as read (the ``by_ring`` index
    projects what it needs: state, active, max_connections, draining; never the expiry,
    which changes at every renewal and would have the index written at each).

    Liveness therefore comes from the state and from what the summarizer's own watch
    knows (``watched``: its successors' expiries; an item's own ``expires_at_ms`` is used
    when a read carries it). An ENDED session still in the ring is a suspect: the fleet
    is recovering. The cost of not reading expiries: a crashed session that nobody has
    ended yet, and that the summarizer does not watch, counts as a taker until its
    watchers end it (about a lease plus the skew margin); a move to it is refused once it
    has ended, and goes to anyone. A session that missed a
    renewal (:meth:`SessionTiming.suspect`) still counts its connections but takes none:
    listed under its target, it would have the others leave free connections to it."""
    watched = watched or {}
    live, dead = [], {}
    for s in sessions:
        sid = s.get(schema.SESSION_ID, "")
        if s.get(schema.EXPIRES_AT_MS) is not None:  # read with the item: as fresh as the summary
            expires, fresh = int(s[schema.EXPIRES_AT_MS]), True
        elif sid in watched:
            # From the summarizer's last watch read, up to a watch pause old: a healthy
            # session's expiry then looks as near as a late one's, so it only tells an
            # expired session (a heartbeat's grace for the read's age), never a missed
            # renewal (a summary that took every watched session for gone left them out
            # of the takers: seen as a join that waited 90 s with every target wrong).
            expires, fresh = watched[sid].expires_at_ms + timing.heartbeat_ms, False
        else:
            expires, fresh = None, False
        if s.get(schema.SESSION_STATE) == schema.LIVE and (expires is None or expires >= now_ms):
            live.append((s, expires, fresh))
        else:
            dead[sid] = int(s.get(schema.ACTIVE, 0))  # expired, or ENDED and still in the ring: not drained yet
    takers = {
        s[schema.SESSION_ID]: int(s.get(schema.MAX_CONNECTIONS, 0))
        for s, expires, fresh in live
        if not s.get(schema.DRAINING) and not (fresh and timing.suspect(expires, now_ms))
    }
    held = {s[schema.SESSION_ID]: int(s.get(schema.ACTIVE, 0)) for s, _, _ in live}
    # ``active_at_least``: the summarizer's recent highest count (see
    # :data:`IN_TRANSIT_S`): a read taken while connections move between a shedder and a
    # taker misses them, and targets from it are too low (a worker at its target shed 6
    # for one of 19 on a count of 95 of 100). Counting high only makes targets high for a
    # moment: someone sheds less, never below its real target.
    active = max(sum(held.values()), active_at_least)
    targets, cut_rem, cut_id = exact_targets(takers, active)
    under = {sid: t - held[sid] for sid, t in targets.items() if t > held[sid]}
    over = {sid: held[sid] - t for sid, t in targets.items() if held[sid] > t}
    return FleetLoad(
        len(takers),
        active,
        sum(takers.values()),
        sum(under.values()),
        len(dead),
        now_ms,
        _largest(under, UNDER_LISTED),
        _largest(over, OVER_LISTED),
        cut_rem,
        cut_id,
        {sid: (held[sid], m) for sid, m in takers.items()} if len(takers) <= LOADS_LISTED else {},
        _largest(dead, LOADS_LISTED),
    )


def _largest(amounts: Mapping[str, int], most: int) -> dict[str, int]:
    return dict(sorted(amounts.items(), key=lambda kv: (-kv[1], kv[0]))[:most])


def shed_targets(
    fleet: FleetLoad, me: str, n: int, rng: random.Random | None = None, *, room: int = schema.ASSIGNED_MAX
) -> list[str]:
    """Where to send the ``n`` connections ``me`` sheds now: sessions under their target.

    Every shedder working from one summary computes the same plan: the deficits laid out
    in a row (sessions in id order, each as many times as it is under), the excesses
    likewise, and each shedder sends its excess to the part of the row facing its own.
    So together they fill each session exactly to its target, none more. A shedder the
    summary does not list as over (a stale summary) picks in proportion to the
    deficits. "" for any beyond the row (anyone under target).

    The row counts at most ``room`` a session (:func:`pass_room`). With more shedders than
    the summary lists (``OVER_LISTED``), each picks at random."""
    under = {sid: min(deficit, room) for sid, deficit in fleet.under.items()}
    if me in fleet.over and len(fleet.over) < OVER_LISTED:
        return _facing(under, fleet.over, me, n, pace(fleet, room))
    row = _row(under)
    chosen = (rng or random).sample(row, min(n, len(row)))
    return chosen + [""] * (n - len(chosen))


def _row(deficits: Mapping[str, int]) -> list[str]:
    """The deficits laid out in a row: sessions in id order, each as many times as it is under."""
    return [sid for sid, deficit in sorted(deficits.items()) for _ in range(max(0, int(deficit)))]


def _facing(deficits: Mapping[str, int], movers: Mapping[str, int], me: str, n: int, f: float = 1.0) -> list[str]:
    """``me``'s part of the one plan every mover computes alike: the deficits in a row,
    the movers' amounts likewise (in id order, each paced by ``f``: :func:`paced`), and
    ``me``'s ``n`` facing its own part of it; "" for any beyond the row."""
    offset = math.floor(f * sum(amount for sid, amount in movers.items() if sid < me))
    chosen = _row(deficits)[offset : offset + n]
    return chosen + [""] * (n - len(chosen))


def drain_targets(fleet: FleetLoad, *, dead_session: str, count: int) -> list[str] | None:
    """Where each of a crashed session's ``count`` STARTED connections should go, from the
    fleet summary alone (no read of the ring: O(1) reads a drain at any fleet size): the
    survivors' exact targets over the fleet without the dead sessions. The survivors (the
    summary's takers, less the dead) are filled from their held counts to their targets:
    their deficits laid out in a row (in id order, each as many times as it is under),
    the dead sessions' connections likewise (those the summary lists as being recovered,
    each with the load it last reported; ``dead_session`` with ``count``), and each dead
    session's part of the row is its plan. Every drainer of a crash that works from the
    same summary computes the same plan, so together they fill each survivor to its
    target. "" for any beyond the row (anyone).

    The summary lists every taker's load only in a fleet of at most
    :data:`LOADS_LISTED` takers; in a larger one, and when the summary shows no survivor
    with room, None: the drainer takes its own part (:func:`drain_share`) and hints the
    rest for anyone (workers under their target take them by the ten). The summary may be a few seconds old: a survivor it counts low may be
    named one too many (its pickup frees and hints what it has no room for), a crashed
    session it still counts as a taker may be named (the move is refused once it has
    ended, and the connection hinted for anyone)."""
    if not fleet.loads or len(fleet.loads) < fleet.workers:
        return None
    dead = {sid: n for sid, n in fleet.dead.items() if sid != dead_session}
    # ``fleet.active`` counts the LIVE sessions: the dead session too while the summary
    # still took it for a taker (its listed load is replaced by ``count``), never the
    # sessions it lists as dead.
    total = fleet.active - fleet.loads.get(dead_session, (0, 0))[0] + sum(dead.values()) + count
    dead[dead_session] = count
    survivors = {sid: m for sid, (_, m) in fleet.loads.items() if sid not in dead}
    if not sum(survivors.values()):
        return None
    targets, _, _ = exact_targets(survivors, total)
    return _facing({sid: targets[sid] - fleet.loads[sid][0] for sid in targets}, dead, dead_session, count)


def drain_share(fleet: FleetLoad, *, count: int, active: int, max_connections: int, me: str = "") -> int:
    """How many of a dead session's ``count`` connections its drainer takes itself when
    the summary cannot plan them (a fleet larger than :data:`LOADS_LISTED` takers): as
    many as bring it to its target once the dead session's connections are spread over
    the fleet in proportion to capacity (its target by the summary, plus its part of
    ``count``), never fewer than none. The rest are hinted for anyone: in a crash of many
    sessions every survivor takes its part from the hints, where a drainer that took half
    its room would end above its target by about that much, for a rebalance to move
    again."""
    if not fleet.capacity:
        return 0
    part = -(-count * max_connections // fleet.capacity)  # rounded up
    return max(0, fleet.target(me, max_connections) + part - active)


# A moved connection is missing from the counts from its release (the shedder's count
# falls) until its taker's next renewal reports it (a heartbeat or two): the summarizer
# counts the fleet as at least its highest count this long ago (a STOP's fall shows
# after it).
IN_TRANSIT_S = 10.0

# A renewal writes a changed count to the ring index (where the summarizer reads it) only
# if this many renewals since the last that wrote the load did not: at most one index
# write per worker every two heartbeats, whatever moves (:func:`ring_write_due`).
RING_WRITE_GAP = 1
RING_WRITE_EVERY = RING_WRITE_GAP + 1  # renewals: a changed count reaches the ring at most once in this many


def ring_write_due(stored: tuple[int, int, bool] | None, load: tuple[int, int, bool], *, renewals_since: int) -> bool:
    """Whether a renewal writes the load ``(active, max_connections, draining)`` it
    reports (projected into the ring index, all of it in one partition): always when
    what is stored is unknown (``None``: the first renewal, or one whose answer was
    lost) or its capacity or draining changed (the summary must stop counting a leaving
    worker as a taker at once); a changed count only once ``renewals_since`` (landed
    renewals since the one that last wrote the load) reaches :data:`RING_WRITE_GAP`.
    So a count that changes at every heartbeat (a crash's survivors taking their share,
    a deploy's tasks handing over and taking) is written every other one: the ring's
    writes are bounded by the workers, not by how fast counts move, and a count in the
    index is at most two heartbeats behind (:func:`ring_lag_ms`)."""
    if stored is None or stored[1:] != load[1:]:
        return True
    return stored[0] != load[0] and renewals_since >= RING_WRITE_GAP


def ring_lag_ms(heartbeat_ms: int) -> int:
    """How far behind a worker's count in the ring index can be: the renewal that would
    carry a change may be one that :func:`ring_write_due` skips."""
    return RING_WRITE_EVERY * heartbeat_ms


# The fleet summary rides along with every third watch read (0.5 read units a reader
# every ~16 s: 1.1 per connection-hour at 100 per worker, at any fleet size). It stays
# out of the ring partition: a ring Query returns the sessions after ours, never also the
# summary, and an item in the index would double every summary write.
SUMMARY_EVERY = 3
UNDER_LISTED = 128  # sessions under their share named in the summary: where sheds go
OVER_LISTED = 25
PACE_OF_ROOM = 0.75  # of a named session's inbox between two passes, what sheds aim to fill
# Every taker's load is in the summary while there are at most this many (a drain plans
# from it: :func:`drain_targets`), and the dead sessions are listed up to this many:
# about 59 bytes an entry, the #fleet item is 11 KB at its largest (plan/bursts.py).
LOADS_LISTED = 32
# A shed hint (one meant for nobody in particular) is for workers under their share this
# long; then anyone takes it (the summary may be stale): it is never left unowned.
SHED_ANYONE_AFTER_S = 4.0
SETTLE_S = 120.0  # a rebalance seen begun is settled to within one this long: twice MIN_HOLD_S


def is_summarizer(me: str, successors: list[str] | None) -> bool:
    """The last session of the ring writes the summary: its first successor wraps around
    to the start (or it has none). Known from the ring reads it makes anyway; None, its
    ring not read yet (a worker just started), is not the summarizer: every worker that
    starts would read the whole ring once (a fleet of 2,000 started at once, 2,000 reads
    of every session from the one ring partition)."""
    return successors is not None and (not successors or successors[0] < me)


def shed_count(
    *,
    active: int,
    max_connections: int,
    fleet: FleetLoad,
    tolerance: float,
    max_moves: int,
    recovering: bool,
    me: str = "",
    settling: bool = False,
    room: int = schema.ASSIGNED_MAX,
) -> int:
    """How many connections to shed now: down to (never below) the exact target, at
    most ``max_moves``, never while the fleet is recovering. The band: a worker above its
    target by no more than ``tolerance`` of it (at least one connection) stays, while
    every other worker is within one of its target. Once one is further under (a
    newcomer; or, after a join, 13 for a target of 15 while two hold 16: the old rule
    compared the band with the whole fleet's room, 2, and let it stay), every worker
    above its target sheds to it; ``settling`` (:data:`SETTLE_S`), the band is one. Targets
    add up to the fleet's connections: in a balanced fleet nothing moves. At most
    :func:`paced`."""
    if recovering or fleet.suspects or not fleet.capacity:
        return 0
    goal = fleet.target(me, max_connections)
    band = 1 if settling else max(1, math.ceil(tolerance * goal))
    if active <= goal or (active <= goal + band and fleet.max_deficit <= 1):
        return 0
    return min(active - goal, max_moves, paced(active - goal, fleet, room=room, me=me))


def pace(fleet: FleetLoad, room: int) -> float:
    """Each shedder's fraction a pass: together, 3/4 of what :func:`pass_room` lets the named take."""
    named = sum(min(d, room) for d in fleet.under.values())
    if not named or fleet.below_share <= named:
        return 1.0  # (a summary naming nobody: its sheds are hinted for anyone under its share)
    return PACE_OF_ROOM * named / fleet.below_share  # (a quarter short: random picks and a summary's lag overshoot)


def paced(excess: int, fleet: FleetLoad, rng: random.Random | None = None, *, room: int = schema.ASSIGNED_MAX,
          me: str = "") -> int:
    """A pass's part of ``excess`` (:func:`pace`): exact for a shedder with its part of one plan
    (:func:`shed_targets`), else at random between the whole numbers around it."""
    f = pace(fleet, room)
    if f >= 1.0:
        return excess
    if me in fleet.over and len(fleet.over) < OVER_LISTED:
        before = sum(amount for sid, amount in fleet.over.items() if sid < me)
        return math.floor(f * (before + excess)) - math.floor(f * before)
    whole = int(excess * f)
    return whole + ((rng or random).random() < excess * f - whole)


def pass_room(timing: SessionTiming) -> int:
    """Moves sent one session between two passes of a shedder (a summary read, every ``SUMMARY_EVERY``
    watch reads): ``PACE_OF_ROOM`` of its inbox's ``ASSIGNED_MAX`` a renewal: 0.75 x 6 x 48 = 216."""
    renewals = int(SUMMARY_EVERY * timing.mean_watch_pause_s() * 1000 // timing.heartbeat_ms)
    return int(PACE_OF_ROOM * schema.ASSIGNED_MAX * max(1, renewals))


def max_moves(max_connections: int) -> int:
    """Moves per balance pass: a fifth of a worker's capacity, at least one: a fleet at
    40 % of its capacity that doubles its workers at once moves in one pass. A second
    pass plans from a newer summary, which may not yet show what the first moved."""
    return max(1, math.ceil(max_connections / 5))


def declines_shed_hint(
    *, active: int, max_connections: int, fleet: FleetLoad | None, shed_by_me: bool, age_s: float, me: str = ""
) -> bool:
    """Whether to leave a connection another worker shed for nobody in particular (one
    meant for a worker is moved to it, never hinted: :mod:`wsfleet.worker.moves`): it is
    for workers under their share. Its shedder never takes it back, and a worker at or
    above its share leaves it while the summary says some worker is under theirs. After
    ``SHED_ANYONE_AFTER_S`` anyone takes it, so that a stale summary never leaves it
    bouncing."""
    if age_s >= SHED_ANYONE_AFTER_S:
        return False
    if shed_by_me:
        return True
    if fleet is None or fleet.below_share <= 0:
        return False
    return active >= fleet.target(me, max_connections)


def under_target(*, active: int, max_connections: int, fleet: FleetLoad | None, me: str = "") -> bool:
    """Below this worker's exact target by the summary: shed connections may be named for it."""
    return fleet is not None and active < fleet.target(me, max_connections)


def hints_per_poll(*, active: int, max_connections: int, room: int, fleet: FleetLoad | None, me: str = "") -> int:
    """How many hints one poll asks for: as many as this worker is under its fair share
    (up to ten, SQS's most, and never past its room), else one. A replacement or a
    newcomer takes a drain's, a leaving worker's or a shedder's hints by the ten; a
    worker at its share takes one at a time, so a START burst on a fleet of idle workers
    spreads over all of them instead of landing by the ten on whichever polls first."""
    under = fleet.target(me, max_connections) - active if fleet else 0
    return max(1, min(10, room, under))
