"""A run's figures, read from the books, the table's capacity counters and the queue,
and judged against the bounds the fleet is held to (recovery after a crash within a
lease and 5 s, after a zone lost within 60 s, a join within one of fair share in 5
minutes, deploy handoffs within 1 s, no partition over its limit, nothing dead-lettered,
no connection with two sockets)."""

from __future__ import annotations

import math
from typing import Any

from .capacity import RCU_PER_S, WCU_PER_S
from .fleet import Fleet
from .scenarios import Run

HANDOFF_REASONS = ("shutdown", "shed")


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _gaps(fleet: Fleet, run: Run, reasons: tuple[str, ...]) -> dict[str, Any]:
    """The gaps from the event on. One still open when the watch ends counts with its age so
    far, a lower bound (a rebalance's move in flight at the end of a 600-s watch): the p99
    is known while those are at most 1 % of the gaps, the max only when there are none."""
    done = [g.opened_at - g.closed_at for g in fleet.books.gaps if g.reason in reasons and g.closed_at >= run.event_at]
    left = [run.ended_at - at for reason, at in fleet.books.closed.values() if reason in reasons and at >= run.event_at]
    return {
        "count": len(done) + len(left),
        "p50_s": _round(percentile(done, 50)),
        "p99_s": _round(percentile(done + left, 99)) if len(left) <= 0.01 * (len(done) + len(left)) else None,
        "max_s": _round(max(done, default=None)) if not left else None,
        "not_reopened": len(left),
        "oldest_open_s": _round(max(left, default=0.0)),
    }


def _seconds(v: float | None) -> str:
    return "not within the run" if v is None else f"{v} s"


def _refusals(f: dict[str, Any]) -> str:
    where = ", ".join(f"{k} {n}" for k, n in f["throttled_by_partition"].items())
    return f" ({f['throttled_before_event']} before the event; most at {where})"


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def figures(fleet: Fleet, run: Run, *, wall_s: float, max_rss_mb: float) -> dict[str, Any]:
    p = fleet.partitions
    write_key, write_peak = p.peak("write", since=math.floor(run.event_at))
    read_key, read_peak = p.peak("read", since=math.floor(run.event_at))
    sends = [b["sent"] - a["sent"] for a, b in zip(run.samples, run.samples[1:], strict=False)]
    out: dict[str, Any] = {
        "scenario": run.scenario,
        "workers": run.workers,
        "per_worker": run.per_worker,
        "connections": run.workers * run.per_worker,
        "seed": run.seed,
        "virtual_s": round(run.ended_at, 1),
        "watched_s": round(run.ended_at - run.event_at, 1),
        "wall_s": round(wall_s, 1),
        "max_rss_mb": round(max_rss_mb),
        "crash_recovery": _gaps(fleet, run, ("crash",)),
        "handoff_gaps": _gaps(fleet, run, HANDOFF_REASONS),
        "recovered_after_s": _round(None if run.recovered_at is None else run.recovered_at - run.event_at),
        "fair_after_s": _round(None if run.fair_at is None else run.fair_at - run.event_at),
        "hottest_write": {"partition": "/".join(map(str, write_key or ())), "units_per_s": round(write_peak, 1), "limit": WCU_PER_S},
        "hottest_read": {"partition": "/".join(map(str, read_key or ())), "units_per_s": round(read_peak, 1), "limit": RCU_PER_S},
        "peak_by_partition_kind": p.group_peaks(since=math.floor(run.event_at)),
        # a steady stream (a join's sheds over half a minute) by its busiest two
        # heartbeats, where one second's count of a few writes is mostly chance
        "ring_writes_busiest_5s": round(p.group_peak("ring", "write", since=math.floor(run.event_at), window=5), 1),
        "throttled_requests": dict(p.throttled),
        # where and when: the fleet's start (before the event) or the event itself
        "throttled_before_event": sum(n for at, n in p.throttled_at.items() if at < run.event_at),
        "throttled_by_partition": {"/".join(map(str, k)): n for k, n in sorted(p.throttled_by.items(), key=lambda kv: -kv[1])[:5]},
        "hints_sent": fleet.queue.sent,
        "hints_peak_per_s": max(sends, default=0),
        "dead_letters": len(fleet.queue.dead),
        "peak_tasks": fleet.peak_tasks,
        "double_owners": fleet.books.doubled,
        "requests": dict(sorted(fleet.dynamo.calls.items())),
        "loop_errors": fleet.loop_errors[:5],
        **run.extra,
        "samples": run.samples,  # a second each: spread, unattached, closed, queue, workers
    }
    out["bounds"] = bounds(out, fleet)
    return out


