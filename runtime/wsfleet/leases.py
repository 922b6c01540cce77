"""Session lease rules: pure decisions, no boto3 and no asyncio.

Ownership works like an etcd lease or a ZooKeeper session. Each worker process keeps
ONE session alive with one conditional write per heartbeat, and every connection it
owns is attached to that session. The one rule: **a connection is owned while its
session is LIVE and not expired; all of a session's connections are lost together when
it ends.** A session expired by more than the clock-skew margin may be ended by anyone
(conditional write), and only an ENDED session's connections may be taken.

Times come in two kinds and are never mixed:

* wall-clock epoch milliseconds (``*_ms``) are what is stored in DynamoDB and compared
  between workers; clocks can disagree by up to ``max_clock_skew_ms``;
* deadline-clock seconds (``*_mono``, from :func:`wsfleet.clock.now`) are what a worker
  uses to decide, on its own, when its session has run out. They never jump with the
  wall clock and they count time the machine spent suspended, so a paused, slow or
  suspended worker errs on the safe side.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from . import schema


class TimingError(ValueError):
    """Session timings that break the rule of :meth:`SessionTiming.checked`;
    :meth:`sentence` says which, in the caller's names for the three settings."""

    def __init__(self, broken: str, lease_s: float, heartbeat_s: float, max_clock_skew_ms: int) -> None:
        super().__init__(broken)
        self.broken = broken  # "lease" or "skew"
        self.lease_s, self.heartbeat_s, self.max_clock_skew_ms = lease_s, heartbeat_s, max_clock_skew_ms

    def sentence(self, *, lease: str, heartbeat: str, skew: str) -> str:
        if self.broken == "lease":
            return f"{lease} ({self.lease_s:g}) must be at least twice {heartbeat} ({self.heartbeat_s:g})"
        if self.max_clock_skew_ms < 0:
            return f"{skew} ({self.max_clock_skew_ms}) must be 0 or more"
        return (
            f"{skew} ({self.max_clock_skew_ms}) must be less than {lease} minus "
            f"{heartbeat} ({(self.lease_s - self.heartbeat_s) * 1000:.0f} ms)"
        )


