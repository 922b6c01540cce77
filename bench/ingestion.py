"""Ingestion: messages per second one worker stores, and what each costs it.

For each level (connections x upstream rate x FLUSH_INTERVAL_MS) a fresh emulator,
upstream process and worker; after a warm-up, one window between two stats lines:

* offered (the upstream's production) against stored (the worker's MessagesStored):
  when stored falls behind, the backlog grows and something is the limit;
* DynamoDB requests per message, all operations included, and messages per batch;
* the worker's CPU per message and CPU share of one core, beside the emulator's and
  the upstream's (all read from /proc), which say where the limit is: moto handles one
  DynamoDB request at a time, so an emulator near one full core is the emulator's
  speed, not the worker's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from wsfleet import config as cfg
from wsfleet.local.fleet import eventually

from . import before
from .common import Result, Rig, Window, fmt, fmt_spread, md_table, median_spread, proc_cpu_s

# (connections, messages/s per connection, FLUSH_INTERVAL_MS)
LEVELS = [(10, 5.0, 100), (10, 20.0, 100), (10, 100.0, 100), (20, 100.0, 100), (10, 20.0, 1000)]
QUICK_LEVELS = [(2, 10.0, 100)]


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "levels": QUICK_LEVELS if quick else LEVELS,
        "warmup_s": 0.5 if quick else 5,
        "window_s": 2 if quick else 30,
        # The worker's defaults (lease 10 s, heartbeat 2.5 s, reconcile 10 s, checkpoint
        # 120 s), stats every 5 s for the sub-windows.
        "worker": {cfg.METRICS_SECONDS: 0.5 if quick else 5},
    }


def run_level(run_dir: Path, n: int, rate: float, flush_ms: int, s: dict[str, Any]) -> dict[str, Any]:
    with Rig(run_dir) as rig:
        upstream = rig.upstream(rate)
        worker = rig.worker("w1", {**s["worker"], cfg.FLUSH_INTERVAL_MS: flush_ms})
        ids = [f"ing{i:03d}" for i in range(n)]
        rig.start_connections(ids, upstream, hint=True)
        eventually(lambda: upstream.open_sockets() == n, 60, f"{n} sockets open", interval=0.2)
        time.sleep(s["warmup_s"])
        a = worker.next_stats()
        up_a, cpu_a = upstream.stats(), {p: proc_cpu_s(p) for p in (rig.emulator_pid, upstream.proc.pid)}
        t_a = time.time()
        time.sleep(s["window_s"])
        b = worker.next_stats()
        up_b, cpu_b = upstream.stats(), {p: proc_cpu_s(p) for p in (rig.emulator_pid, upstream.proc.pid)}
        t_b = time.time()
        win = Window.between(a, b)
        parts = Window.series(worker.stats_between(a, b))
        produced = lambda st: sum(x["produced"] for x in st["streams"].values())  # noqa: E731
        emu, up = (cpu_b[p] - cpu_a[p] for p in (rig.emulator_pid, upstream.proc.pid))
    stored = win.counters["MessagesStored"]
    batches = win.ddb("BatchWriteItem")
    return {
        "sub_windows": [vars(w) for w in parts],
        "stored_per_s_spread": median_spread(w.counters["MessagesStored"] / w.seconds for w in parts),
        "worker_cpu_ms_per_message_spread": median_spread(
            w.cpu_s / w.counters["MessagesStored"] * 1000 for w in parts if w.counters["MessagesStored"]
        ),
        "connections": n,
        "rate_per_connection": rate,
        "flush_interval_ms": flush_ms,
        "window": vars(win),
        "offered_per_s": (produced(up_b) - produced(up_a)) / (t_b - t_a),
        "stored_per_s": stored / win.seconds,
        "messages_per_batch": stored / batches if batches else None,
        "ddb_requests_per_message": win.ddb_total / stored if stored else None,
        "batch_requests_per_message": batches / stored if stored else None,
        "worker_cpu_ms_per_message": win.cpu_s / stored * 1000 if stored else None,
        "worker_cpu_share": win.cpu_s / win.seconds,
        "emulator_cpu_share": emu / (t_b - t_a),
        "upstream_cpu_share": up / (t_b - t_a),
        "lag_p99_ms": win.lag_p99_ms,
        "lag_max_ms": win.lag_max_ms,
    }


def limit_of(level: dict[str, Any]) -> str:
    if level["stored_per_s"] >= 0.95 * level["offered_per_s"]:
        return "kept up"
    if level["emulator_cpu_share"] >= 0.8:
        return f"emulator ({level['emulator_cpu_share'] * 100:.0f} % CPU)"
    if level["worker_cpu_share"] >= 0.8:
        return "worker CPU"
    return "neither saturated: machine (2 cores shared)"


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    levels = []
    for i, (n, rate, flush_ms) in enumerate(s["levels"]):
        levels.append(run_level(run_dir / f"ingestion-{i}", n, rate, flush_ms, s))
    rows = [
        [
            f"{lv['connections']} x {lv['rate_per_connection']:g}/s, flush {lv['flush_interval_ms']} ms",
            fmt(lv["offered_per_s"], 0),
            fmt_spread(lv["stored_per_s_spread"], 0),
            fmt(lv["messages_per_batch"], 1),
            fmt(lv["ddb_requests_per_message"], 3),
            fmt_spread(lv["worker_cpu_ms_per_message_spread"], 2),
            f"{lv['worker_cpu_share'] * 100:.0f} %",
            f"{lv['emulator_cpu_share'] * 100:.0f} %",
            f"{lv['upstream_cpu_share'] * 100:.0f} %",
            f"{fmt(lv['lag_p99_ms'], 1)} / {fmt(lv['lag_max_ms'], 1)}",
            limit_of(lv),
            before.INGESTION.get((lv["connections"], lv["rate_per_connection"], lv["flush_interval_ms"]), "-"),
        ]
        for lv in levels
    ]
    header = ["connections x rate, flush", "offered msg/s", "stored msg/s", "msgs / batch", "DynamoDB req / msg",
              "worker CPU ms / msg", "worker CPU", "emulator CPU", "upstream CPU", "loop lag p99 / max ms", "limit",
              before.LABEL + ": stored msg/s, req / msg, CPU ms / msg"]
    notes = [
        f"One worker at the default timings (LEASE 10 s, HEARTBEAT 2.5 s, RECONCILE 10 s, CHECKPOINT_SECONDS 120; before: "
        "LEASE 20 s, HEARTBEAT 5 s), a fresh emulator and upstream process per row; "
        f"{s['window_s']} s window after {s['warmup_s']} s warm-up; stored msg/s and CPU per message are the median "
        f"(min-max) over the window's {s['worker'][cfg.METRICS_SECONDS]} s stats intervals, the rest are whole-window "
        "figures. DynamoDB req / msg counts every DynamoDB request in the window (batches, session renewals, watch, "
        "free scan, audit, UnownedConnections counts, checkpoints) over the messages stored.",
        "CPU shares are of one core; the machine has 2, shared by the worker, the emulator and the upstream. "
        "A row is emulator-bound when the emulator (one request at a time) is near a full core: the stored rate is "
        "then moto's speed, and the worker's own cost is its CPU per message.",
    ]
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    return Result("Ingestion", command, s, md_table(header, rows), {"settings": s, "levels": levels}, notes)
