"""Sinks (issue 21): the messages table against the Kinesis stream and the Firehose
delivery stream, measured in one run.

``python -m bench sinks``: the ingestion benchmark's headline rows (100 x 2 msg/s and
1,000 x 0.5 msg/s, default FLUSH_INTERVAL_MS, a window one checkpoint cycle long) once
with each of ``SINK=dynamodb``, ``kinesis`` and ``firehose``, rotating which goes first
per row, so that their ratio is fair on a shared machine; the second row again with the
stream alone at FLUSH_INTERVAL_MS 5,000 (not with ``--quick``); then a crash row:

* **requests per message**: every AWS request the worker sent in the window (DynamoDB's
  holding and checkpoint requests, and the stream's PutRecords) over the frames stored,
  checkpoints normalised to one per connection per cycle (as ingestion does). Target
  with kinesis: <= 0.05 at 1,000 x 0.5 msg/s;
* **worker CPU per message**: target <= 0.5 ms with kinesis;
* **the stream's bill per message** (kinesis): Kinesis records, bytes and KB billed per
  frame, read back from the stream after the row (the whole run): a connection's frames
  of one flush share one aggregated record; (firehose) Firehose records, bytes and KB
  billed (each record rounded up to 5 KB) per frame, read back from the delivery
  stream's objects (``bench.stream_bill.delivery_bill``);
* **crash** (kinesis only): one worker holds the connections; after each has had its
  first checkpoint, at a random moment, ``kill -9``; a second worker starts and takes
  them over when the session expires. Then a graceful stop, and the stream is read back
  whole: per connection, the duplicates (a seq delivered more than once), split into the
  takeover's (a higher fence: only seqs after the dead owner's last checkpoint, as the
  table holds it once it is dead) and resends (the same fence, after a partial failure);
  the takeover's against the bound: frames in CHECKPOINT_SECONDS plus the takeover time;
  and the stream rules (last deliveries in seq order, every seq delivered, no lower fence
  after a higher one). The crash row runs CHECKPOINT_SECONDS 30 to stay short: the bound
  and the duplicates both scale with it. Before the kill, for ``fault_s``, the emulator
  refuses a share of PutRecords' records one by one (a partial failure), makes a share
  of PutRecords ambiguous (applied, answer lost) and throttles a share whole: the
  resends they cause are the same-fence duplicates, and the stream rules must hold
  through them too.
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from wsfleet import settings_spec
from wsfleet import records, schema
from sim import stream_audit
from sim.emulator import faults, set_faults
from sim.processes import eventually

from .common import Result, Rig, fmt, fmt_spread, latency_cell, md_table
from .ingestion import run_level, settings_for
from .worker_load import FLUSH_MS, connect

ROWS = [(100, 2.0), (1000, 0.5)]
QUICK_ROWS = [(2, 10.0)]
# The stream alone at a longer flush interval: more of a connection's frames in each record.
FLUSH_ROWS = [(1000, 0.5, 5000)]
SINKS = (schema.SINK_DYNAMODB, schema.SINK_KINESIS, schema.SINK_FIREHOSE)
STREAMS = (schema.SINK_KINESIS, schema.SINK_FIREHOSE)  # sinks billed per record, batched 500 frames a call
# Issue 21's targets with kinesis: (connections, rate) -> (requests / message, CPU ms / message).
TARGETS = {(1000, 0.5): (0.05, 0.5), (100, 2.0): (None, 0.5)}


def crash_settings(quick: bool) -> dict[str, Any]:
    checkpoint_s = 2.0 if quick else 30.0
    return {
        "connections": 4 if quick else 100,
        "rate": 5.0 if quick else 2.0,
        "checkpoint_s": checkpoint_s,
        # Long enough for every connection's first checkpoint (asked 90-100 % of the way).
        "hold_s": checkpoint_s + (1.0 if quick else 5.0),
        "after_s": 2.0 if quick else 10.0,  # w2 delivering live frames before its stop
        # Stream faults while the first owner holds (off before the kill).
        "fault_s": 1.0 if quick else 20.0,
        "refuse_records": 0.1,
        "ambiguous": 0.05,
        "throttle": 0.05,
        "worker": {
            settings_spec.CHECKPOINT_SECONDS: checkpoint_s,
            settings_spec.METRICS_SECONDS: 0.5 if quick else 5,
            **({settings_spec.LEASE_SECONDS: 3, settings_spec.HEARTBEAT_SECONDS: 0.75} if quick else {}),
        },
        "seed": random.SystemRandom().getrandbits(32),
    }


def read_stream(rig: Rig) -> dict[str, list[records.Record]]:
    """Every record on the rig's messages stream, decoded, per connection in stream order
    (one connection's records are on one shard)."""
    out: dict[str, list[records.Record]] = defaultdict(list)
    for d in stream_audit.read_stream(rig.kinesis, rig.aws_env["MESSAGES_STREAM_NAME"]):
        if d.record is None:
            raise records.BadRecord(d.error)
        out[d.record.connection_id].append(d.record)
    return dict(out)


def audit(recs: list[records.Record], checkpoint: int) -> dict[str, Any]:
    """One connection's deliveries: duplicates by kind, and the stream rules broken."""
    fences: dict[int, list[int]] = defaultdict(list)
    for r in recs:
        for seq in range(r.seq, r.end + 1):
            fences[seq].append(r.fence_token)
    last = {r.seq: i for i, r in enumerate(recs)}
    last_seqs = [r.seq for i, r in enumerate(recs) if last[r.seq] == i]
    takeover = [seq for seq, f in fences.items() if len(set(f)) > 1]
    resent = sum(len(f) - len(set(f)) for f in fences.values())
    lower_after_higher = sum(1 for f in fences.values() if any(b < a for a, b in zip(f, f[1:], strict=False)))
    seqs = sorted(fences)
    return {
        "records": len(recs),
        "first": seqs[0] if seqs else None,
        "last": seqs[-1] if seqs else None,
        "missing": (seqs[-1] - seqs[0] + 1 - len(seqs)) if seqs else 0,
        "out_of_order": sum(1 for a, b in zip(last_seqs, last_seqs[1:], strict=False) if b < a),
        "lower_fence_after_higher": lower_after_higher,
        "takeover_duplicates": len(takeover),
        "takeover_at_or_below_checkpoint": sum(1 for seq in takeover if seq <= checkpoint),
        "resent_duplicates": resent,
        "checkpoint": checkpoint,
    }


def run_crash(run_dir: Path, c: dict[str, Any]) -> dict[str, Any]:
    n, rate = c["connections"], c["rate"]
    rng = random.Random(c["seed"])
    with Rig(run_dir, sink=schema.SINK_KINESIS) as rig:
        upstream = rig.upstream(rate)
        w1 = rig.worker("w1", c["worker"])
        ids = [f"crash{i:03d}" for i in range(n)]
        connect(rig, upstream, ids)
        url = rig.emulator.endpoint_url
        set_faults(url, refuse_records=c["refuse_records"], ambiguous={"PutRecords": c["ambiguous"]},
                   throttle={"PutRecords": c["throttle"]}, seed=c["seed"])
        time.sleep(c["fault_s"])
        counted = faults(url)
        set_faults(url)
        # Every connection checkpointed once, then a kill at a random point of the cycle.
        time.sleep(max(0.0, c["hold_s"] - c["fault_s"]) + rng.uniform(0, c["checkpoint_s"]))
        last = w1.stats()[-1]
        os.kill(w1.pid, signal.SIGKILL)
        killed = time.monotonic()
        eventually(lambda: not w1.proc.alive(), 30, "w1 to die")
        # Dead: its checkpoints cannot move any more, and no one else owns them yet.
        checkpoints = {cid: int((rig.connections.get(cid) or {}).get(schema.LAST_SEQ) or 0) for cid in ids}
        opened = {cid: st["sockets_opened"] for cid, st in upstream.stats()["streams"].items()}
        w2 = rig.worker("w2", c["worker"])

        def taken() -> bool:
            streams = upstream.stats()["streams"]
            return all(streams[cid]["sockets_opened"] > opened.get(cid, 0) and streams[cid]["open_sockets"] == 1
                       for cid in ids)

        eventually(taken, 120, "w2 to reopen every socket", interval=0.2)
        takeover_s = time.monotonic() - killed
        start = w2.next_stats()
        eventually(lambda: w2.next_stats().counters["MessagesStored"] - start.counters["MessagesStored"]
                   >= n * rate * c["after_s"], 120, "w2 storing live frames")
        w2.stop(grace_s=45)
        by_conn = read_stream(rig)
    audits = {cid: audit(by_conn.get(cid, []), checkpoints[cid]) for cid in ids}
    bound = math.ceil(rate * (c["checkpoint_s"] + takeover_s))
    dup = [a["takeover_duplicates"] for a in audits.values()]
    return {
        "connections": n,
        "rate": rate,
        "checkpoint_s": c["checkpoint_s"],
        "fault_s": c["fault_s"],
        "seed": c["seed"],
        "takeover_s": takeover_s,
        "bound_per_connection": bound,
        "takeover_duplicates": sum(dup),
        "takeover_duplicates_max": max(dup, default=0),
        "over_bound": sum(1 for d in dup if d > bound),
        "takeover_at_or_below_checkpoint": sum(a["takeover_at_or_below_checkpoint"] for a in audits.values()),
        "resent_duplicates": sum(a["resent_duplicates"] for a in audits.values()),
        "faults": {k: (counted.get(k) or {}).get("PutRecords", 0) for k in ("passed", "ambiguous", "throttled", "records_refused")},
        "records_resent": last.counters.get("RecordsResent", 0),
        "records_throttled": last.counters.get("RecordsThrottled", 0),
        "records": sum(a["records"] for a in audits.values()),
        "missing": sum(a["missing"] for a in audits.values()),
        "out_of_order": sum(a["out_of_order"] for a in audits.values()),
        "lower_fence_after_higher": sum(a["lower_fence_after_higher"] for a in audits.values()),
        "without_records": sum(1 for a in audits.values() if not a["records"]),
        "audits": audits,
    }


def crash_table(r: dict[str, Any]) -> str:
    f = r["faults"]
    violations = (r["over_bound"] + r["takeover_at_or_below_checkpoint"] + r["missing"] + r["out_of_order"]
                  + r["lower_fence_after_higher"] + r["without_records"])
    rows = [
        ["kill -9 -> every socket reopened by the new owner", f"{r['takeover_s']:.1f} s"],
        ["records on the stream", f"{r['records']:,}"],
        ["duplicates of the takeover (higher fence): total; most on one connection",
         f"{r['takeover_duplicates']:,}; {r['takeover_duplicates_max']}"],
        [f"bound per connection: {r['rate']:g} msg/s x (CHECKPOINT_SECONDS {r['checkpoint_s']:g} + takeover "
         f"{r['takeover_s']:.1f} s)", f"{r['bound_per_connection']} ({r['over_bound']} connections over it)"],
        ["takeover duplicates at or below the dead owner's last checkpoint", str(r["takeover_at_or_below_checkpoint"])],
        [f"stream faults for the first {r['fault_s']:g} s: PutRecords passed / ambiguous / throttled whole; records refused",
         f"{f['passed']:,} / {f['ambiguous']} / {f['throttled']}; {f['records_refused']:,}"],
        ["the first owner's RecordsResent; RecordsThrottled (its last stats line before the kill)",
         f"{r['records_resent']:,}; {r['records_throttled']:,}"],
        ["resent duplicates on the stream (same fence)", str(r["resent_duplicates"])],
        ["seqs never delivered; last deliveries out of order; lower fence after higher",
         f"{r['missing']}; {r['out_of_order']}; {r['lower_fence_after_higher']}"],
        ["target (Kinesis sink): duplicates within the bound, only past the checkpoint, stream rules kept",
         "met" if violations == 0 else f"MISSED ({violations})"],
    ]
    return md_table([f"crash, SINK=kinesis: {r['connections']} x {r['rate']:g} msg/s, seed {r['seed']}", "result"], rows)


def stream_cell(bill: dict[str, Any] | None) -> str:
    if not bill or not bill["frames"]:
        return "-"
    n = bill.get("kinesis_records", bill.get("firehose_records"))
    gzipped = f"; GZIP'd {bill['gzip_ratio']:.1f} times smaller" if bill.get("gzip_ratio") else ""
    return (f"{bill['records_per_message']:.3f} / {bill['bytes_per_message']:,.0f} / {bill['billed_kb_per_message']:.3f} "
            f"({n:,} for {bill['frames']:,} frames{gzipped})")


def verdict(lv: dict[str, Any]) -> str:
    if lv["sink"] != schema.SINK_KINESIS:  # issue 21's targets are the stream's
        return "-"
    req_max, cpu_max = TARGETS.get((lv["connections"], lv["rate_per_connection"]), (None, None))
    out = []
    if req_max is not None:
        got = lv["requests_per_message_steady"]
        out.append(f"req / msg ≤ {req_max:g}: {'met' if got is not None and got <= req_max else 'MISSED'}")
    if cpu_max is not None:
        got = lv["worker_cpu_ms_per_message_spread"]["median"]
        out.append(f"CPU ≤ {cpu_max:g} ms: {'met' if got is not None and got <= cpu_max else 'MISSED'}")
    return "; ".join(out) or "-"


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    rows = QUICK_ROWS if quick else ROWS
    levels = []
    for i, (n, rate) in enumerate(rows):
        # --quick (the suite's smoke run) only the stream: the table's row is the
        # ingestion benchmark's, which the suite runs too.
        order = (schema.SINK_KINESIS,) if quick else SINKS[i % 3 :] + SINKS[: i % 3]
        for sink in order:
            print(f"    {n} x {rate:g}/s, SINK={sink}", flush=True)
            levels.append(run_level(run_dir / f"sinks-{i}-{sink}", n, rate, FLUSH_MS, s, sink=sink))
    for n, rate, flush_ms in [] if quick else FLUSH_ROWS:
        print(f"    {n} x {rate:g}/s, SINK=kinesis, FLUSH_INTERVAL_MS {flush_ms}", flush=True)
        levels.append(run_level(run_dir / f"sinks-flush-{flush_ms}", n, rate, flush_ms, s, sink=schema.SINK_KINESIS))
    crash = crash_settings(quick)
    print(f"    crash, SINK=kinesis, {crash['connections']} x {crash['rate']:g}/s", flush=True)
    crashed = run_crash(run_dir / "sinks-crash", crash)
    table_rows = []
    for lv in sorted(levels, key=lambda x: (x["connections"], x["sink"], x["flush_interval_ms"])):
        flush = "" if lv["flush_interval_ms"] == FLUSH_MS else f", FLUSH_INTERVAL_MS {lv['flush_interval_ms']}"
        table_rows.append([
            f"{lv['connections']} x {lv['rate_per_connection']:g}/s{flush}", lv["sink"],
            fmt(lv["offered_per_s"], 0), fmt_spread(lv["stored_per_s_spread"], 0),
            f"{fmt(lv['requests_per_message'], 3)}"
            + (f" ({fmt(lv['requests_per_message_steady'], 3)})" if lv["cycle_window"] else ""),
            fmt(lv["records_per_put"], 1) if lv["sink"] in STREAMS else fmt(lv["messages_per_batch"], 1),
            stream_cell(lv.get("stream")),
            fmt_spread(lv["worker_cpu_ms_per_message_spread"], 3),
            latency_cell(lv["latency_ms"]),
            f"{lv['worker_cpu_share'] * 100:.0f} %", f"{lv['emulator_cpu_share'] * 100:.0f} %",
            verdict(lv),
        ])
    header = ["connections x rate", "SINK", "offered msg/s", "stored msg/s", "AWS req / msg (steady, one checkpoint cycle)",
              "frames per write request", "stream records / bytes / KB billed per msg", "worker CPU ms / msg",
              "received -> stored p50 / p99 / max ms", "worker CPU", "emulator CPU", "target (Kinesis sink)"]
    notes = [
        "One worker at the default timings (FLUSH_INTERVAL_MS 100 unless the row says, CHECKPOINT_SECONDS 120), a "
        "fresh emulator and "
        f"upstream per row, {s['cycle_window_s']:g} s window after {s['warmup_s']:g} s warm-up; the sinks of a row "
        "run one after the other (the first row's dynamodb first, the second's kinesis first). AWS req / msg: every "
        "DynamoDB, Kinesis and Firehose request in the window over the frames stored; in brackets with the checkpoint "
        "transactions scaled to one checkpoint per connection per cycle (as the Ingestion table). Frames per write "
        "request: per BatchWriteItem (dynamodb, at most 25), per PutRecords (kinesis) or PutRecordBatch (firehose), "
        "at most 500. Stream records per msg: kinesis, the stream read back after the row, each Kinesis record (an "
        "aggregate of a connection's frames of one flush, or one frame alone) rounded up to a KB for KB billed; "
        "firehose, the delivery stream's objects read back, each Firehose record (a call's lines, up to 1,000 KiB) "
        "rounded up to 5 KB, and how many times smaller GZIP makes every line delivered (the plan's --gzip-ratio). "
        "CPU: median "
        "(min-max) over the window's stats intervals.",
        "The emulator is moto in one process: its Kinesis and DynamoDB speeds are not AWS's; CPU per message and "
        "requests per message are the worker's own.",
        f"Crash row: CHECKPOINT_SECONDS {crash['checkpoint_s']:g} (to stay short; the bound scales with it), the "
        "other timings at their defaults; the dead owner's checkpoints read from the table after the kill.",
    ]
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    markdown = "\n".join([md_table(header, table_rows), "", *[f"- {x}" for x in notes], "", crash_table(crashed)])
    return Result("Sinks", command, {"ingestion": s, "crash": crash}, markdown,
                  {"levels": levels, "crash": {k: v for k, v in crashed.items() if k != "audits"},
                   "crash_audits": crashed["audits"]})


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.sinks [--connections N] [--rate R] [--sink S ...] [--out DIR]``:
    one row of the table above per sink, without the flush and crash rows: AWS requests,
    frames per write request, and stream records, bytes and KB billed per message, side
    by side (each sink in a fresh emulator, one after the other)."""
    import argparse
    import shlex
    import sys

    p = argparse.ArgumentParser(prog="python -m bench.sinks", description=main.__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--sink", action="append", choices=SINKS, help="a sink to measure (repeatable) [all three]")
    p.add_argument("--out", default=".bench", help="where the rows' logs go [.bench]")
    args = p.parse_args(argv)
    command = "python -m bench.sinks " + shlex.join(sys.argv[1:] if argv is None else argv)
    s = settings_for(False)
    rows = []
    for sink in args.sink or SINKS:
        print(f"    {args.connections} x {args.rate:g}/s, SINK={sink}", flush=True)
        lv = run_level(Path(args.out) / f"sinks-row-{sink}", args.connections, args.rate, FLUSH_MS, s, sink=sink)
        rows.append([
            sink, fmt(lv["stored_per_s"], 0), fmt(lv["requests_per_message"], 3),
            fmt(lv["requests_per_message_steady"], 3) if lv["requests_per_message_steady"] is not None else "-",
            fmt(lv["records_per_put"], 1) if sink in STREAMS else fmt(lv["messages_per_batch"], 1),
            stream_cell(lv.get("stream")),
        ])
    print(f"\n{command}  (at {time.strftime('%H:%M UTC on %Y-%m-%d', time.gmtime())})\n")
    print(md_table([f"{args.connections} x {args.rate:g} msg/s, SINK", "stored msg/s", "AWS req / msg",
                    "steady (one checkpoint per connection per cycle)", "frames per write request",
                    "stream records / bytes / KB billed per msg"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