@dataclass(frozen=True)
class SessionTiming:
    """The session timing and everything derived from it. The rule, checked by
    :meth:`checked` wherever timings are chosen (the worker's environment, the stacks'
    settings): the lease is at least two heartbeats, so one renewal may fail and the
    next still lands in time; the skew margin is below the lease less a heartbeat, so a
    holder's deadline is after its last renewal was sent."""

    lease_ms: int
    heartbeat_ms: int
    max_clock_skew_ms: int

    @classmethod
    def checked(cls, *, lease_s: float, heartbeat_s: float, max_clock_skew_ms: int) -> "SessionTiming":
        """The timing of a lease and a heartbeat in seconds; :class:`TimingError` if it
        breaks the rule."""
        if lease_s < 2 * heartbeat_s:
            raise TimingError("lease", lease_s, heartbeat_s, max_clock_skew_ms)
        if not 0 <= max_clock_skew_ms < (lease_s - heartbeat_s) * 1000:
            raise TimingError("skew", lease_s, heartbeat_s, max_clock_skew_ms)
        return cls(round(lease_s * 1000), round(heartbeat_s * 1000), max_clock_skew_ms)

    def expiry_ms(self, now_ms: int) -> int:
        return now_ms + self.lease_ms

    def deadline_mono(self, sent_mono: float) -> float:
        """When a worker must stop writing: from the moment its last successful renewal
        was *sent* (the stored expiry was computed after that), plus the lease, less the
        skew margin. One deadline for the whole worker."""
        return sent_mono + (self.lease_ms - self.max_clock_skew_ms) / 1000.0

    def endable_below_ms(self, now_ms: int) -> int:
        """A session whose expiry is below this may be ended: even a holder whose clock
        is ``max_clock_skew_ms`` behind ours has stopped writing by its own deadline."""
        return now_ms - self.max_clock_skew_ms

    def end_at_ms(self, expires_at_ms: int) -> int:
        """The first moment a session with this expiry may be ended."""
        return expires_at_ms + self.max_clock_skew_ms + 1

    def suspect(self, expires_at_ms: int, now_ms: int) -> bool:
        """A healthy session is renewed every heartbeat, so its expiry is always at
        least ``lease - heartbeat`` ahead. One further below has missed a renewal: its
        worker is probably gone, and its end is scheduled for the moment it expires.
        Half a heartbeat of slack keeps a renewal in flight from looking like a miss."""
        return expires_at_ms < now_ms + self.lease_ms - self.heartbeat_ms - self.heartbeat_ms // 2

    def watch_window_ms(self) -> int:
        """How long a dead session stays visible as suspect before it becomes endable:
        from its first missed renewal to its expiry plus the skew margin. Watching at
        least this often means every death is seen in time to end it at expiry."""
        return self.lease_ms - self.heartbeat_ms - self.heartbeat_ms // 2 + self.max_clock_skew_ms

    def watch_pause_s(self, rng: random.Random | None = None) -> float:
        """Pause between two reads of the watched sessions: 60-85 % of the watch
        window, so a read always lands inside it (at most 6.2 s with the defaults) with
        room for a slow read and a busy event loop."""
        return max(self.watch_window_ms(), 200) * (0.6 + 0.25 * (rng or random).random()) / 1000

    def mean_watch_pause_s(self) -> float:
        """:meth:`watch_pause_s` on average (the plan's and the pacing's figure)."""
        return self.watch_window_ms() * (0.6 + 0.25 / 2) / 1000

    def failover_bound_s(self, reconcile_ms: int) -> int:
        """How long a STARTED connection may stay unowned after its owner dies, in whole
        seconds:

            lease + skew margin + watch window + 2 x reconcile

        A crashed worker's session expires a lease after its last renewal. A watcher
        may end it once it is past the skew margin, and then takes or frees (and hints)
        its connections at once. Its watchers read it less than a watch window apart
        (:meth:`watch_pause_s`), so one read normally lands between the first missed
        renewal and that moment and the end is on time; a watcher that comes to it
        later (a read failed) ends it at its next read, about a window late. A freed
        connection whose hint is lost is found by the next scan of the FREE# shards
        (pauses of at most ``reconcile_ms``). The second interval is room: for a scan
        that had just passed its shard, takeover jitter, retries under throttling, and
        a worker that dies before its predecessors have refreshed their view of the
        ring (``wsfleet.worker.takeover.RING_REFRESH_S``) to watch it.
        """
        return math.ceil(
            (self.lease_ms + self.max_clock_skew_ms + self.watch_window_ms() + 2 * reconcile_ms) / 1000
        )

    def renew_retry_s(self, rng: random.Random | None = None) -> float:
        """Pause before retrying a failed renewal. It is one cheap request per worker,
        so it is retried often (about 8 times a second) rather than backed off: under
        throttling each try has the same chance, and the deadline is what matters."""
        return 0.08 + 0.08 * (rng or random).random()


def new_session_id(worker_id: str, started_at_ms: int, rng: random.Random | None = None) -> str:
    """``<worker_id>#<start ms>-<random>``: unique per worker run, never reused, so a
    condition on ``lease_session`` pins exactly one ownership epoch."""
    return f"{worker_id}#{started_at_ms}-{(rng or random).getrandbits(32):08x}"


def worker_of(session_id: str) -> str:
    """The worker id a session id (:func:`new_session_id`) was made for."""
    return session_id.rpartition("#")[0]


# --- failures, read from the item a conditional write failed on (ALL_OLD) --------------


class RenewFailure(enum.Enum):
    ENDED = "ended"  # someone ended it (it had expired): every connection is lost
    GONE = "gone"  # the item is missing: treat as ended


class EndFailure(enum.Enum):
    RENEWED = "renewed"  # still LIVE and not expired after all: watch on
    ALREADY_ENDED = "already_ended"  # someone else (or its worker) ended it first
    GONE = "gone"


class AcquireFailure(enum.Enum):
    HELD = "held"  # attached to another session than the one we expected
    STOPPED = "stopped"  # desired state is STOPPED
    NOT_FOUND = "not_found"  # no such connection
    NOT_LIVE = "not_live"  # the acquirer's own session is not LIVE: nothing may be attached to it
    QUARANTINED = "quarantined"  # the crash-loop breaker set it aside until a new START (wsfleet.crash_loop)


