"""Lease rules: pure decisions, no boto3 and no asyncio.

A lease is the right to hold one connection's socket and write its messages. Times
come in two kinds and are never mixed:

* wall-clock epoch milliseconds (``*_ms``) are what is stored in DynamoDB and compared
  between workers; clocks can disagree by up to ``max_clock_skew_ms``;
* monotonic seconds (``*_mono``) are what a worker uses to decide, on its own, when its
  lease has run out. They never jump, so a paused or slow worker errs on the safe side.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class LeaseTiming:
    lease_ms: int
    heartbeat_ms: int
    max_clock_skew_ms: int

    def acquirable_below_ms(self, now_ms: int) -> int:
        """A lease whose expiry is below this is free for the taking: even a writer whose
        clock is ``max_clock_skew_ms`` behind ours considers it expired."""
        return now_ms - self.max_clock_skew_ms

    def expiry_ms(self, now_ms: int) -> int:
        return now_ms + self.lease_ms

    def local_deadline_mono(self, sent_mono: float) -> float:
        """When the holder must stop writing: measured from when the successful request
        was *sent* (the item's expiry was set after that), less the skew margin."""
        return sent_mono + (self.lease_ms - self.max_clock_skew_ms) / 1000.0

    def suspect_below_ms(self, now_ms: int) -> int:
        """A healthy holder renews every heartbeat, so its expiry is always at least
        ``lease - heartbeat`` ahead. One further below has missed a renewal: its holder is
        probably gone, and the lease can be tried the moment it expires. Half a heartbeat
        of slack keeps a renewal in flight from looking like a miss."""
        return now_ms + self.lease_ms - self.heartbeat_ms - self.heartbeat_ms // 2


@dataclass(frozen=True)
class Lease:
    """A lease this worker holds."""

    connection_id: str
    owner: str
    fence_token: int
    ws_url: str
    last_seq: int
    deadline_mono: float

    def live(self, now_mono: float) -> bool:
        return now_mono < self.deadline_mono


class AcquireFailure(enum.Enum):
    HELD = "held"  # someone else holds a live lease
    STOPPED = "stopped"  # desired state is STOPPED
    NOT_FOUND = "not_found"  # no such connection


class RenewFailure(enum.Enum):
    LOST = "lost"  # another worker owns it now (or our fence is stale)
    STOPPED = "stopped"  # still ours, but its desired state is STOPPED: close and release
    DELETED = "deleted"  # the item is gone


def classify_acquire_failure(old: Mapping | None) -> AcquireFailure:
    """Why a conditional acquire failed, from the item as it was (ALL_OLD)."""
    if old is None:
        return AcquireFailure.NOT_FOUND
    if old.get("desired_state") != "STARTED":
        return AcquireFailure.STOPPED
    return AcquireFailure.HELD


def acquire_already_landed(old: Mapping | None, owner: str) -> bool:
    """A retried acquire whose first attempt did land sees the lease as held by us."""
    return old is not None and old.get("desired_state") == "STARTED" and old.get("lease_owner") == owner


def classify_renew_failure(old: Mapping | None, owner: str, fence_token: int) -> RenewFailure:
    """Why a conditional renew failed, from the item as it was (ALL_OLD)."""
    if old is None:
        return RenewFailure.DELETED
    if old.get("lease_owner") != owner or int(old.get("fence_token", -1)) != fence_token:
        return RenewFailure.LOST
    return RenewFailure.STOPPED


def release_already_landed(old: Mapping | None, owner: str, fence_token: int) -> bool:
    """A failed release is harmless either way, but a retried one whose first attempt
    landed sees the lease free at our fence: count it as released."""
    return old is not None and old.get("lease_owner") == "" and int(old.get("fence_token", -1)) == fence_token


@dataclass(frozen=True)
class Candidate:
    connection_id: str
    lease_expires_at_ms: int


def takeover_plan(
    candidates: Iterable[Candidate],
    *,
    now_ms: int,
    timing: LeaseTiming,
    managed: set[str] | frozenset[str],
    capacity: int,
) -> list[tuple[str, int]]:
    """Which suspect connections to try, and at what wall-clock time (epoch ms).

    Already-acquirable ones come first, soonest-to-expire next, at most ``capacity``.
    """
    plan = []
    for c in sorted(candidates, key=lambda c: c.lease_expires_at_ms):
        if len(plan) >= capacity:
            break
        if c.connection_id in managed:
            continue
        plan.append((c.connection_id, max(now_ms, c.lease_expires_at_ms + timing.max_clock_skew_ms + 1)))
    return plan


def takeover_jitter_s(load: float, rng: random.Random | None = None) -> float:
    """Delay before racing for an orphan: a little jitter, plus more the busier this
    worker is, so that the least loaded worker tends to win."""
    r = (rng or random).random()
    return 0.05 + 0.15 * r + 0.4 * min(max(load, 0.0), 1.0)


def reconcile_pause_s(reconcile_ms: int, timing: LeaseTiming, rng: random.Random | None = None) -> float:
    """Pause between orphan scans: RECONCILE_SECONDS jittered down to half of it, and
    never longer than ``lease - 2 x heartbeat``. A dead holder's lease becomes a suspect
    ``1.5 x heartbeat`` after its last renewal at the latest, so with this cap every
    worker scans at least once before the lease expires, and the takeover is scheduled
    for the moment of expiry instead of waiting for a scan after it."""
    window_ms = timing.lease_ms - 2 * timing.heartbeat_ms
    cap_ms = window_ms if window_ms > 0 else timing.heartbeat_ms
    return min(reconcile_ms, cap_ms) * (0.5 + 0.5 * (rng or random).random()) / 1000


def hint_pause_s(load: float, rng: random.Random | None = None) -> float:
    """Pause before the next hint poll after taking one: nothing when idle, up to half
    a second when full, so that peers with room get the next hints first."""
    return 0.5 * min(max(load, 0.0), 1.0) * (rng or random).random()


def backoff_s(attempt: int, *, base: float = 0.1, cap: float = 5.0, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff for the ``attempt``-th retry (0-based)."""
    r = (rng or random).random()
    return r * min(cap, base * (2 ** min(attempt, 30)))
