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
from pathlib import Path
from typing import Any

from wsfleet import settings_spec
from wsfleet import schema

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
)
from .ingestion_throttle import run_throttle, throttle_table
from .stream_bill import delivery_bill, stream_bill
from .kinds import AUTH_SUBSCRIBE, DEFAULT, DEFAULT_KIND, UpstreamKind
from .worker_load import DEFAULTS, FLUSH_MS, connect


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
        "worker": {settings_spec.METRICS_SECONDS: 0.5 if quick else 5},
        "throttle": {
            "connections": 2 if quick else 20,
            "rate_per_connection": 10.0 if quick else 100.0,
            "share": 0.5,
            "before_s": 1.0 if quick else 15.0,
            "during_s": 1.0 if quick else 30.0,
            "after_s": 1.0 if quick else 30.0,
            "drain_timeout_s": 30.0 if quick else 60.0,
            "sample_every_s": 0.25 if quick else 0.5,
            "worker": {settings_spec.METRICS_SECONDS: 0.5 if quick else 1},
            "seed": random.SystemRandom().getrandbits(32),
        },
    }


def run_level(run_dir: Path, n: int, rate: float, flush_ms: int, s: dict[str, Any], kind_name: str = DEFAULT_KIND,
              sink: str = schema.SINK_DYNAMODB, traced: bool = False) -> dict[str, Any]:
    """One row; ``traced``: the worker runs with TRACING=otel, its spans in a file."""
    with Rig(run_dir, sink=sink) as rig:
        kind = UpstreamKind.auth_subscribe(rig.emulator.endpoint_url) if kind_name == AUTH_SUBSCRIBE else DEFAULT
        upstream = rig.upstream(rate, credentials=kind.credentials)
        spans_file = run_dir / "traces-w1.jsonl"
        tracing_env = {settings_spec.TRACING: "otel", settings_spec.TRACING_FILE: str(spans_file.resolve())} if traced else {}
        worker = rig.worker("w1", {**s["worker"], settings_spec.FLUSH_INTERVAL_MS: flush_ms,
                                   settings_spec.MAX_CONNECTIONS: max(DEFAULTS.max_connections, n), **tracing_env})
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
        # The whole run's stream, warm-up included: the packing does not depend on the window.
        bill = stream_bill(rig.kinesis, rig.aws_env["MESSAGES_STREAM_NAME"]) if schema.SINK_KINESIS in sink else None
        if schema.SINK_FIREHOSE in sink:  # the delivery stream's objects (a row has one stream sink or the other)
            bill = delivery_bill(rig.firehose, rig.s3, rig.aws_env[settings_spec.MESSAGES_DELIVERY_STREAM_NAME])
    stored = win.counters["MessagesStored"]
    batches = win.ddb("BatchWriteItem")
    # Checkpoints: one per connection every CHECKPOINT_SECONDS while frames arrive, up to
    # 25 in a transaction. A cycle-long window (the target rows) holds one round of them;
    # its requests per message are the steady figure, normalised to exactly one
    # checkpoint per connection per cycle with the transactions' measured fill.
    written = b.checkpoints.get("written", 0) - a.checkpoints.get("written", 0)
    transactions = win.ddb("TransactWriteItems")
    # With SINK=kinesis the frames go in PutRecords (firehose: PutRecordBatch): every AWS
    # request counts, DynamoDB's (holding, checkpoints) and the stream's.
    requests = win.ddb_total + win.kinesis_total + win.firehose_total
    puts = win.requests.get("kinesis.PutRecords", 0) + win.requests.get("firehose.PutRecordBatch", 0)
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
        "stream": bill,
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
              "worker CPU", "emulator CPU", "upstream CPU", "loop lag p99 / max ms", "limit", "target (batched writer)",
              before.LABEL + ": stored msg/s, req / msg, CPU ms / msg"]
    notes = [
        f"One worker at the default timings (LEASE 10 s, HEARTBEAT 2.5 s, RECONCILE 10 s, CHECKPOINT_SECONDS 120; before: "
        "LEASE 20 s, HEARTBEAT 5 s), a fresh emulator and upstream process per row; "
        f"{s['window_s']} s window after {s['warmup_s']} s warm-up ({s['cycle_window_s']:g} s for the rows with a "
        "request target); stored msg/s and CPU per message are the median "
        f"(min-max) over the window's {s['worker'][settings_spec.METRICS_SECONDS]} s stats intervals, the rest are whole-window "
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
        "Authenticated + subscribe: every connection's START names a Secrets Manager secret in "
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
        "TRACING=otel: the same row with the worker tracing through OpenTelemetry at the default sampler "
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
