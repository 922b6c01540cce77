"""The fleet's bursts, second by second: what a crash, an availability zone lost, a join, a
rolling deploy and a scale-in ask of the ring's partition, a session item, the queue and
ECS, and the summary item at any size. Pure arithmetic on the code's own constants;
``python -m bench simulate`` measures the same figures with the workers' own code, and a
test holds the ring's peak within 25 % of what the simulator measures in each scenario.

* **ring writes**: a session's by_ring entry is written by a renewal that carries a
  changed state or count (:func:`wsfleet.balance.ring_write_due`): the first change after
  a quiet spell at the next renewal, later ones at most every other renewal. So what
  sets a burst's peak is how many sessions change within about a heartbeat:

  - **a death** (a crash, a zone): the dead sessions are ended at their expiry, spread
    over the heartbeat their last renewals were (``dead / heartbeat``); their connections
    are hinted as they are drained, and a survivor's first take comes about
    ``heartbeat x survivors / moved`` into that (sooner the more each takes), its
    renewal within a heartbeat after: the takers' writes spread over ``heartbeat x (1 +
    survivors / moved)``. Takers: the survivors that get at least one, ``survivors x (1 -
    e^(-moved / survivors))``.
  - **a scale-in**: every leaver writes three times (draining, ENDED, out of the ring), and hints
    all it held at SIGTERM, at once: the takers' writes within one heartbeat.
  - **a join**: each newcomer writes as it opens and once more at its first renewal, at
    the pace ECS starts them; each older worker sheds when a summary shows newcomers
    under their share (it reads one every ``SUMMARY_EVERY`` watch passes: a wave over
    that long), and the newcomers' counts change at every other renewal as they fill.
    A steady stream over half a minute or so: the simulator compares it with its busiest
    two heartbeats, where one second's count of a few writes is mostly chance.
  - **a deploy**: as each new task starts ECS stops an old one: the new one writes twice
    (open, first renewal), the old one three times, and every task
    that takes the old one's hints at most every other renewal.
* **ring reads**: none for drains: a drainer plans from the ``#fleet`` summary it already
  holds (:func:`wsfleet.balance.drain_targets`).
* **a session item's inbox**: a move to a session rewrites its whole item in a
  transaction, and the item grows by an entry with each until its next renewal empties
  it (:func:`inbox_fill_units`); the inbox takes at most ``ASSIGNED_MAX``.
* **an availability zone lost**: half the tasks (two zones). What the survivors cannot
  hold (past MAX_CONNECTIONS) waits for replacements, which the service launches at its
  launch rate, each taking a Fargate start.
* **a deploy's tasks**: at ``maximumPercent`` 200 the service runs up to twice the tasks,
  capped by its tasks-per-service quota: past half that quota a deploy goes in rounds.
* **the summary item** (``#fleet``): its figures, the largest ``UNDER_LISTED`` deficits, the
  largest ``OVER_LISTED`` excesses and ``LOADS_LISTED`` dead sessions, each an id and a number.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .. import schema
from ..balance import LOADS_LISTED, OVER_LISTED, RING_WRITE_EVERY, SUMMARY_EVERY, UNDER_LISTED
from ..leases import SessionTiming
from ..settings_spec import MAX_CLOCK_SKEW_MS, VARIABLES
from .model import TRANSACTION_FACTOR

CRASH_SHARE = 0.1
JOIN_SHARE = 0.1
SCALE_IN_SHARE = 0.1
AZS = 2
# A session id: the ECS task id (32 hex), '#', the start in ms (13 digits), '-', 8 hex.
SESSION_ID_BYTES = 55
SUMMARY_FIGURE_BYTES = 160  # the summary's counts, its time and the cut, with their names
FARGATE_START_S = 40.0  # a Fargate task's start, provisioning and image pull included, about
FARGATE_START_SPREAD_S = 20.0  # ... give or take half this: tasks launched together start apart
# A session item without its inbox (ids, state, times, load, the ring's key), and one entry
# of its inbox at the longest connection id (validation's 128 characters, '#', a fence).
SESSION_ITEM_BYTES = 512
ASSIGNED_ENTRY_BYTES = 128 + 12
RING_WRITES_TO_OPEN = 2  # a newcomer's open, then its first renewal (nothing stored yet)
RING_WRITES_TO_LEAVE = 3  # a leaver's renewal saying draining, its end (ENDED), its leaving the ring


def fleet_item_bytes(listed: int = UNDER_LISTED + OVER_LISTED + LOADS_LISTED) -> int:
    """The ``#fleet`` item at its largest: the figures, and ``listed`` sessions under or
    over their targets or dead (an id and a number each; every taker's load is listed only
    in a fleet of at most LOADS_LISTED, where these lists are short)."""
    return SUMMARY_FIGURE_BYTES + listed * (SESSION_ID_BYTES + 4)


def inbox_fill_units(entries: int, *, entry_bytes: int = ASSIGNED_ENTRY_BYTES, base_bytes: int = SESSION_ITEM_BYTES) -> int:
    """The write units of ``entries`` moves to one session between two of its renewals:
    each a transaction that writes the whole item (twice its KB), which has grown by an
    entry with each move before it."""
    return sum(TRANSACTION_FACTOR * math.ceil((base_bytes + k * entry_bytes) / 1024) for k in range(1, entries + 1))


def takers(survivors: int, moved: float) -> float:
    """How many of ``survivors`` take at least one of ``moved`` connections handed out
    one by one, about: those that draw at least one."""
    return survivors * (1 - math.exp(-moved / survivors)) if survivors and moved else 0.0


def death_ring_writes_per_s(*, dead: int, survivors: int, moved: float, heartbeat_s: float) -> float:
    """The ring's writes a second at the peak of a death of ``dead`` sessions whose
    ``moved`` connections go to ``survivors`` (the module's docstring)."""
    if not moved or not survivors:
        return dead / heartbeat_s
    return dead / heartbeat_s + takers(survivors, moved) / (heartbeat_s * (1 + survivors / moved))


def arrivals_per_s(n: int, launches_per_minute: float) -> float:
    """How fast ``n`` tasks launched together start running: the service's launch slots,
    each start give or take ``FARGATE_START_SPREAD_S / 2``."""
    return n / (n * 60 / launches_per_minute + FARGATE_START_SPREAD_S)


def mean_watch_pause_s(settings: Mapping[str, Any]) -> float:
    skew_ms = VARIABLES[MAX_CLOCK_SKEW_MS].default
    timing = SessionTiming(round(settings["lease_s"] * 1000), round(settings["heartbeat_s"] * 1000), skew_ms)
    return timing.mean_watch_pause_s()


def bursts(*, workers: int, per_worker: int, settings: Mapping[str, Any], tasks_quota: int,
           launches_per_minute: float, entry_bytes: int = ASSIGNED_ENTRY_BYTES) -> dict[str, dict[str, Any]]:
    """Each scenario's peaks for ``workers`` holding ``per_worker`` each. ``entry_bytes``:
    an inbox entry's size (the longest connection id by default)."""
    h = settings["heartbeat_s"]
    most = settings["max_per_worker"]
    connections = workers * per_worker
    gap = RING_WRITE_EVERY * h  # a count that keeps changing is written this often
    full_inbox = inbox_fill_units(schema.ASSIGNED_MAX, entry_bytes=entry_bytes)
    out: dict[str, dict[str, Any]] = {}
    for name, dead in (("crash", math.ceil(workers * CRASH_SHARE)), ("zone_lost", workers // AZS)):
        survivors = max(1, workers - dead)
        moved = dead * per_worker
        unplaced = max(0, connections - survivors * most)
        relaunch_s = (math.ceil(unplaced / most) / launches_per_minute * 60 + FARGATE_START_S) if unplaced else 0.0
        planned = workers <= LOADS_LISTED  # the summary lists every taker: drains move to named survivors
        out[name] = {
            "dead": dead,
            "moved": moved,
            "ring_writes_per_s": death_ring_writes_per_s(dead=dead, survivors=survivors, moved=moved, heartbeat_s=h),
            "ring_reads_per_s": 0.0,
            "per_survivor": connections / survivors,
            "unplaced": unplaced,
            "recovery_s": relaunch_s,
            # larger fleets hint what the drainer does not take itself, for anyone
            "hints_per_s": 0.0 if planned else moved / h,
            # a survivor's inbox: the drains' moves (a small fleet's) and then the
            # replacements' (named by the sheds), at most a full inbox between renewals
            "inbox_units_per_s": inbox_fill_units(min(schema.ASSIGNED_MAX, math.ceil(per_worker)), entry_bytes=entry_bytes),
            "inbox_bound_units_per_s": full_inbox,
        }
    joining = max(1, math.ceil(workers * JOIN_SHARE))
    arriving = arrivals_per_s(joining, launches_per_minute)
    summary_every_s = SUMMARY_EVERY * mean_watch_pause_s(settings)
    out["join"] = {
        "joining": joining,
        "ring_writes_per_s": RING_WRITES_TO_OPEN * arriving + workers / summary_every_s + joining / gap,
        "hints_per_s": 0.0,
        "inbox_units_per_s": full_inbox,  # a newcomer is named by many shedders at once
    }
    leaving = max(1, math.floor(workers * SCALE_IN_SHARE))
    staying = workers - leaving
    out["scale_in"] = {
        "leaving": leaving,
        "ring_writes_per_s": (RING_WRITES_TO_LEAVE * leaving + takers(staying, leaving * per_worker)) / h,
        "handoffs": leaving * per_worker,
        "hints_per_s": leaving * per_worker,  # every leaver hints all it holds at SIGTERM
    }
    at_once = min(2 * workers, tasks_quota)
    replaced_per_s = arrivals_per_s(min(workers, at_once - workers), launches_per_minute)
    hinted_per_s = replaced_per_s * per_worker
    out["deploy"] = {
        "tasks_at_once": at_once,
        "rounds": math.ceil(workers / (at_once - workers)) if at_once > workers else None,
        "launch_minutes": workers / launches_per_minute,
        "handoffs": connections,
        "ring_writes_per_s": (RING_WRITES_TO_OPEN + RING_WRITES_TO_LEAVE) * replaced_per_s
        + min(at_once, hinted_per_s * gap) / gap,
        "hints_per_s": hinted_per_s,
    }
    return out
