"""The fleet's bursts, second by second: what a crash, an availability zone lost, a join, a
rolling deploy and a scale-in ask of the ring's partition, the queue and ECS, and the
summary item and the reachability sweep at any size. Pure arithmetic on the code's own
constants (repeated here, as :mod:`.corrections` does: the plan imports no worker code);
``python -m bench simulate`` measures the same figures with the workers' own code, and a
test holds the two within 25 % of each other.

* **ring writes**: a session's by_ring entry is written when its projected load changes:
  ENDED, draining or out of the ring at once, a changed count at most every other renewal
  (:func:`wsfleet.balance.ring_write_due`). In a crash every dead session is ended within
  a heartbeat of the others (their last renewals were spread over one), and every
  survivor's count changes as the moves reach it: ``dead / heartbeat + survivors / (2 x
  heartbeat)`` a second at the peak.
* **ring reads**: none for drains: a drainer plans from the ``#fleet`` summary it already
  holds (:func:`wsfleet.balance.drain_targets`), so a crash adds no read of the ring.
* **an availability zone lost**: half the tasks (two zones). What the survivors cannot
  hold (past MAX_CONNECTIONS) waits for replacements, which the service launches at its
  launch rate, each taking a Fargate start.
* **a deploy**: at ``maximumPercent`` 200 the service runs up to twice the tasks, capped by
  its tasks-per-service quota: past half that quota a deploy goes in rounds.
* **the summary item** (``#fleet``): its figures and the largest ``UNDER_LISTED`` deficits and
  excesses, each a session id and a number.
* **the sweep**: its pass is :func:`wsfleet.leases.sweep_pass_s` (the plan's limits check it).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..balance import RING_WRITE_EVERY, UNDER_LISTED

CRASH_SHARE = 0.1
JOIN_SHARE = 0.1
SCALE_IN_SHARE = 0.1
AZS = 2
# A session id: the ECS task id (32 hex), '#', the start in ms (13 digits), '-', 8 hex.
SESSION_ID_BYTES = 55
SUMMARY_FIGURE_BYTES = 160  # the summary's counts, its time and the cut, with their names
FARGATE_START_S = 40.0  # a Fargate task's start, provisioning and image pull included, about


def fleet_item_bytes(listed: int = UNDER_LISTED) -> int:
    """The ``#fleet`` item at its largest: the figures, and ``listed`` sessions under and
    as many over their targets (an id and a number each)."""
    return SUMMARY_FIGURE_BYTES + 2 * listed * (SESSION_ID_BYTES + 4)


def bursts(*, workers: int, per_worker: int, settings: Mapping[str, Any], tasks_quota: int,
           launches_per_minute: float) -> dict[str, dict[str, Any]]:
    """Each scenario's peaks for ``workers`` holding ``per_worker`` each."""
    h = settings["heartbeat_s"]
    most = settings["max_per_worker"]
    connections = workers * per_worker
    out: dict[str, dict[str, float]] = {}
    for name, dead in (("crash", math.ceil(workers * CRASH_SHARE)), ("zone_lost", workers // AZS)):
        survivors = max(1, workers - dead)
        unplaced = max(0, connections - survivors * most)
        relaunch_s = (math.ceil(unplaced / most) / launches_per_minute * 60 + FARGATE_START_S) if unplaced else 0.0
        out[name] = {
            "dead": dead,
            "ring_writes_per_s": dead / h + survivors / (RING_WRITE_EVERY * h),
            "ring_reads_per_s": 0.0,
            "per_survivor": connections / survivors,
            "unplaced": unplaced,
            "recovery_s": relaunch_s,
            "hints_per_s": 0.0,  # a drain moves each connection to its planned survivor: no hint
        }
    joining = max(1, math.ceil(workers * JOIN_SHARE))
    opened_per_s = min(joining, launches_per_minute / 60)  # the newcomers open their sessions as ECS starts them
    out["join"] = {"joining": joining, "ring_writes_per_s": opened_per_s + (workers + joining) / (RING_WRITE_EVERY * h), "hints_per_s": 0.0}
    leaving = max(1, math.floor(workers * SCALE_IN_SHARE))
    out["scale_in"] = {"leaving": leaving, "ring_writes_per_s": leaving / h + workers / (RING_WRITE_EVERY * h), "handoffs": leaving * per_worker}
    at_once = min(2 * workers, tasks_quota)
    out["deploy"] = {
        "tasks_at_once": at_once,
        "rounds": math.ceil(workers / (at_once - workers)) if at_once > workers else None,
        "launch_minutes": workers / launches_per_minute,
        "handoffs": connections,
    }
    return out

