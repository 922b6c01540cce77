"""What the reference consumer delivers, decided without I/O: a connection's delivery
state, and the records of one batch in stream order, in; what to deliver and the state
after, out.

The stream delivers at least once (CONTRACT.md section 4): a takeover sends again the
frames since the last checkpoint with a higher fence, a partly refused PutRecords sends
some again with the same fence, and a frozen owner's request may land after its
successor's records with a lower fence. Every delivery of one (connection, seq) carries
the upstream's same frame, so the consumer delivers each seq once, the first time it
arrives from an owner that is not stale, and drops the rest:

* ``stale``: a fence below the highest seen for the connection. The owner holding that
  higher fence resumed from a checkpoint at or below this record's seq, so it delivers
  the seq itself: nothing is lost by dropping it.
* ``replayed``: a seq already delivered, sent again by a later owner (a takeover).
* ``resent``: a seq already delivered, sent again at its own fence (a partial failure).

"Already delivered" is a set, not a high-water mark: after a partial failure seq n+1
may arrive before n, and n is then still new. The set is kept as ranges: a contiguous
run (``delivered_from`` .. ``delivered_to``) and the few ranges past a hole above it;
holes close as the resent records arrive. A marker record stands for its whole range
(``seq`` .. ``skip_to``) and is new unless all of it was delivered; one that is partly
delivered already (a taker's ``upstream_gap`` over seqs its predecessor delivered as
data) is delivered as the parts not delivered yet, each a marker of its own (``trim``),
so that no seq goes downstream twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Generic, Iterable, TypeVar

from ..records import Record

# Ranges kept past holes, at most. Holes close within a batch or two (the worker resends
# a refused record at once; markers fill what the upstream skipped), so only hostile or
# lost records leave more; then the lowest hole is given up (delivered as passed, and
# logged): the state item stays small whatever the stream holds.
MAX_RANGES = 64

Range = tuple[int, int]
T = TypeVar("T")


@dataclass(frozen=True)
class Delivered:
    """A connection's delivery state: the seqs delivered (sorted, disjoint, non-adjacent
    ranges), the highest fence seen (-1: none), the last seq delivered when that fence
    was first seen, and the revision of the stored item it was read as (0: none)."""

    ranges: tuple[Range, ...] = ()
    fence_token: int = -1
    fence_seen_at: int = -1
    revision: int = 0

    @property
    def delivered_to(self) -> int | None:
        return self.ranges[0][1] if self.ranges else None

    @property
    def last(self) -> int:
        """The highest seq delivered, -1 for none."""
        return self.ranges[-1][1] if self.ranges else -1

    def covers(self, first: int, last: int) -> bool:
        """Whether every seq from ``first`` to ``last`` was delivered."""
        return any(a <= first and last <= b for a, b in self.ranges)

    def missing(self, first: int, last: int) -> list[Range]:
        """The parts of ``first``..``last`` not delivered, in order."""
        out: list[Range] = []
        at = first
        for a, b in self.ranges:
            if b < at:
                continue
            if a > last:
                break
            if a > at:
                out.append((at, a - 1))
            at = max(at, b + 1)
            if at > last:
                return out
        if at <= last:
            out.append((at, last))
        return out

    def with_range(self, first: int, last: int) -> tuple["Delivered", Range | None]:
        """The state with ``first``..``last`` delivered too, and the hole given up to
        stay within :data:`MAX_RANGES` (None: none)."""
        merged: list[Range] = []
        for a, b in sorted((*self.ranges, (first, last))):
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        abandoned = None
        if len(merged) > MAX_RANGES:
            (a, b), (c, d) = merged[0], merged[1]
            abandoned = (b + 1, c - 1)
            merged[:2] = [(a, d)]
        return replace(self, ranges=tuple(merged)), abandoned


@dataclass
class Decision(Generic[T]):
    """What one batch of a connection's records comes to: the items to deliver, in
    stream order; the state after them (its revision still the one read); counts by
    outcome; and the holes given up."""

    deliver: list[T] = field(default_factory=list)
    state: Delivered = field(default_factory=Delivered)
    counts: Counter[str] = field(default_factory=Counter)
    abandoned: list[Range] = field(default_factory=list)


DELIVERED, REPLAYED, RESENT, STALE = "delivered", "replayed", "resent", "stale"


def decide(
    state: Delivered, records: Iterable[tuple[Record, T]], *, trim: Callable[[Record, int, int], T] | None = None
) -> Decision[T]:
    """Go through ``records`` (a record and what to deliver for it) in stream order from
    ``state``; see the module docstring for the rules. ``trim(record, first, last)``:
    what to deliver for the part first..last of a marker partly delivered already
    (without it, the marker is delivered whole)."""
    out: Decision[T] = Decision(state=state)
    for record, item in records:
        now = out.state
        if record.fence_token < now.fence_token:
            out.counts[STALE] += 1
            continue
        if record.fence_token > now.fence_token:
            now = replace(now, fence_token=record.fence_token, fence_seen_at=now.last)
        if now.covers(record.seq, record.end):
            out.counts[REPLAYED if record.seq <= now.fence_seen_at else RESENT] += 1
            out.state = now
            continue
        parts = now.missing(record.seq, record.end) if trim is not None and record.end > record.seq else []
        out.state, abandoned = now.with_range(record.seq, record.end)
        if abandoned is not None:
            out.abandoned.append(abandoned)
        if parts and parts != [(record.seq, record.end)]:
            out.deliver.extend(trim(record, a, b) for a, b in parts)  # type: ignore[misc]
        else:
            out.deliver.append(item)
        out.counts[DELIVERED] += 1
    return out


def state_changed(before: Delivered, after: Delivered) -> bool:
    return (before.ranges, before.fence_token, before.fence_seen_at) != (after.ranges, after.fence_token, after.fence_seen_at)
