"""Capacity: one worker process holding 5,000 connections to a local upstream, at the
worker's DEFAULT lease and heartbeat, on one emulator.

With session leases a worker renews one session item per heartbeat whatever it holds
(0.4 writes/s at the default 2.5 s), so the emulator's ~80-90 writes/s no longer caps
how many connections one worker can hold at the default heartbeat; only the connect
burst (an acquire and a stored-end read per connection) and a graceful shutdown (a
release each) still go at the emulator's pace.

What it measures, in one run of one worker:

* memory per connection: the worker's resident memory (``/proc``, now, not the peak)
  with 0, N/2 and N connections held; the slope between N/2 and N is the cost of one
  more connection, free of start-up memory;
* while it holds N (a window at least as long as the worker's two-minute lag record,
  so that the connect burst is out of it): event-loop lag (p99 and max of its 250 ms
  probes), session renewals per second, CPU per connection-hour; and, one at a time
  through the event router, START -> socket open and STOP -> socket closed (the STOP
  reaches the worker through its session's inbox, brought back by its next renewal),
  timed on a probe upstream of their own;
* CPU per message, as the marginal cost of M busy connections added in a second window
  (CPU rate with them, less the holding rate scaled to N + M, over the message rate);
* graceful shutdown: SIGTERM -> exit, within SHUTDOWN_SECONDS (default 25 s): releases
  go at the emulator's write rate, and what is left stays attached to the ENDED session
  for the watchers to take at once.

The upstreams run in processes of their own: quiet ones (no frames, only WebSocket
pings) for the N, a busy one for the M.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from wsfleet import config as cfg
from wsfleet import settings_spec
from sim.processes import eventually

from . import before
from .common import Result, Rig, UpstreamProcess, Window, distribution, fmt, md_table, median_spread, proc_cpu_s, proc_rss_mb

LAG_WINDOW_S = 125  # the worker's lag p99 covers its last 480 probes of 250 ms: 2 minutes
START_TARGET_S = 1.0
STOP_SLACK_S = 1.0  # STOP -> closed within HEARTBEAT + this


def settings_for(quick: bool) -> dict[str, Any]:
    n = 10 if quick else 5000
    busy = 2 if quick else 20
    probes = 2 if quick else 10
    return {
        "connections": n,
        "busy_connections": busy,
        "busy_rate_per_connection": 5.0,
        "probes": probes,
        # Connected this many at a time: one moto server serialises every request, and a
        # burst of thousands of acquires queues the session renewal behind them.
        "chunk": n // 2 if quick else 500,
        "hold_window_s": 3 if quick else LAG_WINDOW_S,
        "busy_window_s": 2 if quick else 60,
        "settle_s": 0.5 if quick else 5,
        "worker": {
            # LEASE, HEARTBEAT, RECONCILE, CHECKPOINT and SHUTDOWN at the worker's defaults
            # (10 / 2.5 / 10 / 120 / 25 s); stats every 5 s for the windows.
            **({settings_spec.LEASE_SECONDS: 3, settings_spec.HEARTBEAT_SECONDS: 1, settings_spec.RECONCILE_SECONDS: 1, settings_spec.MAX_CLOCK_SKEW_MS: 200,
                settings_spec.SHUTDOWN_SECONDS: 10} if quick else {}),
            settings_spec.FLUSH_INTERVAL_MS: 1000,
            settings_spec.METRICS_SECONDS: 0.5 if quick else 5,
            settings_spec.MAX_CONNECTIONS: n + busy + probes,
        },
    }


def _enough_file_descriptors(n: int) -> None:
    """Each socket is a descriptor in the worker and in the upstream; children inherit
    our limit, so raise the soft limit (up to the hard one) if it is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


