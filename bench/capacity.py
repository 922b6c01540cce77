"""Capacity: one worker process holding 1,000+ connections to a local upstream.

What it measures, in one run of one worker:

* memory per connection: the worker's resident memory (``/proc``, now, not the peak)
  with 0, N/2 and N connections held; the slope between N/2 and N is the cost of one
  more connection, free of start-up memory;
* event-loop lag (the worker's own p99 and max over its last two minutes of 250 ms
  probes) while it heartbeats all N, after a steady window at least that long, so that
  the connect burst is out of it;
* renewals per second actually sustained against the N / HEARTBEAT_SECONDS the worker
  owes, and any lease lost for lack of them;
* CPU: per connection-hour while holding (no messages: the quiet upstream sends none),
  then per message, as the marginal cost of M busy connections added in a second
  window (CPU rate with them, less the holding rate scaled to N + M, over the message
  rate): a ratio of two windows of the same process.

The emulator is the limit here, not the worker: one moto server handles about 80-90
DynamoDB writes per second, so N renewals every HEARTBEAT_SECONDS must stay well
under that (1,000 connections at a 30 s heartbeat = 33 renewals/s, plus the message
batches of the busy window). The upstreams run in processes of their own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from wsfleet import config as cfg
from wsfleet.local.fleet import eventually

from .common import Result, Rig, Window, fmt, md_table, proc_cpu_s, proc_rss_mb

LAG_WINDOW_S = 125  # the worker's lag p99 covers its last 480 probes of 250 ms: 2 minutes


def settings_for(quick: bool) -> dict[str, Any]:
    n = 10 if quick else 1000
    busy = 2 if quick else 20
    return {
        "connections": n,
        "busy_connections": busy,
        "busy_rate_per_connection": 5.0,
        "hold_window_s": 2 if quick else LAG_WINDOW_S,
        "busy_window_s": 2 if quick else 60,
        "settle_s": 0.5 if quick else 10,
        "worker": {
            cfg.LEASE_SECONDS: 3 if quick else 90,
            cfg.HEARTBEAT_SECONDS: 1 if quick else 30,
            cfg.RECONCILE_SECONDS: 1 if quick else 10,
            cfg.MAX_CLOCK_SKEW_MS: 200 if quick else 1000,
            cfg.FLUSH_INTERVAL_MS: 1000,
            cfg.METRICS_SECONDS: 0.5 if quick else 5,
            cfg.MAX_CONNECTIONS: n + busy,
            cfg.SHUTDOWN_SECONDS: 10 if quick else 60,
        },
    }


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    n, busy = s["connections"], s["busy_connections"]
    w_env = s["worker"]
    heartbeat = float(w_env[cfg.HEARTBEAT_SECONDS])
    connect_timeout = 120 + 3 * float(w_env[cfg.RECONCILE_SECONDS])
    d: dict[str, Any] = {"settings": s}
    with Rig(run_dir / "capacity") as rig:
        quiet = rig.upstream(None, "upstream-quiet")
        hot = rig.upstream(s["busy_rate_per_connection"], "upstream-busy")
        worker = rig.worker("w1", w_env)
        worker.next_stats()
        time.sleep(s["settle_s"])
        rss = {0: proc_rss_mb(worker.pid)}
        bursts = []
        ids = [f"cap{i:04d}" for i in range(n)]
        for part in (ids[: n // 2], ids[n // 2:]):
            target = quiet.open_sockets() + len(part)
            began = time.time()
            rig.start_connections(part, quiet)
            written = time.time()
            eventually(lambda target=target: quiet.open_sockets() >= target, connect_timeout, f"{target} sockets open", interval=0.5)
            bursts.append({"connections": len(part), "write_s": written - began, "all_connected_s": time.time() - began})
            time.sleep(max(s["settle_s"], heartbeat))  # every new connection has renewed once
            rss[target] = proc_rss_mb(worker.pid)

        # Holding N, no messages: renewals, lag, CPU.
        emu0, up0 = proc_cpu_s(rig.emulator_pid), proc_cpu_s(quiet.proc.pid)
        a = worker.next_stats()
        time.sleep(s["hold_window_s"])
        b = worker.next_stats()
        hold = Window.between(a, b)
        emu_hold = (proc_cpu_s(rig.emulator_pid) - emu0) / hold.seconds
        up_hold = (proc_cpu_s(quiet.proc.pid) - up0) / hold.seconds
        rss_after_hold = proc_rss_mb(worker.pid)

        # M busy connections on top: the marginal CPU of a message.
        busy_ids = [f"busy{i:03d}" for i in range(busy)]
        rig.start_connections(busy_ids, hot)
        eventually(lambda: hot.open_sockets() >= busy, connect_timeout, f"{busy} busy sockets open", interval=0.5)
        time.sleep(s["settle_s"])
        emu0 = proc_cpu_s(rig.emulator_pid)
        c = worker.next_stats()
        time.sleep(s["busy_window_s"])
        e = worker.next_stats()
        hot_win = Window.between(c, e)
        emu_busy = (proc_cpu_s(rig.emulator_pid) - emu0) / hot_win.seconds

        # Graceful shutdown of everything it holds (bounded by the emulator's write rate).
        sigterm = time.time()
        worker.stop(grace_s=float(w_env[cfg.SHUTDOWN_SECONDS]) + 10)
        done = worker.events("shutdown_complete")
        shutdown = {"exit_s": time.time() - sigterm, **({k: done[-1].get(k) for k in ("took_s", "left", "LeasesReleased")} if done else {})}
        connect_lag_max = max((st.lag_max_ms or 0) for st in worker.stats() if st.ts <= a.ts)

    total = n + busy
    per_conn_slope = (rss[n] - rss[n // 2]) / (n - n // 2) * 1024  # KB
    per_conn_avg = (rss[n] - rss[0]) / n * 1024
    renew_rate = (hold.ddb("UpdateItem") - hold.counters["LeasesAcquired"]) / hold.seconds
    owed = n / heartbeat
    cpu_hold_rate = hold.cpu_s / hold.seconds
    cpu_hold_per_conn_hour = cpu_hold_rate / n * 3600
    # All holding CPU (pings, reconcile, stats included) charged to the renewals: an upper
    # bound on one renewal's cost, and what the default heartbeat would cost per connection.
    cpu_per_renewal = hold.cpu_s / (renew_rate * hold.seconds) if renew_rate else None
    default_hb = 5.0
    per_core_at_default = default_hb / cpu_per_renewal if cpu_per_renewal else None
    msgs = hot_win.counters["MessagesStored"]
    msg_rate = msgs / hot_win.seconds
    cpu_busy_rate = hot_win.cpu_s / hot_win.seconds
    marginal = (cpu_busy_rate - cpu_hold_rate * total / n) / msg_rate if msg_rate else None
    lost = hold.counters["LeasesLost"] + hot_win.counters["LeasesLost"]
    d.update(
        rss_mb=rss, rss_after_hold_mb=rss_after_hold, bursts=bursts, hold=vars(hold), busy=vars(hot_win),
        emulator_cpu_share={"hold": emu_hold, "busy": emu_busy}, upstream_cpu_share_hold=up_hold, shutdown=shutdown,
        connect_lag_max_ms=connect_lag_max,
        derived={
            "rss_kb_per_connection_slope": per_conn_slope, "rss_kb_per_connection_avg": per_conn_avg,
            "renewals_per_s": renew_rate, "renewals_owed_per_s": owed, "cpu_s_per_connection_hour": cpu_hold_per_conn_hour,
            "cpu_share_holding": cpu_hold_rate, "cpu_ms_per_message_marginal": marginal * 1000 if marginal is not None else None,
            "cpu_ms_per_message_all": hot_win.cpu_s / msgs * 1000 if msgs else None, "leases_lost": lost,
            "cpu_ms_per_renewal": cpu_per_renewal * 1000 if cpu_per_renewal else None,
            "connections_per_core_at_5s_heartbeat": per_core_at_default,
        },
    )
    rows = [
        ["connections held by one worker", f"{n} (+{busy} busy)", "100 per task"],
        ["memory per connection (RSS slope N/2 -> N)", f"{per_conn_slope:.0f} KB", "2-5 MB"],
        ["memory per connection (RSS 0 -> N, average)", f"{per_conn_avg:.0f} KB", ""],
        [f"RSS with 0 / {n // 2} / {n} connections", f"{rss[0]:.0f} / {rss[n // 2]:.0f} / {rss[n]:.0f} MB", ""],
        [f"event-loop lag p99 / max, holding {n} (last {LAG_WINDOW_S // 60} min)",
         f"{fmt(hold.lag_p99_ms, 1)} / {fmt(hold.lag_max_ms, 1)} ms", ""],
        [f"event-loop lag p99 / max, + {busy} busy connections", f"{fmt(hot_win.lag_p99_ms, 1)} / {fmt(hot_win.lag_max_ms, 1)} ms", ""],
        ["event-loop lag max while connecting", f"{connect_lag_max:.0f} ms", ""],
        ["renewals sustained / owed", f"{renew_rate:.1f} / {owed:.1f} per s (leases lost: {lost})", ""],
        [f"worker CPU holding {n} (no messages)", f"{cpu_hold_rate * 100:.1f} % of a core = {cpu_hold_per_conn_hour:.2f} CPU-s per connection-hour", ""],
        ["worker CPU per renewal (all holding CPU / renewals)",
         f"{fmt(cpu_per_renewal * 1000 if cpu_per_renewal else None, 2)} ms: at HEARTBEAT {default_hb:g} s one core renews "
         f"about {fmt(per_core_at_default, 0)} connections", ""],
        ["worker CPU per message (marginal)", f"{fmt(marginal * 1000 if marginal is not None else None, 3)} ms "
         f"({msg_rate:.0f} msg/s on {busy} connections)", ""],
        ["emulator CPU (holding / busy)", f"{emu_hold * 100:.0f} % / {emu_busy * 100:.0f} % of a core", ""],
        [f"connect {n // 2} (START write -> all sockets open)", " / ".join(f"{b['all_connected_s']:.1f} s" for b in bursts), ""],
        ["graceful shutdown of all (SIGTERM -> exit)", f"{shutdown['exit_s']:.1f} s, released {shutdown.get('LeasesReleased')}, "
         f"left {shutdown.get('left')}", ""],
    ]
    notes = [
        f"Settings: LEASE {w_env[cfg.LEASE_SECONDS]} s, HEARTBEAT {w_env[cfg.HEARTBEAT_SECONDS]} s, RECONCILE "
        f"{w_env[cfg.RECONCILE_SECONDS]} s, FLUSH_INTERVAL_MS {w_env[cfg.FLUSH_INTERVAL_MS]}; quiet upstream sends nothing "
        f"(only WebSocket pings every 20 s), busy upstream {s['busy_rate_per_connection']:g} msg/s per stream; "
        f"windows {hold.seconds:.0f} s holding and {hot_win.seconds:.0f} s busy.",
        "The heartbeat is 30 s (not the default 5 s) because one moto server cannot take 1,000 renewals every 5 s "
        "(200 writes/s); the worker's per-renewal cost is the same, so its CPU at a 5 s heartbeat is about 6x the "
        "holding figure's renewal part. The emulator, not the worker, is what limits N here.",
        "Memory is the worker's resident set from /proc; a socket's kernel buffers are not in it.",
    ]
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    return Result("Capacity", command, s, md_table(["figure", "measured", "published design"], rows), d, notes)
