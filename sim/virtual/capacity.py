"""DynamoDB's per-partition throughput, enforced and recorded.

Every read and write is charged to the partition keys it touches (the item's, and each
index partition an index entry is written to or read from) in the second of virtual time
it lands in. A partition key takes at most :data:`WCU_PER_S` write units and
:data:`RCU_PER_S` read units a second (DynamoDB's hard limit per partition, whatever the
table's mode): a request that would pass it is refused whole with
ProvisionedThroughputExceededException, which the product's store already treats as
transient. Each second's hottest partition is kept for the report.

Units as DynamoDB counts them: a write 1 unit per KB of the larger of the old and new
item (twice in a transaction), a strongly consistent read 1 per 4 KB (half eventually
consistent, twice in a transaction), a Query or a Scan the sum of what it read, rounded
up once; an index entry is its projected attributes plus 100 bytes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

WCU_PER_S = 1000
RCU_PER_S = 3000
INDEX_OVERHEAD_BYTES = 100


def size_of(value: Any) -> int:
    """DynamoDB's size of a value, near enough: strings by their UTF-8 length, numbers
    about their digits, sets and maps by their members."""
    if isinstance(value, str):
        return len(value.encode()) if not value.isascii() else len(value)
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, (int, float)):
        return 1 + (len(str(value)) + 1) // 2
    if isinstance(value, (set, frozenset, list, tuple)):
        return 3 + sum(size_of(v) + 1 for v in value)
    if isinstance(value, dict):
        return 3 + sum(len(k) + size_of(v) + 1 for k, v in value.items())
    return len(str(value))


def item_size(item: dict, names: Iterable[str] | None = None) -> int:
    keys = item.keys() if names is None else (n for n in names if n in item)
    return sum(len(k) + size_of(item[k]) for k in keys)


def write_units(*sizes: int) -> int:
    return max(1, math.ceil(max(sizes) / 1024))


def read_units(size: int, *, consistent: bool) -> float:
    units = max(1, math.ceil(size / 4096))
    return units if consistent else units / 2


class Throttled(Exception):
    """A request would pass a partition's limit this second: nothing was charged."""

    def __init__(self, partition: tuple[str, str], kind: str) -> None:
        super().__init__(f"{kind} limit of partition {partition[0]}/{partition[1]!r}")
        self.partition, self.kind = partition, kind


@dataclass
class Second:
    """One second's use: the hottest partition by write and by read units."""

    at: int
    writes: dict = field(default_factory=lambda: defaultdict(float))
    reads: dict = field(default_factory=lambda: defaultdict(float))

    def hottest(self, kind: str) -> tuple[tuple[str, str] | None, float]:
        used = self.writes if kind == "write" else self.reads
        if not used:
            return None, 0.0
        key = max(used, key=used.__getitem__)
        return key, used[key]


class Partitions:
    """The use of every partition key, per second of virtual time (``now``: seconds)."""

    def __init__(self, now: Callable[[], float], *, enforce: bool = True) -> None:
        self._now = now
        self.enforce = enforce
        self.seconds: list[Second] = []
        self.throttled: dict[str, int] = defaultdict(int)  # "write"/"read" -> refused requests
        self.throttled_by: dict[tuple[str, str], int] = defaultdict(int)
        self.throttled_at: dict[int, int] = defaultdict(int)  # second -> refused requests
        self.total = {"write": 0.0, "read": 0.0}
        # Each second's use of the hottest partition of each kind ("ring", "fleet", ...)
        self.by_group: list[tuple[int, dict[str, tuple[float, float]]]] = []

    def _second(self) -> Second:
        at = int(self._now())
        if not self.seconds or self.seconds[-1].at != at:
            if self.seconds:
                self._fold(self.seconds[-1])
            self.seconds.append(Second(at))
        return self.seconds[-1]

    def _fold(self, second: Second) -> None:
        groups: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
        for kind, used in (("write", second.writes), ("read", second.reads)):
            for key, units in used.items():
                group = _group(key)
                w, r = groups[group]
                groups[group] = (max(w, units), r) if kind == "write" else (w, max(r, units))
        self.by_group.append((second.at, dict(groups)))

    def charge(self, writes: dict[tuple[str, str], float], reads: dict[tuple[str, str], float]) -> None:
        """Charge one request's units, or refuse it whole (:class:`Throttled`)."""
        second = self._second()
        if self.enforce:
            for kind, want, used, limit in (("write", writes, second.writes, WCU_PER_S), ("read", reads, second.reads, RCU_PER_S)):
                for key, units in want.items():
                    if used.get(key, 0.0) + units > limit:
                        self.throttled[kind] += 1
                        self.throttled_by[key] += 1
                        self.throttled_at[second.at] += 1
                        raise Throttled(key, kind)
        for key, units in writes.items():
            second.writes[key] += units
            self.total["write"] += units
        for key, units in reads.items():
            second.reads[key] += units
            self.total["read"] += units

    def finish(self) -> None:
        if self.seconds:
            self._fold(self.seconds[-1])

    def peak(self, kind: str, since: float = float("-inf")) -> tuple[tuple[str, str] | None, float]:
        """The hottest partition of any second from ``since`` on, and its units."""
        best: tuple[tuple[str, str] | None, float] = (None, 0.0)
        for second in self.seconds:
            if second.at >= since:
                key, units = second.hottest(kind)
                if units > best[1]:
                    best = (key, units)
        return best

    def group_peak(self, group: str, kind: str, *, since: float = float("-inf"), window: int = 1) -> float:
        """The highest use, averaged over ``window`` consecutive seconds, of the hottest
        partition of one kind (:func:`_group`) from ``since`` on."""
        at = 0 if kind == "write" else 1
        series = {s: g.get(group, (0.0, 0.0))[at] for s, g in self.by_group if s >= since}
        if not series:
            return 0.0
        first, last = min(series), max(series)
        return max(
            sum(series.get(t, 0.0) for t in range(start, start + window)) / window
            for start in range(first, max(first, last - window + 1) + 1)
        )

    def group_peaks(self, since: float = float("-inf")) -> dict[str, dict[str, float]]:
        groups = sorted({g for _, gs in self.by_group for g in gs})
        return {g: {k: round(self.group_peak(g, k, since=since), 1) for k in ("write", "read")} for g in groups}


def _group(key: tuple[str, str]) -> str:
    """What kind of partition a key is, for the plan's comparison: the ring, a FREE#
    shard, one session's owner partition, the summary item, a session or a connection."""
    where, value = key
    if where.endswith(":by_ring_load"):
        return "ring"
    if where.endswith(":by_owner"):
        return "free_shard" if str(value).startswith("FREE#") else "owner_partition"
    if value == "#fleet":
        return "fleet"
    return "session" if "sessions" in where else "connection"
