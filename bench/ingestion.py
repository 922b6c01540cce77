"""Ingestion: messages per second one worker stores, and what each costs it.

For each level (connections x upstream rate x FLUSH_INTERVAL_MS) a fresh emulator,
upstream process and worker; after a warm-up, one window between two stats lines:

* offered (the upstream's production) against stored (the worker's MessagesStored):
  when stored falls behind, the backlog grows and something is the limit;
* DynamoDB requests per message, all operations included, and messages per batch;
* the worker's CPU per message and CPU share of one core, beside the emulator's and
  the upstream's (all read from /proc), which say where the limit is: moto handles one
  DynamoDB request at a time, so an emulator near one full core is the emulator's
  speed, not the worker's;
* frame received -> stored (p50 / p99 / max): from the time a frame is handed to the
  worker's writer to the time its batch is stored, from the writer's cumulative
  histogram in the two stats lines.

Issue 9's rows (one writer per worker) are judged against its targets at the default
``FLUSH_INTERVAL_MS``: DynamoDB requests per message (<= 0.1 at 100 x 2 msg/s, <= 0.05 at
1,000 x 0.5 msg/s), worker CPU per message (<= 0.5 ms at 100 x 2 msg/s) and received ->
stored p99 (<= flush + 100 ms while the table keeps up, every row at its own flush).

Last, a throttle row: 2,000 msg/s offered (20 x 100 msg/s) while the emulator throttles
half of all DynamoDB requests for 30 s. The worker's resident memory is sampled from
/proc before, during and after; its writer's pending frames and backpressure waits come
from its stats lines. Then SIGTERM (the worker flushes and releases each connection with
its checkpoint) and the messages table is read back (the faults benchmark's audit): a
frame is lost when a seq below a stream's highest stored one is missing (a gap), when
the released checkpoint is past the gap-free stored end (the next owner would resume
beyond a hole), or when the worker says it gave frames up (``unwritten`` in its log).
Frames the upstream sent that the worker had not read yet are not lost: the next owner
asks for them from the checkpoint. Beside it, how long the table took to hold every
frame the upstream had sent when the throttling ended (they wait in socket buffers while
the receive loops are held back, so this says how far behind the worker was).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from wsfleet import config as cfg
from wsfleet import schema
from sim.emulator import faults, set_faults
from sim.processes import eventually
from wsfleet.store import MessagesStore
from wsfleet.worker import writer as writer_mod

from . import before
from .common import (
    Result,
    Rig,
    Window,
    fmt,
    fmt_spread,
    latency_between,
    latency_cell,
    md_table,
    median_spread,
    proc_cpu_s,
    proc_rss_mb,
)
from .faults import stored_ends
from .kinds import AUTH_SUBSCRIBE, DEFAULT, DEFAULT_KIND, UpstreamKind


def worker_defaults() -> cfg.WorkerConfig:
    """The worker's configuration when nothing optional is set."""
    required = {cfg.TABLE_NAME: "-", cfg.SESSIONS_TABLE_NAME: "-", cfg.MESSAGES_TABLE_NAME: "-", cfg.MESSAGES_BUCKET_NAME: "-", cfg.QUEUE_URL: "-",
                cfg.AWS_REGION: "-"}
    return cfg.WorkerConfig.from_env(required)


DEFAULTS = worker_defaults()
FLUSH_MS = DEFAULTS.flush_interval_ms  # FLUSH_INTERVAL_MS's default (100)

# (connections, messages/s per connection, FLUSH_INTERVAL_MS). The first five were the
# table before issue 9; the last three are its rows (20 x 100/s is already in).
LEVELS = [(10, 5.0, 100), (10, 20.0, 100), (10, 100.0, 100), (20, 100.0, 100), (10, 20.0, 1000),
          (100, 2.0, FLUSH_MS), (1000, 0.5, FLUSH_MS), (1000, 0.05, FLUSH_MS)]
QUICK_LEVELS = [(2, 10.0, 100)]
# The same, with authenticated subscribe-style upstreams (issue 20): a secret header from
# Secrets Manager and the resume point only in the open message, beside the default row.
KIND_LEVELS = [(100, 2.0, FLUSH_MS)]
# The same row with TRACING=otel (issue 23): spans exported (to a file, OTLP JSON) at the
# default sampling, read beside the untraced row. Target: worker CPU ≤ 0.5 ms / message.
TRACING_LEVELS = [(100, 2.0, FLUSH_MS)]
TRACING_CPU_TARGET_MS = 0.5

