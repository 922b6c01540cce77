"""The worker's decisions about a hint, a drain, a move and a STOP, without I/O.

No boto3, no asyncio, no clock read: what a decision needs (the worker's load, the fleet
summary, the time) is passed in, and what to do comes back as a value the worker's roles
then carry out (:mod:`.intake`, :mod:`.takeover`, :mod:`.balancer`, :mod:`.stops`). The
fleet-wide rules they apply are :mod:`wsfleet.balance`'s and :mod:`wsfleet.leases`'s.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Iterable, Mapping

from .. import schema
from ..balance import (
    FleetLoad,
    declines_shed_hint,
    hints_per_poll,
    ring_lag_ms,
    shed_count,
    shed_targets,
    under_target,
)
from ..leases import drain_split

# --- where this worker stands ----------------------------------------------------------


@dataclass(frozen=True)
class Standing:
    """This worker's load against the fleet summary, at one moment: ``active`` counts what
    it holds and what it is acquiring; ``fleet`` is None when no fresh summary is known;
    ``me`` is its session id."""

    active: int
    max_connections: int
    fleet: FleetLoad | None
    me: str

    @property
    def room(self) -> int:
        return self.max_connections - self.active

    def declines_shed(self, shed_by: str, age_s: float = 0.0) -> bool:
        """Whether to leave a connection ``shed_by`` shed (see
        :func:`wsfleet.balance.declines_shed_hint`)."""
        return declines_shed_hint(
            active=self.active,
            max_connections=self.max_connections,
            fleet=self.fleet,
            shed_by_me=shed_by == self.me,
            age_s=age_s,
            me=self.me,
        )

    def under_target(self) -> bool:
        return under_target(active=self.active, max_connections=self.max_connections, fleet=self.fleet, me=self.me)

    def hints_per_poll(self) -> int:
        return hints_per_poll(
            active=self.active, max_connections=self.max_connections, room=self.room, fleet=self.fleet, me=self.me
        )

    def scan_room(self) -> int:
        """How many the free scan may take: none while this worker would leave a shed
        connection for a peer under its share (what a peer shed goes to that one)."""
        return 0 if self.declines_shed("") else self.room


# --- a START hint ----------------------------------------------------------------------


@dataclass(frozen=True)
class Hint:
    connection_id: str | None  # None when the body is malformed
    shed_by: str = ""  # the shedding session
    from_session: str = ""  # the ENDED session it is still attached to
    released: dict | None = None  # the connection item as its clean release left it


def parse_hint(body: str) -> Hint:
    """A hint's body, read leniently: anything malformed beyond the connection id is
    left out (a hint is only ever a suggestion; the conditional acquire decides)."""
    try:
        obj = json.loads(body)
        value = obj.get(schema.HINT_CONNECTION_ID)
        fields = [obj.get(name, "") for name in (schema.HINT_SHED_BY, schema.HINT_FROM_SESSION)]
        released = obj.get(schema.HINT_RELEASED)
    except (ValueError, AttributeError):
        return Hint(None)
    if not isinstance(value, str) or not value:
        return Hint(None)
    shed_by, from_session = (f if isinstance(f, str) else "" for f in fields)
    return Hint(value, shed_by, from_session, schema.item_from_released(value, released))


def hint_age_s(attributes: Mapping[str, str], wall_s: float) -> float:
    """How long ago the hint was sent (``wall_s``: epoch seconds now); without its
    SentTimestamp, a second per earlier receive."""
    sent_ms = attributes.get("SentTimestamp")
    if sent_ms:
        return max(0.0, wall_s - int(sent_ms) / 1000)
    return float(int(attributes.get("ApproximateReceiveCount", 1)) - 1)


SHED_VISIBILITY_S = 2  # a declined shed's hint is visible again after this


class HintAction(enum.Enum):
    BAD = "bad"  # malformed: deleted
    KEEP = "keep"  # left in the queue, visible again after ``visibility_s``
    TAKE = "take"  # acquire it, then delete the hint
    DONE = "done"  # already ours (or being acquired): deleted


@dataclass(frozen=True)
class HintChoice:
    action: HintAction
    visibility_s: int = 0  # KEEP: when it is visible again
    declined_shed: bool = False  # a shed one we leave (logged as such)
    source: str = ""  # TAKE: what the acquisition is counted as


def choose_hint(
    hint: Hint, *, age_s: float, accepting: bool, busy: bool, ending: bool, standing: Standing
) -> HintChoice:
    """What to do with one START hint. ``busy``: held here or being acquired; ``ending``:
    held here but being released (a STOP, a shed)."""
    if hint.connection_id is None:
        return HintChoice(HintAction.BAD)
    if not accepting or (not busy and standing.room <= 0):
        return HintChoice(HintAction.KEEP)  # no room (or no session) here: back to the queue for a peer, now
    if ending:
        # A START that came while we release the connection for its STOP (or a shed):
        # it is for whoever takes it once released, us included. Look again shortly.
        return HintChoice(HintAction.KEEP, visibility_s=1)
    if hint.shed_by and not busy and standing.declines_shed(hint.shed_by, age_s):
        # Shed to rebalance, for nobody in particular: for a worker under its share, back
        # in two seconds (a shed meant for one worker is moved to it: worker.moves). Two,
        # not one: a worker at its share declines one for SHED_ANYONE_AFTER_S, and the queue
        # dead-letters a hint at its 5th receive; at one a second that was the edge.
        return HintChoice(HintAction.KEEP, visibility_s=SHED_VISIBILITY_S, declined_shed=True)
    if busy:
        return HintChoice(HintAction.DONE)
    # A crash's connection hinted by its drainer is an orphan, not a move.
    source = "orphan" if hint.from_session else "rebalance" if hint.shed_by else "hint"
    return HintChoice(HintAction.TAKE, source=source)


# --- a dead session's connections --------------------------------------------------------


@dataclass(frozen=True)
class DrainSplit:
    mine: list[str]  # acquired here
    named: list[tuple[str, str]]  # hinted naming the session meant to take each
    anyone: list[str]  # hinted for anyone


def split_drain(started: list[str], plan: list[str] | None, *, me: str, room: int, take: int | None = None) -> DrainSplit:
    """Split a dead session's STARTED connections by the fleet's ``plan`` (one session
    id, or "" for anyone, per connection: :func:`wsfleet.balance.drain_targets`): this
    worker takes what the plan gives it as far as its ``room`` goes (the rest to anyone)
    and names the planned survivor for each of the others. Without a plan: ``take`` here
    (its own part, :func:`wsfleet.balance.drain_share`, when a summary is known) or, with
    no summary at all, :func:`wsfleet.leases.drain_split` (half its room); the rest to
    anyone."""
    room = max(0, room)
    if plan is None:
        n = drain_split(len(started), room) if take is None else min(max(0, take), room)
        return DrainSplit(started[:n], [], started[n:])
    mine = [cid for cid, to in zip(started, plan, strict=True) if to == me]
    named = [(cid, to) for cid, to in zip(started, plan, strict=True) if to and to != me]
    anyone = [cid for cid, to in zip(started, plan, strict=True) if not to] + mine[room:]
    return DrainSplit(mine[:room], named, anyone)


REHINT_S = 20.0  # a drainer's hint of a dead session's connection is in the queue until then


def fresh_hints(connection_ids: Iterable[str], hinted: dict[str, float], now: float) -> list[str]:
    """Those of ``connection_ids`` not hinted here in the last ``REHINT_S`` (``hinted``: when each
    was; updated, pruned): a dead session is drained at every watch read until it is empty."""
    for cid in [cid for cid, at in hinted.items() if now - at >= REHINT_S]:
        del hinted[cid]
    fresh = [cid for cid in dict.fromkeys(connection_ids) if cid not in hinted]
    hinted.update(dict.fromkeys(fresh, now))
    return fresh


# --- a move --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """One connection as the balancer sees it."""

    connection_id: str
    acquired_at: float  # when it was acquired (clock.now())
    ending: bool  # being released already (a STOP, a shed, a shutdown)


def choose_shed(
    held: Iterable[Held],
    *,
    fleet: FleetLoad,
    me: str,
    max_connections: int,
    tolerance: float,
    max_moves: int,
    recovering: bool,
    last_acquired_ms: int,
    heartbeat_ms: int,
    now: float,
    min_hold_s: float,
    settling: bool = False,
    room: int = schema.ASSIGNED_MAX,
) -> list[tuple[str, str]]:
    """What to shed now and the session each is meant for ("" for anyone under its
    share): down to this worker's fair share (:func:`wsfleet.balance.shed_count`), the
    oldest held first, none held for less than ``min_hold_s``. Nothing on a summary that
    cannot count us yet: one taken before our latest acquisition reached the ring index
    (:func:`wsfleet.balance.ring_lag_ms`, two heartbeats at most) undercounts the fleet,
    and a fleet that is filling up would shed. ``settling``, ``room``: see
    :func:`wsfleet.balance.shed_count`."""
    held = list(held)
    if last_acquired_ms + ring_lag_ms(heartbeat_ms) >= fleet.at_ms or fleet.active < len(held):
        return []
    n = shed_count(  # down from what stays: those being released already (a shed not done yet) are gone
        active=sum(not h.ending for h in held),
        max_connections=max_connections,
        fleet=fleet,
        tolerance=tolerance,
        max_moves=max_moves,
        recovering=recovering,
        me=me,
        settling=settling,
        room=room,
    )
    movable = sorted(
        (h for h in held if not h.ending and now - h.acquired_at >= min_hold_s), key=lambda h: h.acquired_at
    )[:n]
    return [(h.connection_id, to) for h, to in zip(movable, shed_targets(fleet, me, len(movable), room=room), strict=True)]


# --- a STOP from the session's inbox ----------------------------------------------------------


class StopAction(enum.Enum):
    WAIT = "wait"  # not held yet, or being handed off: it stays in the inbox for the next renewal
    STOP = "stop"  # ours: release it, STOPPED
    STOP_HANDED = "stop_handed"  # handed off and not taken yet: free it, STOPPED
    IGNORE = "ignore"  # another ownership's (an older fence), or nothing of ours: done


def choose_stop(*, acquiring: bool, held_fence: int | None, handing_off: bool, handed: bool, fence: int) -> StopAction:
    """What a STOP for one ownership (``fence``) of a connection asks of us.
    ``held_fence``: the fence we hold it at, None when no runner holds it;
    ``handing_off``: its runner is releasing it for a shutdown or a shed; ``handed``: it
    is a handoff of ours nobody has taken yet."""
    if acquiring:
        return StopAction.WAIT
    if held_fence is not None:
        if held_fence != fence:
            return StopAction.IGNORE
        return StopAction.WAIT if handing_off else StopAction.STOP
    return StopAction.STOP_HANDED if handed else StopAction.IGNORE
