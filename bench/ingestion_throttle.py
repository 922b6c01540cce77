"""Ingestion's throttle row: one worker at 2,000 msg/s offered while the emulator
throttles half of all DynamoDB requests; its memory, pending frames and backpressure
before, during and after, how long the table took to catch up, and the read-back audit
(see :mod:`.ingestion` for what each figure means)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from wsfleet import schema
from sim.emulator import faults, set_faults
from sim.processes import eventually
from wsfleet.sinks import MessagesStore
from wsfleet.worker import writer as writer_mod

from .common import Rig, Window, fmt, latency_between, latency_cell, md_table, proc_rss_mb
from .faults import stored_ends
from .worker_load import DEFAULTS, connect


def sample_rss(pid: int, seconds: float, every: float) -> list[float]:
    """The process's resident memory (MB, from /proc) every ``every`` s for ``seconds``."""
    out, end = [], time.monotonic() + seconds
    while True:
        out.append(proc_rss_mb(pid))
        if time.monotonic() + every > end:
            return out
        time.sleep(every)


def run_throttle(run_dir: Path, t: dict[str, Any]) -> dict[str, Any]:
    """One worker at 2,000 msg/s offered; half of all DynamoDB requests throttled for
    ``during_s``. Memory, pending frames and backpressure before / during / after; how
    long until the frames sent by the end of the throttling were stored; then a graceful
    stop and the read-back audit (gaps, checkpoints, frames given up)."""
    n, rate = t["connections"], t["rate_per_connection"]
    with Rig(run_dir) as rig:
        url = rig.emulator.endpoint_url
        upstream = rig.upstream(rate)
        worker = rig.worker("w1", t["worker"])
        ids = [f"thr{i:03d}" for i in range(n)]
        connect(rig, upstream, ids)
        marks = {"start": worker.next_stats()}
        rss = {"before": sample_rss(worker.pid, t["before_s"], t["sample_every_s"])}
        marks["on"] = worker.next_stats()
        set_faults(url, throttle=t["share"], seed=t["seed"])
        rss["during"] = sample_rss(worker.pid, t["during_s"], t["sample_every_s"])
        counts = faults(url)
        set_faults(url, throttle=0)
        # What the upstream had sent when the throttling ended (the highest seq sent on
        # each stream's socket): when is all of it stored?
        sent = {cid: st["sent_head"] for cid, st in upstream.stats()["streams"].items() if cid in ids}
        marks["off"] = worker.next_stats()
        rss["after"] = sample_rss(worker.pid, t["after_s"], t["sample_every_s"])
        marks["end"] = worker.next_stats()
        # Follow each stream's gap-free stored end (each read goes on from the last one,
        # so it stays cheap) until it reaches what was sent, or the timeout.
        messages = MessagesStore(rig.ddb, rig.aws_env["MESSAGES_TABLE_NAME"])
        ends = dict.fromkeys(ids, 0)
        began = time.monotonic()

        def caught_up() -> bool:
            for cid in ids:
                if ends[cid] < sent.get(cid, 0):
                    ends[cid] = messages.stored_end(cid, ends[cid])
            return all(ends[cid] >= sent.get(cid, 0) for cid in ids)

        try:
            eventually(caught_up, t["drain_timeout_s"], "every sent frame stored", interval=1.0)
            drained_s: float | None = time.monotonic() - began
        except TimeoutError:
            drained_s = None
        not_yet = sum(max(0, sent.get(cid, 0) - ends[cid]) for cid in ids)
        lines = worker.stats()
        # A quiet table for the audit: SIGTERM (the worker flushes, releases each
        # connection with its final checkpoint, and exits), then read every stream back.
        worker.stop(grace_s=DEFAULTS.shutdown_seconds + 15)
        books = upstream.stats()["streams"]
        stored = stored_ends(rig, messages, ids, since=ends)
        events = worker.events()
        errors = Counter(e.get("error", "").split(";")[0] for e in events if e["event"] == "socket_error")
        unwritten = sum(int(e.get("unwritten") or 0) for e in events)
        items = {cid: rig.connections.get(cid) or {} for cid in ids}

    def phase(a: Any, b: Any) -> dict[str, Any]:
        inside = [x for x in lines if a.ts <= x.ts <= b.ts]
        w = Window.between(a, b)
        return {
            "seconds": w.seconds,
            "stored_per_s": w.counters["MessagesStored"] / w.seconds if w.seconds else None,
            "backpressure_waits": w.counters["BackpressureWaits"],
            "pending_max": max((x.writer.get("pending", 0) for x in inside), default=0),
            "leases_lost": w.counters["LeasesLost"],
            "same_session": w.same_session,
            "ddb_requests": w.ddb_total,
            "latency_ms": latency_between(a, b),
        }

    return {
        "connections": n,
        "rate_per_connection": rate,
        "share": t["share"],
        "seed": t["seed"],
        "throttled": sum(counts["throttled"].values()),
        "passed": sum(counts["passed"].values()),
        "rss_mb": {k: {"max": max(v), "first": v[0], "last": v[-1], "samples": v} for k, v in rss.items()},
        "max_rss_mb_peak": marks["end"].max_rss_mb,
        "phases": {"before": phase(marks["start"], marks["on"]), "during": phase(marks["on"], marks["off"]),
                   "after": phase(marks["off"], marks["end"])},
        "caps": {"per_connection": writer_mod.MAX_PENDING_PER_CONNECTION, "worker": writer_mod.MAX_PENDING},
        "sent": sent,
        "drained_s": drained_s,
        "not_yet_stored": not_yet,
        "gaps": sorted(cid for cid, (highest, end) in stored.items() if end < highest),
        "missing_below_highest": sum(highest - end for highest, end in stored.values()),
        "checkpoint_past_stored_end": sum(max(0, int(items[cid].get(schema.LAST_SEQ) or 0) - stored[cid][1]) for cid in ids),
        "checkpoint_is_stored_end": sum(1 for cid in ids if items[cid].get(schema.LAST_SEQ) == stored[cid][1]),
        "unwritten": unwritten,
        "sockets_reopened": sum(books[cid]["sockets_opened"] - 1 for cid in ids if cid in books),
        "reconnects": lines[-1].counters["Reconnects"] if lines else 0,
        "socket_errors": dict(errors),
        "overlaps": sum(books[cid]["overlaps"] for cid in ids if cid in books),
        "stored_total": sum(end for _, end in stored.values()),
        "produced_total": sum(books[cid]["produced"] for cid in ids if cid in books),
    }