# Issue 9's targets per row: (connections, rate) -> (DynamoDB requests / message, worker CPU ms / message).
TARGETS = {(100, 2.0): (0.1, 0.5), (1000, 0.5): (0.05, None)}
LATENCY_SLACK_MS = 100  # received -> stored p99 target: FLUSH_INTERVAL_MS + this, while the table keeps up
KEPT_UP = 0.95  # stored >= this share of offered


# The rows the request targets are judged on get a window one checkpoint cycle long
# (CHECKPOINT_SECONDS, 120 s, and a margin): it holds each connection's first checkpoint
# (asked for 108-120 s after its acquire, all acquires being done when the window opens)
# and no second one, so the checkpoint transactions in it are the steady rate's.
CYCLE_WINDOW_S = DEFAULTS.checkpoint_ms / 1000 + 10


def settings_for(quick: bool, kinds_only: bool = False, tracing_only: bool = False) -> dict[str, Any]:
    levels = QUICK_LEVELS if quick else LEVELS
    tracing_levels = QUICK_LEVELS if quick else TRACING_LEVELS
    only = KIND_LEVELS if kinds_only else TRACING_LEVELS if tracing_only else None
    if only is not None and not quick:
        levels = [lv for lv in levels if lv in only]
    return {
        # kinds_only: the default rows the kind rows are read beside, and those;
        # tracing_only: the default rows the traced rows are read beside, and those.
        "levels": levels,
        "kinds_only": kinds_only,
        "tracing_only": tracing_only,
        "kind_levels": [] if tracing_only else QUICK_LEVELS if quick else KIND_LEVELS,
        "tracing_levels": [] if kinds_only else tracing_levels,
        "warmup_s": 0.5 if quick else 5,
        "window_s": 2 if quick else 30,
        "cycle_window_s": 2 if quick else CYCLE_WINDOW_S,
        # The worker's defaults (lease 10 s, heartbeat 2.5 s, reconcile 10 s, checkpoint
        # 120 s), stats every 5 s for the sub-windows.
        "worker": {cfg.METRICS_SECONDS: 0.5 if quick else 5},
        "throttle": {
            "connections": 2 if quick else 20,
            "rate_per_connection": 10.0 if quick else 100.0,
            "share": 0.5,
            "before_s": 1.0 if quick else 15.0,
            "during_s": 1.0 if quick else 30.0,
            "after_s": 1.0 if quick else 30.0,
            "drain_timeout_s": 30.0 if quick else 60.0,
            "sample_every_s": 0.25 if quick else 0.5,
            "worker": {cfg.METRICS_SECONDS: 0.5 if quick else 1},
            "seed": random.SystemRandom().getrandbits(32),
        },
    }


def connect(rig: Rig, upstream: Any, ids: list[str], kind: UpstreamKind = DEFAULT) -> float:
    """START every connection with its hint; returns the seconds until every socket is open."""
    began = time.monotonic()
    rig.start_connections(ids, upstream, hint=True, kind=kind)
    eventually(lambda: upstream.open_sockets() == len(ids), max(60, len(ids) * 0.3), f"{len(ids)} sockets open",
               interval=0.5)
    return time.monotonic() - began