def _probe(rig: Rig, upstream: UpstreamProcess, ids: list[str], *, timeout: float) -> tuple[list[float], list[float]]:
    """START each through the router and time it to its socket opening, then STOP each
    and time it to its socket closing: one at a time, on the probe upstream's books."""

    def sockets(cid: str) -> int:
        return upstream.stats()["streams"].get(cid, {}).get("open_sockets", 0)

    starts, stops = [], []
    for cid in ids:
        began = time.time()
        rig.post_event({"event_type": "START", "connection_id": cid, "ws_url": upstream.url_for(cid)})
        eventually(lambda cid=cid: sockets(cid) == 1, timeout, f"{cid} connected", interval=0.02)
        starts.append(time.time() - began)
    time.sleep(1.0)  # every probe's acquire is behind it
    for cid in ids:
        began = time.time()
        rig.post_event({"event_type": "STOP", "connection_id": cid})
        eventually(lambda cid=cid: sockets(cid) == 0, timeout, f"{cid} closed", interval=0.02)
        stops.append(time.time() - began)
    return starts, stops


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    n, busy = s["connections"], s["busy_connections"]
    w_env = s["worker"]
    config = cfg.WorkerConfig.from_env({"TABLE_NAME": "t", "SESSIONS_TABLE_NAME": "s", "MESSAGES_TABLE_NAME": "m", "MESSAGES_BUCKET_NAME": "b",
                                        "QUEUE_URL": "q", "AWS_REGION": "r", **{k: str(v) for k, v in w_env.items()}})
    heartbeat = config.heartbeat_ms / 1000
    connect_timeout = 300 + 3 * config.reconcile_ms / 1000
    _enough_file_descriptors(2 * (n + busy))
    d: dict[str, Any] = {"settings": s}
    with Rig(run_dir / "capacity") as rig:
        quiet = rig.upstream(None, "upstream-quiet")
        hot = rig.upstream(s["busy_rate_per_connection"], "upstream-busy")
        probe = rig.upstream(None, "upstream-probe")
        worker = rig.worker("w1", w_env)
        worker.next_stats()
        time.sleep(s["settle_s"])
        rss = {0: proc_rss_mb(worker.pid)}
        bursts = []
        ids = [f"cap{i:05d}" for i in range(n)]
        step = s["chunk"]
        for first in range(0, n, step):
            part = ids[first:first + step]
            target = quiet.open_sockets() + len(part)
            began = time.time()
            rig.start_connections(part, quiet)
            written = time.time()
            eventually(lambda target=target: quiet.open_sockets() >= target, connect_timeout, f"{target} sockets open", interval=1.0)
            bursts.append({"connections": len(part), "write_s": written - began, "all_connected_s": time.time() - began})
            if first + len(part) in (n // 2, n):
                time.sleep(max(s["settle_s"], heartbeat))
                rss[first + len(part)] = proc_rss_mb(worker.pid)

        # Holding N, no messages: renewals, lag, CPU; START and STOP probes meanwhile.
        emu0, up0 = proc_cpu_s(rig.emulator_pid), proc_cpu_s(quiet.proc.pid)
        a = worker.next_stats()
        began = time.monotonic()
        probe_ids = [f"probe{i:02d}" for i in range(s["probes"])]
        start_s, stop_s = _probe(rig, probe, probe_ids, timeout=30 + 2 * heartbeat)
        time.sleep(max(0.0, s["hold_window_s"] - (time.monotonic() - began)))
        b = worker.next_stats()
        hold = Window.between(a, b)
        emu_hold = (proc_cpu_s(rig.emulator_pid) - emu0) / hold.seconds
        up_hold = (proc_cpu_s(quiet.proc.pid) - up0) / hold.seconds
        rss_after_hold = proc_rss_mb(worker.pid)

        # M busy connections on top: the marginal CPU of a message.
        busy_ids = [f"busy{i:03d}" for i in range(busy)]
        rig.start_connections(busy_ids, hot, hint=True)
        eventually(lambda: hot.open_sockets() >= busy, connect_timeout, f"{busy} busy sockets open", interval=0.5)
        time.sleep(s["settle_s"])
        emu0 = proc_cpu_s(rig.emulator_pid)
        c = worker.next_stats()
        time.sleep(s["busy_window_s"])
        e = worker.next_stats()
        hot_win = Window.between(c, e)
        emu_busy = (proc_cpu_s(rig.emulator_pid) - emu0) / hot_win.seconds

        # Graceful shutdown of everything it holds (bounded by SHUTDOWN_SECONDS).
        sigterm = time.time()
        worker.stop(grace_s=config.shutdown_seconds + 15)
        done = worker.events("shutdown_complete")
        shutdown = {"exit_s": time.time() - sigterm, **({k: done[-1].get(k) for k in ("took_s", "left", "LeasesReleased")} if done else {})}
        connect_lag_max = max((st.lag_max_ms or 0) for st in worker.stats() if st.ts <= a.ts)
        worker_events = worker.events()

    total = n + busy
    per_conn_slope = (rss[n] - rss[n // 2]) / (n - n // 2) * 1024  # KB
    per_conn_avg = (rss[n] - rss[0]) / n * 1024
    renew_rate = hold.renewals / hold.seconds
    renew_retries = len([e for e in worker_events if e.get("event") == "renew_retry" and a.ts <= e["ts"] <= b.ts])
    cpu_hold_rate = hold.cpu_s / hold.seconds
    cpu_hold_per_conn_hour = cpu_hold_rate / n * 3600
    msgs = hot_win.counters["MessagesStored"]
    msg_rate = msgs / hot_win.seconds
    cpu_busy_rate = hot_win.cpu_s / hot_win.seconds
    marginal = (cpu_busy_rate - cpu_hold_rate * total / n) / msg_rate if msg_rate else None
    lost = hold.counters["LeasesLost"] + hot_win.counters["LeasesLost"]
    sessions_kept = hold.same_session and hot_win.same_session
    start_d, stop_d = distribution(start_s), distribution(stop_s)
    stop_target = heartbeat + STOP_SLACK_S
    d.update(
        rss_mb=rss, rss_after_hold_mb=rss_after_hold, bursts=bursts, hold=vars(hold), busy=vars(hot_win),
        emulator_cpu_share={"hold": emu_hold, "busy": emu_busy}, upstream_cpu_share_hold=up_hold, shutdown=shutdown,
        connect_lag_max_ms=connect_lag_max, start_s=start_s, stop_s=stop_s,
        derived={
            "rss_kb_per_connection_slope": per_conn_slope, "rss_kb_per_connection_avg": per_conn_avg,
            "renewals_per_s": renew_rate, "cpu_s_per_connection_hour": cpu_hold_per_conn_hour,
            "cpu_share_holding": cpu_hold_rate, "cpu_ms_per_message_marginal": marginal * 1000 if marginal is not None else None,
            "cpu_ms_per_message_all": hot_win.cpu_s / msgs * 1000 if msgs else None, "leases_lost": lost,
            "sessions_kept": sessions_kept,
        },
    )

    def judged(dist: dict, target: float) -> str:
        return f"≤ {target:g} s: {'met' if dist['max'] is not None and dist['max'] <= target else 'MISSED'}"

    b_ = before.CAPACITY
    rows = [
        ["connections held by one worker", f"{n} (+{busy} busy) at HEARTBEAT {heartbeat:g} s", f"{n} at the default heartbeat",
         b_["connections"]],
        [f"START -> connected while holding {n} (p50 / p99 / max, {len(start_s)} one at a time)",
         f"{fmt(start_d['p50'])} / {fmt(start_d['p99'])} / {fmt(start_d['max'])} s", judged(start_d, START_TARGET_S), "-"],
        [f"STOP -> closed while holding {n} (p50 / p99 / max, {len(stop_s)} one at a time)",
         f"{fmt(stop_d['p50'])} / {fmt(stop_d['p99'])} / {fmt(stop_d['max'])} s", judged(stop_d, stop_target), "-"],
        ["memory per connection (RSS slope N/2 -> N)", f"{per_conn_slope:.0f} KB", "-", b_["memory_kb_slope"]],
        ["memory per connection (RSS 0 -> N, average)", f"{per_conn_avg:.0f} KB", "-", b_["memory_kb_avg"]],
        [f"RSS with 0 / {n // 2} / {n} connections", f"{rss[0]:.0f} / {rss[n // 2]:.0f} / {rss[n]:.0f} MB", "-", "67 / 75 / 88 MB (0 / 500 / 1000)"],
        [f"event-loop lag p99 / max, holding {n} (last {LAG_WINDOW_S // 60} min, probes included)",
         f"{fmt(hold.lag_p99_ms, 1)} / {fmt(hold.lag_max_ms, 1)} ms", "-", b_["lag_hold"]],
        [f"event-loop lag p99 / max, + {busy} busy connections", f"{fmt(hot_win.lag_p99_ms, 1)} / {fmt(hot_win.lag_max_ms, 1)} ms",
         "-", b_["lag_busy"]],
        ["event-loop lag max while connecting", f"{connect_lag_max:.0f} ms", "-", b_["lag_connect"]],
        ["session renewals sustained", f"{renew_rate:.2f} per s ({hold.renewals} renewals, {renew_retries} retried tries; "
         f"connections lost: {lost}; session kept: {'yes' if sessions_kept else 'NO'})", f"1 / HEARTBEAT = {1 / heartbeat:.2f} per s",
         b_["renewals"]],
        [f"worker CPU holding {n} (no messages)", f"{cpu_hold_rate * 100:.1f} % of a core = {cpu_hold_per_conn_hour:.3f} CPU-s per "
         "connection-hour", "-", b_["cpu_hold"]],
        ["worker CPU per message (marginal)", f"{fmt(marginal * 1000 if marginal is not None else None, 3)} ms "
         f"({msg_rate:.0f} msg/s on {busy} connections)", "-", b_["cpu_per_message"]],
        ["emulator CPU (holding / busy)", f"{emu_hold * 100:.0f} % / {emu_busy * 100:.0f} % of a core", "-", b_["emulator_cpu"]],
        [f"connect {s['chunk']} at a time (START write -> all sockets open), {len(bursts)} times",
         f"median {fmt(median_spread(x['all_connected_s'] for x in bursts)['median'], 1)} s, max "
         f"{max(x['all_connected_s'] for x in bursts):.1f} s", "-", b_["connect"]],
        [f"graceful shutdown (SIGTERM -> exit, SHUTDOWN_SECONDS {config.shutdown_seconds:g})",
         f"{shutdown['exit_s']:.1f} s, released {shutdown.get('LeasesReleased')}, left {shutdown.get('left')}", "-",
         b_["shutdown"]],
    ]
    notes = [
        f"Settings: LEASE {config.lease_ms / 1000:g} s, HEARTBEAT {heartbeat:g} s, RECONCILE {config.reconcile_ms / 1000:g} s"
        f"{'' if quick else ' (the worker defaults)'}, FLUSH_INTERVAL_MS {config.flush_interval_ms}, METRICS_SECONDS {config.metrics_seconds:g}; "
        f"quiet upstreams send nothing (only WebSocket pings every 20 s), busy upstream {s['busy_rate_per_connection']:g} msg/s "
        f"per stream; windows {hold.seconds:.0f} s holding and {hot_win.seconds:.0f} s busy. The N are STARTed by the router's "
        "write without a hint (the free scan finds them, so a burst includes up to one RECONCILE interval); the probes go "
        "through the event router (START hints; STOP posts to the owner's session inbox). Connected "
        f"{s['chunk']} at a time.",
        "The connect burst and the shutdown go at the emulator's write rate (one moto server, every DynamoDB request "
        f"serialised): {s['chunk']} acquires and stored-end reads per step, a release per connection at shutdown (what the "
        "budget leaves is taken by watchers at once). Against DynamoDB these run in parallel (32 threads).",
        "Memory is the worker's resident set from /proc; a socket's kernel buffers are not in it.",
    ]
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    header = ["figure", "measured", "target", before.LABEL + " (1,000 at HEARTBEAT 30 s)"]
    return Result("Capacity", command, s, md_table(header, rows), d, notes)