def throttle_table(r: dict[str, Any]) -> tuple[str, list[str]]:
    ph, rss = r["phases"], r["rss_mb"]
    cap = r["caps"]["worker"]
    # Bounded: the writer never held more than its cap, and memory stopped growing while
    # it stayed there: over the second half of the after phase (still 2,000 msg/s
    # offered, so the writer stays full) RSS grows by at most 2 %.
    late = rss["after"]["samples"][len(rss["after"]["samples"]) // 2 :]
    growth = (max(late) - late[0]) / late[0]
    bounded = all(p["pending_max"] <= cap for p in ph.values()) and growth <= 0.02
    lost = r["missing_below_highest"] + r["checkpoint_past_stored_end"] + r["unwritten"]
    clean = lost == 0 and not r["gaps"]
    total = r["throttled"] + r["passed"]
    header = [f"{r['connections']} x {r['rate_per_connection']:g} msg/s offered, {r['share']:.0%} throttled for "
              f"{r['phases']['during']['seconds']:.0f} s", "before", "during", "after"]
    rows = [
        ["stored msg/s", *(fmt(ph[k]["stored_per_s"], 0) for k in ph)],
        ["worker RSS max (first -> last) MB",
         *(f"{rss[k]['max']:.0f} ({rss[k]['first']:.0f} -> {rss[k]['last']:.0f})" for k in ("before", "during", "after"))],
        [f"writer pending max (cap {cap:,}; {r['caps']['per_connection']:,} per connection)",
         *(f"{ph[k]['pending_max']:,}" for k in ph)],
        ["backpressure waits", *(f"{ph[k]['backpressure_waits']:,}" for k in ph)],
        ["received -> stored p50 / p99 / max ms", *(latency_cell(ph[k]["latency_ms"]) for k in ph)],
        ["leases lost; same session", *(f"{ph[k]['leases_lost']}; {'yes' if ph[k]['same_session'] else 'NO'}" for k in ph)],
    ]
    verdict = [
        ["throttled (measured)", f"{r['throttled'] / total * 100:.0f} % of {total:,} DynamoDB requests" if total else "-"],
        ["RSS bounded (pending ≤ cap; RSS growth over the after phase's second half ≤ 2 %)",
         f"{'met' if bounded else 'MISSED'}: {growth * 100:+.1f} % ({late[0]:.1f} -> {max(late):.1f} MB)"],
        ["messages lost: (highest stored - gap-free end) + checkpoint past the stored end + given up",
         f"{lost} = {r['missing_below_highest']} + {r['checkpoint_past_stored_end']} + {r['unwritten']} "
         f"({'met' if lost == 0 else 'MISSED'})"],
        ["gaps (streams with a stored seq missing below their highest)",
         f"{len(r['gaps'])} ({'met' if not r['gaps'] else 'MISSED'})"],
        ["released checkpoint = gap-free stored end", f"{r['checkpoint_is_stored_end']} of {r['connections']}"],
        ["frames sent by the upstream when the throttling ended: all stored",
         f"{r['drained_s'] + ph['after']['seconds']:.0f} s after it ended" if r["drained_s"] is not None
         else f"not within {ph['after']['seconds']:.0f} + 60 s ({r['not_yet_stored']:,} not yet)"],
        ["sockets reopened (worker's reconnects); two sockets at once",
         f"{r['sockets_reopened']} ({r['reconnects']}); {r['overlaps']}"],
        ["target (batched writer): RSS bounded, nothing lost, gaps 0", "met" if bounded and clean else "MISSED"],
    ]
    md = "\n".join([md_table(header, rows), "", md_table(["throttle row", "result"], verdict)])
    notes = [
        f"Throttle row: one worker (defaults; METRICS_SECONDS 1), {r['connections']} connections x "
        f"{r['rate_per_connection']:g} msg/s; the emulator answers {r['share']:.0%} of every DynamoDB request with "
        f"ThrottlingException (seed {r['seed']}) during the middle phase. RSS: the worker's resident set from /proc "
        f"every 0.5 s (its ru_maxrss peak, start-up included: {r['max_rss_mb_peak']:.0f} MB). After the after phase: "
        "SIGTERM (flush, release with the checkpoint) and every stream read back from seq 1. Lost: per stream, its highest stored "
        "seq less its gap-free stored end (0 unless a seq is missing), released checkpoints past the gap-free stored end (the next owner would resume "
        "beyond a hole) and frames the worker logged as given up (unwritten). Frames the upstream sent but the worker "
        "had not read (socket buffers, while its receive loops wait) are not lost: the next owner asks for them from "
        "the checkpoint.",
    ]
    if r["socket_errors"]:
        notes.append("Socket errors in the worker's log: " + "; ".join(f"{n} x {e}" for e, n in r["socket_errors"].items()))
    return md, notes