def run_level(run_dir: Path, n: int, rate: float, flush_ms: int, s: dict[str, Any], kind_name: str = DEFAULT_KIND,
              sink: str = schema.SINK_DYNAMODB, traced: bool = False) -> dict[str, Any]:
    """One row; ``traced``: the worker runs with TRACING=otel, its spans in a file."""
    with Rig(run_dir, sink=sink) as rig:
        kind = UpstreamKind.auth_subscribe(rig.emulator.endpoint_url) if kind_name == AUTH_SUBSCRIBE else DEFAULT
        upstream = rig.upstream(rate, credentials=kind.credentials)
        spans_file = run_dir / "traces-w1.jsonl"
        tracing_env = {cfg.TRACING: "otel", cfg.TRACING_FILE: str(spans_file.resolve())} if traced else {}
        worker = rig.worker("w1", {**s["worker"], cfg.FLUSH_INTERVAL_MS: flush_ms,
                                   cfg.MAX_CONNECTIONS: max(DEFAULTS.max_connections, n), **tracing_env})
        ids = [f"ing{i:03d}" for i in range(n)]
        connect_s = connect(rig, upstream, ids, kind)
        time.sleep(s["warmup_s"])
        a = worker.next_stats()
        up_a, cpu_a = upstream.stats(), {p: proc_cpu_s(p) for p in (rig.emulator_pid, upstream.proc.pid)}
        t_a = time.time()
        cycle = (n, rate) in TARGETS and flush_ms == FLUSH_MS
        time.sleep(s["cycle_window_s"] if cycle else s["window_s"])
        b = worker.next_stats()
        up_b, cpu_b = upstream.stats(), {p: proc_cpu_s(p) for p in (rig.emulator_pid, upstream.proc.pid)}
        t_b = time.time()
        win = Window.between(a, b)
        lines = worker.stats_between(a, b)
        parts = Window.series(lines)
        produced = lambda st: sum(x["produced"] for x in st["streams"].values())  # noqa: E731
        emu, up = (cpu_b[p] - cpu_a[p] for p in (rig.emulator_pid, upstream.proc.pid))
    stored = win.counters["MessagesStored"]
    batches = win.ddb("BatchWriteItem")
    # Checkpoints: one per connection every CHECKPOINT_SECONDS while frames arrive, up to
    # 25 in a transaction. A cycle-long window (the target rows) holds one round of them;
    # its requests per message are the steady figure, normalised to exactly one
    # checkpoint per connection per cycle with the transactions' measured fill.
    written = b.checkpoints.get("written", 0) - a.checkpoints.get("written", 0)
    transactions = win.ddb("TransactWriteItems")
    # With SINK=kinesis the frames go in PutRecords: every AWS request counts, DynamoDB's
    # (holding, checkpoints) and the stream's.
    requests = win.ddb_total + win.kinesis_total
    puts = win.requests.get("kinesis.PutRecords", 0)
    steady = steady_ddb = None
    if cycle and written and stored:
        per_cycle = n * win.seconds / (DEFAULTS.checkpoint_ms / 1000)
        checkpoints = per_cycle * transactions / written - transactions
        steady = (requests + checkpoints) / stored
        steady_ddb = (win.ddb_total + checkpoints) / stored
    return {
        "kind": kind_name,
        "sink": sink,
        "tracing": "otel" if traced else "off",
        "spans_exported": _spans_in(spans_file) if traced else None,
        "requests_per_message": requests / stored if stored else None,
        "requests_per_message_steady": steady,
        "records_per_put": stored / puts if puts else None,
        "connect_s": connect_s,
        "latency_ms": latency_between(a, b),
        "latency_sub_windows": [latency_between(x, y) for x, y in zip(lines, lines[1:], strict=False)],
        "cycle_window": cycle,
        "checkpoints_in_window": written,
        "checkpoint_transactions_in_window": transactions,
        "ddb_requests_per_message_steady": steady_ddb,
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


def _spans_in(path: Path) -> int:
    """Spans in an OTLP JSON lines file (what the traced worker exported, whole run)."""
    if not path.exists():
        return 0
    text = path.read_text(errors="replace")
    return text.count('"spanId"')


def tracing_lines(levels: list[dict[str, Any]]) -> list[str]:
    """Each traced row against the untraced row of the same level: CPU per message, and
    the target."""
    out = []
    for traced in (lv for lv in levels if lv.get("tracing") == "otel"):
        key = (traced["connections"], traced["rate_per_connection"], traced["flush_interval_ms"])
        plain = next((lv for lv in levels if lv.get("tracing", "off") == "off" and lv.get("kind", DEFAULT_KIND) == DEFAULT_KIND
                      and (lv["connections"], lv["rate_per_connection"], lv["flush_interval_ms"]) == key), None)
        on = traced["worker_cpu_ms_per_message_spread"]["median"]
        off = plain["worker_cpu_ms_per_message_spread"]["median"] if plain else None
        verdict = "met" if on is not None and on <= TRACING_CPU_TARGET_MS else "MISSED"
        out.append(
            f"CPU per message with TRACING=otel ({key[0]} x {key[1]:g}/s, default sampling, {traced['spans_exported']} spans "
            f"exported in the run): {fmt(on, 3)} ms, untraced {fmt(off, 3)} ms"
            + (f" ({on - off:+.3f} ms)" if on is not None and off is not None else "")
            + f"; target ≤ {TRACING_CPU_TARGET_MS:g} ms: {verdict}."
        )
    return out


# --- the throttle row ----------------------------------------------------------------------------


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
        ["target (issue 9): RSS bounded, nothing lost, gaps 0", "met" if bounded and clean else "MISSED"],
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


def kept_up(level: dict[str, Any]) -> bool:
    return level["stored_per_s"] >= KEPT_UP * level["offered_per_s"]


def limit_of(level: dict[str, Any]) -> str:
    if kept_up(level):
        return "kept up"
    if level["emulator_cpu_share"] >= 0.8:
        return f"emulator ({level['emulator_cpu_share'] * 100:.0f} % CPU)"
    if level["worker_cpu_share"] >= 0.8:
        return "worker CPU"
    return "neither saturated: machine (2 cores shared)"


def verdicts(lv: dict[str, Any]) -> list[str]:
    """The issue's targets for one row: met or MISSED each."""
    out = []
    req_max, cpu_max = TARGETS.get((lv["connections"], lv["rate_per_connection"]), (None, None))
    if req_max is not None and lv["flush_interval_ms"] == FLUSH_MS:
        got = lv["ddb_requests_per_message_steady"]
        out.append(f"req / msg ≤ {req_max:g}: {'met' if got is not None and got <= req_max else 'MISSED'}")
    if cpu_max is not None and lv["flush_interval_ms"] == FLUSH_MS:
        got = lv["worker_cpu_ms_per_message_spread"]["median"]
        out.append(f"CPU ≤ {cpu_max:g} ms: {'met' if got is not None and got <= cpu_max else 'MISSED'}")
    bound = lv["flush_interval_ms"] + LATENCY_SLACK_MS
    p99 = lv["latency_ms"]["p99"]
    if not kept_up(lv):
        out.append(f"p99 ≤ {bound} ms: does not apply (table behind)")
    else:
        out.append(f"p99 ≤ {bound} ms: {'met' if p99 is not None and p99 <= bound else 'MISSED'}")
    return out


def run(*, quick: bool, run_dir: Path, command: str, kinds_only: bool = False, tracing_only: bool = False) -> Result:
    s = settings_for(quick, kinds_only, tracing_only)
    levels = []
    for i, (n, rate, flush_ms) in enumerate(s["levels"]):
        print(f"    {n} x {rate:g}/s, flush {flush_ms} ms", flush=True)
        levels.append(run_level(run_dir / f"ingestion-{i}", n, rate, flush_ms, s))
    for i, (n, rate, flush_ms) in enumerate(s["kind_levels"]):
        print(f"    {n} x {rate:g}/s, flush {flush_ms} ms, authenticated + subscribe", flush=True)
        levels.append(run_level(run_dir / f"ingestion-kind-{i}", n, rate, flush_ms, s, AUTH_SUBSCRIBE))
    for i, (n, rate, flush_ms) in enumerate(s["tracing_levels"]):
        print(f"    {n} x {rate:g}/s, flush {flush_ms} ms, TRACING=otel", flush=True)
        levels.append(run_level(run_dir / f"ingestion-traced-{i}", n, rate, flush_ms, s, traced=True))
    throttled = None
    if not kinds_only and not tracing_only:
        print(f"    throttle {s['throttle']['share']:.0%} at {s['throttle']['connections']} x "
              f"{s['throttle']['rate_per_connection']:g}/s", flush=True)
        throttled = run_throttle(run_dir / "ingestion-throttle", s["throttle"])
    rows = [
        [
            f"{lv['connections']} x {lv['rate_per_connection']:g}/s, flush {lv['flush_interval_ms']} ms"
            + (", **authenticated + subscribe**" if lv.get("kind", DEFAULT_KIND) != DEFAULT_KIND else "")
            + (", **TRACING=otel**" if lv.get("tracing") == "otel" else ""),
            fmt(lv["offered_per_s"], 0),
            fmt_spread(lv["stored_per_s_spread"], 0),
            fmt(lv["messages_per_batch"], 1),
            f"{fmt(lv['ddb_requests_per_message'], 3)}"
            + (f" ({fmt(lv['ddb_requests_per_message_steady'], 3)})" if lv["cycle_window"] else ""),
            fmt_spread(lv["worker_cpu_ms_per_message_spread"], 2),
            latency_cell(lv["latency_ms"]) + " (" + fmt_spread(median_spread(
                x["p99"] for x in lv["latency_sub_windows"] if x["n"]), 0) + ")",
            f"{lv['worker_cpu_share'] * 100:.0f} %",
            f"{lv['emulator_cpu_share'] * 100:.0f} %",
            f"{lv['upstream_cpu_share'] * 100:.0f} %",
            f"{fmt(lv['lag_p99_ms'], 1)} / {fmt(lv['lag_max_ms'], 1)}",
            limit_of(lv),
            "; ".join(verdicts(lv)),
            before.INGESTION.get((lv["connections"], lv["rate_per_connection"], lv["flush_interval_ms"]), "-")
            if lv.get("kind", DEFAULT_KIND) == DEFAULT_KIND and lv.get("tracing", "off") == "off" else "-",
        ]
        for lv in levels
    ]
    header = ["connections x rate, flush", "offered msg/s", "stored msg/s", "msgs / batch",
              "DynamoDB req / msg (steady, one checkpoint cycle)", "worker CPU ms / msg",
              "received -> stored p50 / p99 / max ms (p99 per stats interval)",
              "worker CPU", "emulator CPU", "upstream CPU", "loop lag p99 / max ms", "limit", "target (issue 9)",
              before.LABEL + ": stored msg/s, req / msg, CPU ms / msg"]
    notes = [
        f"One worker at the default timings (LEASE 10 s, HEARTBEAT 2.5 s, RECONCILE 10 s, CHECKPOINT_SECONDS 120; before: "
        "LEASE 20 s, HEARTBEAT 5 s), a fresh emulator and upstream process per row; "
        f"{s['window_s']} s window after {s['warmup_s']} s warm-up ({s['cycle_window_s']:g} s for the rows with a "
        "request target); stored msg/s and CPU per message are the median "
        f"(min-max) over the window's {s['worker'][cfg.METRICS_SECONDS]} s stats intervals, the rest are whole-window "
        "figures. DynamoDB req / msg counts every DynamoDB request in the window (batches, session renewals, watch, "
        "free scan, audit, UnownedConnections counts, checkpoints) over the messages stored.",
        "CPU shares are of one core; the machine has 2, shared by the worker, the emulator and the upstream. "
        "A row is emulator-bound when the emulator (one request at a time) is near a full core: the stored rate is "
        "then moto's speed, and the worker's own cost is its CPU per message.",
        "Received -> stored: from a frame's hand-over to the worker's writer to the moment its batch was stored, "
        "for every frame stored in the window (the writer's cumulative histogram, buckets 9 % wide: p50 and p99 "
        "interpolated in their bucket, max its bucket's upper bound). Target: p99 ≤ FLUSH_INTERVAL_MS + "
        f"{LATENCY_SLACK_MS} ms while the table keeps up (stored ≥ {KEPT_UP:.0%} of offered), judged on the "
        "whole window's p99; in brackets the p99 of each stats interval, median (min-max).",
        "DynamoDB req / msg in brackets (the rows with a request target): their window is one checkpoint cycle "
        f"(CHECKPOINT_SECONDS, {DEFAULTS.checkpoint_ms / 1000:g} s, and 10 s), so it holds each connection's first "
        "checkpoint, asked for 108-120 s after its acquire and written up to 25 in one TransactWriteItems; the figure "
        "counts the window's requests with its checkpoint transactions scaled to exactly one checkpoint per connection "
        "per cycle at the fill they had. The issue's request targets are judged on it. The other rows' windows are "
        "too short to hold any checkpoint.",
        "Authenticated + subscribe (issue 20): every connection's START names a Secrets Manager secret in "
        "secret_headers (the upstream refuses a handshake without it) and resumes only through its open message, a "
        "subscribe the upstream waits for before it sends anything; STARTed through the event router, which validates "
        "and stores the upstream object. Its row is the 100 x 2/s one again, to be read beside it.",
        "Connect (START with hint -> every socket open): "
        + ", ".join(f"{lv['connections']} x {lv['rate_per_connection']:g}/s {lv['connect_s']:.0f} s" for lv in levels)
        + "; checkpoints written in the window (transactions): "
        + ", ".join(f"{lv['connections']} x {lv['rate_per_connection']:g}/s {lv['checkpoints_in_window']} "
                    f"({lv['checkpoint_transactions_in_window']})" for lv in levels) + ".",
    ]
    notes += [
        *tracing_lines(levels),
        "TRACING=otel (issue 23): the same row with the worker tracing through OpenTelemetry at the default sampler "
        "(parent-based, always on), its spans exported as OTLP JSON to a file (TRACING_FILE) by the batch processor; "
        "every other row runs with TRACING=off. Spans are per unit of work (acquire, connect, release, a takeover), "
        "never per frame: per message, tracing costs the trace-id lookups of log lines and AWS calls.",
    ] if s["tracing_levels"] else []
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    throttle_md, throttle_notes = throttle_table(throttled) if throttled is not None else ("", [])
    markdown = "\n".join([md_table(header, rows), "", *[f"- {n}" for n in notes], "", throttle_md])
    return Result("Ingestion", command, s, markdown, {"settings": s, "levels": levels, "throttle": throttled},
                  throttle_notes)