def classify_renew_failure(old: Mapping | None) -> RenewFailure:
    return RenewFailure.GONE if old is None else RenewFailure.ENDED


def classify_end_failure(old: Mapping | None) -> EndFailure:
    if old is None:
        return EndFailure.GONE
    if old.get(schema.SESSION_STATE) == schema.ENDED:
        return EndFailure.ALREADY_ENDED
    return EndFailure.RENEWED


def released_at_fence(item: Mapping | None) -> bool:
    """A graceful handoff left it attached to its session, released at its current
    fence (:data:`schema.RELEASED_FENCE`): that ownership writes nothing more, and any
    worker may take it, conditional on that session, that fence and the mark."""
    if item is None or schema.RELEASED_FENCE not in item:
        return False
    return int(item[schema.RELEASED_FENCE]) == int(item.get(schema.FENCE_TOKEN, -1))


def acquire_refusal(item: Mapping | None, *, expected_session: str) -> AcquireFailure | None:
    """Why a connection, as read, may not be taken as ``expected_session``'s ("" for a
    free one, an ENDED session's id for one of its connections), or None if it may:
    STARTED and attached to exactly that session, or released at its fence by the
    session it is attached to (a handoff to a named peer). A connection of any other
    session (a LIVE one, for all a taker knows) is never taken."""
    if item is None:
        return AcquireFailure.NOT_FOUND
    if item.get(schema.DESIRED_STATE) != schema.STARTED:
        return AcquireFailure.STOPPED
    if schema.QUARANTINED in item:
        return AcquireFailure.QUARANTINED
    if item.get(schema.LEASE_SESSION, "") != expected_session and not released_at_fence(item):
        return AcquireFailure.HELD
    return None


def acquire_already_landed(old: Mapping | None, session_id: str) -> bool:
    """A retried acquire whose first attempt did land finds the connection attached to
    our own session (and not released: one we handed off ourselves is not ours to hold)."""
    return (
        old is not None
        and old.get(schema.DESIRED_STATE) == schema.STARTED
        and old.get(schema.LEASE_SESSION) == session_id
        and not released_at_fence(old)
    )


def release_already_landed(old: Mapping | None, fence_token: int, session_id: str = "") -> bool:
    """A retried release whose first attempt landed finds it free at our fence, or (a
    handoff, ``session_id`` given) still attached to our session, released at our fence."""
    if old is None or int(old.get(schema.FENCE_TOKEN, -1)) != fence_token:
        return False
    if old.get(schema.LEASE_SESSION, "") == "":
        return True
    return bool(session_id) and old.get(schema.LEASE_SESSION) == session_id and released_at_fence(old)


def move_already_landed(old: Mapping | None, *, to_session: str, fence_token: int) -> bool:
    """A retried move whose first attempt landed finds the connection attached to its
    target at the fence after ``fence_token`` (the one the move gave it)."""
    return (
        old is not None
        and old.get(schema.LEASE_SESSION) == to_session
        and int(old.get(schema.FENCE_TOKEN, -1)) == fence_token + 1
    )


# While moves are likely on their way (worker.assignments), a worker reads its own session
# item this often between renewals (1 read unit, its own item); the plan counts a crash's
# survivors all reading at once.
INBOX_POLL_S = 0.25
# ... and otherwise once this long after it last saw it, every worker (the plan's "inbox").
INBOX_IDLE_POLL_S = 1.0

# --- reachability ----------------------------------------------------------------------


# A handoff is taken within a second or two; its releaser frees what is still unclaimed
# after HANDOFF_CLAIM_S (worker.handoffs). Past HANDOFF_UNREACHABLE_MS, a connection still
# released-attached to a LIVE session has been missed by both (a releaser that lost its
# memory of it): the reachability sweep repairs it.
HANDOFF_UNREACHABLE_MS = 60_000


class Unreachable(enum.Enum):
    """Why no worker would ever take a connection (each is a broken invariant)."""

    NOT_IN_FREE_POOL = "not_in_free_pool"  # STARTED, attached to nobody, in no FREE# partition
    SESSION_GONE = "session_gone"  # attached to a session whose item is gone (TTL, deleted)
    SESSION_LEFT_RING = "session_left_ring"  # attached to a session nobody watches any more
    HANDOFF_UNCLAIMED = "handoff_unclaimed"  # handed off by a LIVE session, untaken for too long


