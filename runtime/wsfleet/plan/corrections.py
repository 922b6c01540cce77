"""The measured per-worker rates corrected where the cost benchmark's 3-worker fleet
misled them (issue 22). Pure arithmetic, no AWS calls:

* **free scans**: each worker queries every ``FREE#`` shard, so a shard's load is
  W x the measured rate / the shards it was measured at (4), whatever STATE_SHARDS is;
  a scan that finds nothing free backs off (``FREE_SCAN_IDLE_BACKOFF``), and a holding
  fleet has nothing free;
* **the summarizer** (one worker for the fleet) reads the whole ``RING`` once per pass:
  one paged Query of by_ring entries that carry each session's counts
  (``RING_ENTRY_BYTES``), no read of the session items; it writes the ``#fleet`` item only
  when the summary changed (``SUMMARY_WRITE_SHARE`` of its passes, and at least every
  ``SUMMARY_REFRESH_S``). In a 3-worker benchmark its reads were a third of each worker's
  rate, so they are taken out of the per-worker ``ring`` and ``unowned count`` rates and
  priced once for the fleet, with read units that grow with the fleet;
* the ``#fleet`` item is read by every worker with every SUMMARY_EVERY-th watch read.
"""

from __future__ import annotations

import math

from ..balance import SUMMARY_EVERY  # the #fleet item rides with every third watch read
from .bursts import fleet_item_bytes
from .model import Measured, Op

# The code's own constants and sizes the plan assumes. These model the code as issue 22
# leaves it; the lead adjusts them to the figures `make bench` measures.
RING_REFRESH_S = 15.0  # worker/takeover.py: a watcher re-reads its successors this often
BENCH_WORKERS = 3  # the cost benchmark's fleet (bench/cost.py), when measured_ops.json omits it
# A by_ring entry: its keys and the counts the summarizer needs (active, max_connections,
# state, draining), about. The summarizer's pass is one paged Query of them.
RING_ENTRY_BYTES = 100
SUMMARY_ITEM_BYTES = fleet_item_bytes()  # the #fleet item (counts, the cut, the largest deficits and excesses)
# The share of the summarizer's passes whose summary differs from the one last written:
# any START, STOP, move or join changes it, so at fleet scale nearly every pass; it is
# rewritten at least every SUMMARY_REFRESH_S so that readers can tell a stale one.
SUMMARY_WRITE_SHARE = 1.0
SUMMARY_REFRESH_S = 30.0
# A free scan that finds nothing pauses longer each time, doubling up to 8 x
# RECONCILE_SECONDS. The cost benchmark at 93dc85d measured the backed-off code (267
# FREE# Queries a worker-hour, 67 scans: about 5.4 x fewer than one per RECONCILE_SECONDS),
# so the measured rate is used as it is; set this to the factor to divide by when
# measured_ops.json comes from code that did not back off.
FREE_SCAN_IDLE_BACKOFF = 1


def corrected_ops(measured: Measured, workers: int) -> tuple[Op, ...]:
    """The measured ops with the summarizer's share taken out of the per-worker rates and
    priced once for a fleet of ``workers``, and the free scans backed off (see the module
    docstring)."""
    bench = int(measured.measured_with.get("workers", BENCH_WORKERS))
    ops: list[Op] = []
    passes_h = 0.0
    for op in measured.ops:
        if op.purpose == "ring":
            watcher_h = 3600 / RING_REFRESH_S
            passes_h = max(0.0, op.per_worker_hour * bench - watcher_h * bench)  # the summarizer's ring reads
            ops.append(Op("ring (watchers)", op.table, op.index, "ring", min(watcher_h, op.per_worker_hour), rru=op.rru))
            ring_rru = 0.5 * max(1, math.ceil(workers * RING_ENTRY_BYTES / 4096))
            ops.append(Op("ring (summarizer)", op.table, op.index, "ring", passes_h / workers, rru=ring_rru))
        elif op.purpose == "unowned count":
            # one worker counts for the fleet, every shard: per shard the measured share
            ops.append(Op("unowned count (summarizer)", op.table, op.index, "shards", op.per_worker_hour * bench / workers,
                          rru=op.rru))
        elif op.purpose == "free scan":
            ops.append(Op(op.purpose, op.table, op.index, op.spread, op.per_worker_hour / FREE_SCAN_IDLE_BACKOFF,
                          rru=op.rru))
        else:
            ops.append(op)
    writes_h = max(passes_h * SUMMARY_WRITE_SHARE, 3600 / SUMMARY_REFRESH_S) if passes_h else 0.0
    ops.append(Op("summary: #fleet write", "sessions", "", "fleet", writes_h, wru=math.ceil(SUMMARY_ITEM_BYTES / 1024),
                  partition="#fleet"))
    watch = next((op for op in measured.ops if op.purpose == "watch"), None)
    if watch is not None:
        reads_h = watch.per_worker_hour / SUMMARY_EVERY * workers
        ops.append(Op("summary: #fleet reads", "sessions", "", "fleet", reads_h, rru=0.5 * math.ceil(SUMMARY_ITEM_BYTES / 4096),
                      partition="#fleet"))
    return tuple(ops)