def bounds(f: dict[str, Any], fleet: Fleet) -> dict[str, bool]:
    """Each bound the scenario is held to, and whether it held."""
    lease = fleet.settings.lease_s
    held: dict[str, bool] = {
        # from the event on: the fleet's start (every worker within two seconds, where ECS
        # launches about 500 a minute) is the simulator's shortcut, not the scenario
        "no partition over its limit": sum(f["throttled_requests"].values()) == f["throttled_before_event"],
        "dead-letter queue empty": f["dead_letters"] == 0,
        "no connection with two sockets": f["double_owners"] == 0,
    }
    crash, gaps = f["crash_recovery"], f["handoff_gaps"]
    recovered = crash.get("p99_s") is not None and not crash.get("not_reopened")  # every crashed connection open again
    if f["scenario"] == "crash10":
        held[f"crash recovered p99 <= lease + 5 s ({lease + 5:g} s)"] = recovered and crash["p99_s"] <= lease + 5
    if f["scenario"] == "az":
        held["zone lost recovered p99 <= 60 s"] = recovered and crash["p99_s"] <= 60
    if f["scenario"] == "join":
        held["join within one of fair share in <= 300 s"] = f["fair_after_s"] is not None and f["fair_after_s"] <= 300
    if f["scenario"] in ("deploy", "scalein"):
        # (a move in flight when the watch ends counts with its age, and none may be older)
        held["handoff gap p99 <= 1 s"] = gaps["p99_s"] is not None and gaps["p99_s"] <= 1 and gaps["oldest_open_s"] <= 1
    return held


def render(f: dict[str, Any]) -> str:
    c, g = f["crash_recovery"], f["handoff_gaps"]
    lines = [
        f"## simulate {f['scenario']}: {f['workers']} workers x {f['per_worker']} (seed {f['seed']})",
        "",
        "| figure | value |",
        "|---|---|",
        f"| virtual time (watched after the event) | {f['virtual_s']} s ({f['watched_s']} s) |",
        f"| wall time, peak memory | {f['wall_s']} s, {f['max_rss_mb']} MB |",
    ]
    if c["count"]:
        lines.append(f"| crash recovery p50 / p99 / max ({c['count']} connections) | {c['p50_s']} / {c['p99_s']} / {c['max_s']} s"
                     + (f", {c['not_reopened']} not reopened (the oldest {c['oldest_open_s']} s)" if c["not_reopened"] else "") + " |")
    if g["count"]:
        lines.append(f"| handoff gap p50 / p99 / max ({g['count']} handoffs) | {g['p50_s']} / {g['p99_s']} / {g['max_s']} s"
                     + (f", {g['not_reopened']} in flight at the end (the oldest {g['oldest_open_s']} s)" if g["not_reopened"] else "") + " |")
    for key, label in (("killed", "tasks killed"), ("joined", "tasks joined"), ("stopped", "tasks stopped"),
                       ("rounds", "deploy rounds (ECS's task limit)"), ("deploy_s", "deploy took")):
        if key in f:
            lines.append(f"| {label} | {f[key]} |")
    lines += [
        f"| every worker within one of its share after | {_seconds(f['fair_after_s'])} |",
        f"| hottest partition, writes | {f['hottest_write']['units_per_s']} WCU/s of {f['hottest_write']['limit']} ({f['hottest_write']['partition']}) |",
        f"| hottest partition, reads | {f['hottest_read']['units_per_s']} RCU/s of {f['hottest_read']['limit']} ({f['hottest_read']['partition']}) |",
        f"| requests refused by a partition's limit | {f['throttled_requests'] or 'none'}"
        f"{_refusals(f) if f['throttled_requests'] else ''} |",
        f"| hints sent (peak per second) | {f['hints_sent']} ({f['hints_peak_per_s']}) |",
        f"| dead-letter queue | {f['dead_letters']} |",
        f"| connections with two sockets | {f['double_owners']} |",
        "",
        "| bound | held |",
        "|---|---|",
        *(f"| {name} | {'yes' if ok else '**no**'} |" for name, ok in f["bounds"].items()),
    ]
    return "\n".join(lines)