def unreachable(connection: Mapping, session: Mapping | None, *, now_ms: int = 0) -> Unreachable | None:
    """The reachability invariant, for one connection as read and the session it is
    attached to (None if that session's item is gone): None when some worker will take
    or already holds it, else why none will.

    Every connection is always reachable: free and STARTED in a ``FREE#`` partition (a
    free scan finds it), free and STOPPED (nothing to take), free and quarantined (set
    aside by the crash-loop breaker until a START: nothing to take either), or attached to a session in
    the watch ring: a LIVE one (its worker, or its watchers once it dies), or an ENDED
    one not yet drained. A STOPPED connection attached to a session counts too: its
    release is still to come, and a START would keep the attachment. A STARTED one a
    LIVE session handed off (released at its fence) counts for
    :data:`HANDOFF_UNREACHABLE_MS` after its release (``updated_at_ms``; ``now_ms``: the
    reader's clock, 0 not to judge age): its hint's taker, else its releaser, takes it
    or frees it by then."""
    session_id = connection.get(schema.LEASE_SESSION, "")
    if not session_id:
        free = str(connection.get(schema.OWNER_KEY, "")).startswith(schema.OWNER_KEY_FREE_PREFIX)
        # A quarantined one is out of the pool on purpose, until a new START.
        left = schema.QUARANTINED in connection or connection.get(schema.DESIRED_STATE) != schema.STARTED
        return None if free or left else Unreachable.NOT_IN_FREE_POOL
    if session is None:
        return Unreachable.SESSION_GONE
    if session.get(schema.RING) != schema.RING_VALUE:
        return Unreachable.SESSION_LEFT_RING
    if (
        now_ms
        and session.get(schema.SESSION_STATE) == schema.LIVE
        and connection.get(schema.DESIRED_STATE) == schema.STARTED
        and released_at_fence(connection)
        and now_ms - int(connection.get(schema.UPDATED_AT_MS, 0)) > HANDOFF_UNREACHABLE_MS
    ):
        return Unreachable.HANDOFF_UNCLAIMED
    return None


# --- the reachability sweep's pace --------------------------------------------------

SWEEP_PAGE_ITEMS = 200
SWEEP_PAGE_PAUSE_S = 1.0  # between two pages of a segment: at most SWEEP_PAGE_ITEMS a second each
SWEEP_FILL = 0.5  # a pass is sized to take at most this share of SWEEP_SECONDS
# Segments read at once at most (each a Scan in the AWS lane's threads): 3,200 connections
# a second, a pass over 960,000 within half of the default SWEEP_SECONDS.
SWEEP_MAX_SEGMENTS = 16
# A session read for one page is used for the pages of the next this many seconds: its
# state or ring membership changing meanwhile delays what the sweep sees of it by as
# much (a connection that looks unreachable is confirmed by a consistent read anyway).
SWEEP_SESSION_REUSE_S = 30.0


def sweep_segments(connections: int, *, sweep_s: float, page_items: int = SWEEP_PAGE_ITEMS) -> int:
    """How many segments a pass over about ``connections`` items scans in parallel so
    that it takes at most ``SWEEP_FILL`` of ``sweep_s``, each segment reading
    ``page_items`` every ``SWEEP_PAGE_PAUSE_S``: at least one, at most ``SWEEP_MAX_SEGMENTS``."""
    per_segment = page_items / SWEEP_PAGE_PAUSE_S * sweep_s * SWEEP_FILL
    return max(1, min(SWEEP_MAX_SEGMENTS, math.ceil(max(0, connections) / per_segment)))


def sweep_pass_s(connections: int, *, sweep_s: float, page_items: int = SWEEP_PAGE_ITEMS) -> float:
    """How long one pass over ``connections`` takes at :func:`sweep_segments` segments."""
    return connections / (sweep_segments(connections, sweep_s=sweep_s, page_items=page_items) * page_items / SWEEP_PAGE_PAUSE_S)

# --- watching: the ring --------------------------------------------------------------


