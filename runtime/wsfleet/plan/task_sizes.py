"""Which task size, and how many connections each task holds: from what one worker was
measured to cost, not a round number. Pure arithmetic, no AWS calls.

A worker is one Python process with one event loop (large frames are parsed in a child,
whose memory is set aside): it uses at most one vCPU however many the task has. For each
Fargate size the plan works out what one task can hold

* by CPU: the loop busy at most ``CPU_CEILING`` of its vCPU (at most one) at the message
  rate, from the CPU a held connection and a stored message were measured to cost;
* by memory: the half of the task's memory the frame budget leaves to the process (after
  the decoder child's reserve, :mod:`wsfleet.budget`), at most ``MEMORY_CEILING`` of it,
  less the idle process, over the memory a held connection was measured to take;
* never more than one worker was measured to hold (``Capacity.held``): beyond it nothing
  was seen, so nothing is promised;

and keeps ``TARGET_SHARE`` of that as the scaling target (the rest is the headroom a
crash's survivors and the rebalancer's tolerance use: ``max_connections_per_worker`` is
the capacity itself). Each size is then run through the whole plan
(:func:`.limits.evaluate`: every partition, quota and scenario at that many workers) and
priced for holding, all-in (tasks, tables, queue, NAT, metrics): the messages cost what
their sink costs whatever the task size (`wsfleet plan --rate` prices the sinks side by
side). The cheapest size that passes every limit is picked, a tie (within a cent per
1,000 connections) going to the smaller task: a crash of one task then loses fewer
connections at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .. import budget
from .limits import evaluate
from .model import Measured

MIB = 1 << 20


@dataclass(frozen=True)
class Capacity:
    """What one worker was measured to cost (``python -m bench capacity``, BENCHMARKS.md
    "Capacity": one worker holding 0 / 2,500 / 5,000 quiet connections, then 20 busy ones)."""

    idle_rss_bytes: int = 68_000_000  # RSS holding nothing
    bytes_per_connection: int = 27_000  # RSS slope from 2,500 to 5,000 held
    cpu_s_per_connection_hour: float = 0.061  # holding, no messages (pings, renewals' share)
    cpu_ms_per_message: float = 0.463  # marginal, stored in the table
    held: int = 5_000  # the most one worker was measured holding


MEASURED = Capacity()
# (vCPU units, MiB): the Fargate sizes a worker could use; above one vCPU the event loop
# cannot use the rest, so larger ones only cost more.
SIZES = ((256, 512), (256, 1024), (512, 1024), (512, 2048), (1024, 2048), (1024, 4096), (2048, 4096))
CPU_CEILING = 0.6  # of the vCPU the loop can use: room for a takeover's handshakes and GC
MEMORY_CEILING = 0.8  # of the process's half: room for a busy interval's parsing
TARGET_SHARE = 0.7  # scaling target / capacity: a 10 % crash's survivors need 1.11x, the rebalancer +10 %


def per_task(cpu: int, memory_mib: int, *, rate: float, max_frame_bytes: int, measured: Capacity = MEASURED) -> dict[str, Any]:
    """What one task of ``cpu`` units and ``memory_mib`` holds at ``rate`` messages per
    second per connection, by CPU and by memory, and which bound binds."""
    loop_vcpu = min(cpu / 1024, 1.0)
    cpu_per_connection = rate * measured.cpu_ms_per_message / 1000 + measured.cpu_s_per_connection_hour / 3600
    by_cpu = math.floor(CPU_CEILING * loop_vcpu / cpu_per_connection)
    task_bytes = memory_mib * MIB
    # What the worker's own default budget (its MAX_BUFFERED_BYTES) leaves the process.
    process_bytes = (task_bytes - budget.decoder_reserve_bytes(max_frame_bytes)
                     - budget.default_budget_bytes(task_bytes, max_frame_bytes))
    by_memory = max(0, math.floor((MEMORY_CEILING * process_bytes - measured.idle_rss_bytes) / measured.bytes_per_connection))
    bounds = {"cpu": by_cpu, "memory": by_memory, "measured": measured.held}
    binding = min(bounds, key=bounds.__getitem__)
    capacity = bounds[binding]
    return {"by_cpu": by_cpu, "by_memory": by_memory, "capacity": capacity, "bound": binding,
            "target": math.floor(capacity * TARGET_SHARE)}


def choose(measured_ops: Measured, settings: Mapping[str, Any], *, connections: int, rate: float,
           max_frame_bytes: int, capacity: Capacity = MEASURED) -> dict[str, Any]:
    """Every size considered (what it holds, its workers, $ per month and per 1,000
    connections all-in, the first limit it hits) and the one picked, with why."""
    rows = []
    for cpu, memory_mib in SIZES:
        fit = per_task(cpu, memory_mib, rate=rate, max_frame_bytes=max_frame_bytes, measured=capacity)
        row: dict[str, Any] = {"cpu": cpu, "memory_mib": memory_mib, **fit}
        if fit["target"] < 1:
            rows.append({**row, "ok": False, "why_not": "holds no connection: the frame decoder's reserve takes the memory"})
            continue
        sized = {**settings, "spot": False, "worker_cpu": cpu, "worker_memory_mib": memory_mib, "target_per_worker": fit["target"],
                 "max_per_worker": fit["capacity"],
                 "max_workers": max(settings["max_workers"], math.ceil(connections / fit["target"]))}
        result = evaluate(measured_ops, sized, connections=connections)  # holding: the sinks are priced apart
        row.update(workers=result["workers"], usd_per_month=result["usd_per_month"],
                   usd_per_1000=result["usd_per_month"] / connections * 1000, first_limit=result["first_limit"],
                   ok=result["first_limit"] is None)
        if not row["ok"]:
            row["why_not"] = f"{result['first_limit']} ({result['first_limit_scenario']})"
        rows.append(row)
    passing = [r for r in rows if r["ok"]]
    picked = min(passing, key=lambda r: (round(r["usd_per_1000"], 2), r["cpu"], r["memory_mib"])) if passing else None
    return {"rate": rate, "connections": connections, "architecture": settings["architecture"], "sizes": rows,
            "picked": picked, "why": _why(picked, rows)}


def _why(picked: Mapping[str, Any] | None, rows: list[Mapping[str, Any]]) -> str:
    if picked is None:
        return "no size passes every limit at this scale: see each size's first limit"
    bound = {"cpu": "the event loop's CPU", "memory": "memory", "measured": "the most one worker was measured holding"}
    return (f"{picked['cpu'] / 1024:g} vCPU / {picked['memory_mib']:,} MiB: the cheapest all-in of the "
            f"{sum(r['ok'] for r in rows)} sizes that pass every limit (${picked['usd_per_1000']:,.2f} per 1,000 "
            f"connections a month); each task holds {picked['capacity']:,}, bound by {bound[picked['bound']]}, "
            f"and scales at {picked['target']:,}")