def successors(ring: Sequence[str], me: str, k: int) -> list[str]:
    """The ``k`` sessions after ``me`` in the ring (sorted session ids, wrapping), not
    counting ``me``. Every session is watched by the ``k`` live sessions before it, so
    the fleet's watching costs O(workers) and a death is seen while any of its ``k``
    predecessors lives."""
    others = sorted(s for s in set(ring) if s != me)
    after = [s for s in others if s > me] + [s for s in others if s < me]
    return after[:k]


@dataclass(frozen=True)
class Watched:
    """A watched session as last read."""

    session_id: str
    state: str
    expires_at_ms: int


def watch_plan(sessions: Iterable[Watched], *, now_ms: int, timing: SessionTiming) -> tuple[list[str], list[tuple[str, int]]]:
    """From the watched sessions as read: (ENDED ones to drain now, [(suspect LIVE one,
    the wall-clock ms at which to end it)])."""
    drain, end = [], []
    for s in sessions:
        if s.state == schema.ENDED:
            drain.append(s.session_id)
        elif timing.suspect(s.expires_at_ms, now_ms):
            end.append((s.session_id, timing.end_at_ms(s.expires_at_ms)))
    return drain, end


# How far past its own successors a watcher reads when they look dead: a run of dead
# sessions in the ring this long is seen at once by the live session before it (a zone
# lost kills half the ring at random: runs of 5 and more are common in a large fleet).
WATCH_FURTHER_MAX = 14


def watch_reach(sessions: Iterable[Watched], *, k: int, now_ms: int, timing: SessionTiming) -> int:
    """How many successors to watch: ``k``, and one more past each watched one that is
    ENDED or suspect (up to :data:`WATCH_FURTHER_MAX` more). A session whose ``k`` watchers
    died with it is then seen by the live session before them as soon as they look dead,
    not only once they have been drained and have left the ring (two empty drains and a
    ring read later: about 25 s with the defaults, longer for a longer run of them)."""
    gone = sum(1 for s in sessions if s.state == schema.ENDED or timing.suspect(s.expires_at_ms, now_ms))
    return k + min(WATCH_FURTHER_MAX, gone)


def drain_split(count: int, free: int) -> int:
    """How many of a dead session's ``count`` connections the drainer acquires itself;
    the rest it frees and hints, so that the whole fleet shares the takeover instead of
    the one watcher that ended the session. It keeps half its room for other work."""
    return max(0, min(count, (free + 1) // 2))


# --- pacing --------------------------------------------------------------------------


def takeover_jitter_s(load: float, rng: random.Random | None = None) -> float:
    """Delay before racing to end a dead session: a little jitter, plus more the busier
    this worker is, so that the least loaded of its watchers tends to win."""
    r = (rng or random).random()
    return 0.02 + 0.08 * r + 0.2 * min(max(load, 0.0), 1.0)


# The free scan's pause grows to at most this many RECONCILE_SECONDS while scans find
# nothing: a lost hint is found within that (plus one scan) by any worker with room.
RECONCILE_BACKOFF_CAP = 8


def reconcile_pause_s(reconcile_ms: int, rng: random.Random | None = None, *, idle_scans: int = 0) -> float:
    """Pause between scans for STARTED connections nobody owns (lost hints):
    RECONCILE_SECONDS jittered down to three quarters of it, so that workers started
    together do not scan in step; doubled after each scan in a row that found nothing
    (``idle_scans``), up to :data:`RECONCILE_BACKOFF_CAP` times, so that a quiet fleet
    does not read its FREE# partitions every RECONCILE_SECONDS from every worker."""
    factor = min(RECONCILE_BACKOFF_CAP, 2 ** min(max(idle_scans, 0), 16))
    return factor * reconcile_ms * (0.75 + 0.25 * (rng or random).random()) / 1000


def hint_pause_s(load: float, rng: random.Random | None = None) -> float:
    """Pause before the next hint poll after taking one: nothing when idle, up to half
    a second when full, so that peers with room get the next hints first."""
    return 0.5 * min(max(load, 0.0), 1.0) * (rng or random).random()


def backoff_s(attempt: int, *, base: float = 0.1, cap: float = 5.0, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff for the ``attempt``-th retry (0-based)."""
    r = (rng or random).random()
    return r * min(cap, base * (2 ** min(attempt, 30)))
