"""What ``wsfleet plan`` prints (:func:`plan`): the fleet, its limits, each sink's and each
mode's bill, secrets and large frames, from the plan's result (the same data ``--json``
prints), numbers as a person reads them."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .render import _indent, table


def plan(result: Mapping[str, Any]) -> str:
    hold, busy = result["holding"], result["with_messages"]
    rate = result["rate"]
    measured = result["measured_with"]
    rows = [
        [name, f"{t['requests']:,.1f}", f"{t['rru']:,.1f}", f"{t['wru']:,.1f}"]
        for name, t in sorted(busy["tables"].items())
    ]
    hottest = sorted(hold["partitions"].items(), key=lambda kv: -(kv[1]["rru"] + kv[1]["wru"]))
    parts = [[name, f"{p['rru']:,.2f}", f"{p['wru']:,.2f}"] for name, p in hottest]
    b = (busy if rate else hold)["binding"]
    # Where the counts come from, without the scratch directory the benchmark wrote to.
    command = re.sub(r" --out \S+", "", str(measured.get("command", "?")))
    lines = [
        f"{hold['connections']:,} connections, {hold['per_worker']} per worker ({result['env']}): "
        f"{hold['workers']:,} workers",
        "",
        "per second, holding" + (f" and storing {rate:g} msg/s per connection" if rate else "") + ":",
        _indent(table(["TABLE / INDEX", "REQUESTS", "READ UNITS", "WRITE UNITS"], rows)),
        "",
        "per partition, holding (limits: 3,000 read / 1,000 write units per second each):",
        _indent(table(["PARTITION", "READ UNITS", "WRITE UNITS"], parts)),
        "",
        f"DynamoDB binds first{' (with messages)' if rate else ''}: {b['name']} at {b['utilisation'] * 100:.1f} % "
        f"(full at about {b['connections_at_limit']:,.0f} connections)",
        f"from the counts measured by `{command}` at commit {measured.get('commit', '?')} "
        f"({measured.get('date', '?')}); prices are us-east-1 on-demand list prices: check them before relying on them",
    ]
    lines += limits(result)
    lines += _task_sizes(result.get("task_sizes"))
    lines += _sinks(result.get("sinks"))
    lines += _modes(result.get("modes"), result.get("sinks"))
    lines += _secrets(result.get("secrets"))
    lines += _large_frames(result)
    return "\n".join(lines)



def _task_sizes(sizes: Mapping[str, Any] | None) -> list[str]:
    """Every task size the plan considered (wsfleet.plan.task_sizes), and the one it picked."""
    if not sizes:
        return []
    rows = [
        [f"{r['cpu'] / 1024:g} vCPU / {r['memory_mib']:,} MiB", f"{r['by_cpu']:,}", f"{r['by_memory']:,}",
         f"{r['capacity']:,} ({r['bound']})", f"{r['target']:,}",
         f"{r['workers']:,}" if "workers" in r else "-",
         f"{r['usd_per_1000']:,.2f}" if "usd_per_1000" in r else "-",
         "ok" if r["ok"] else r["why_not"]]
        for r in sizes["sizes"]
    ]
    return [
        "",
        f"task sizes ({sizes['architecture']}) at {sizes['rate']:g} msg/s per connection (holding all-in: tasks, tables, queue, NAT, metrics; "
        "the sinks are priced apart):",
        _indent(table(["TASK", "BY CPU", "BY MEMORY", "HOLDS", "TARGET", "WORKERS", "$ / 1,000 / MONTH", ""], rows)),
        f"picked: {sizes['why']}",
    ]


def _task(task: Mapping[str, Any]) -> str:
    """A worker task as the plan priced it: ``0.5 vCPU / 1 GiB arm64``, ``0.25 vCPU / 512 MiB x86_64 Spot``."""
    memory = task["memory_mib"]
    size = f"{memory // 1024} GiB" if memory % 1024 == 0 else f"{memory} MiB"
    return f"{task['cpu'] / 1024:g} vCPU / {size} {task['architecture']}{' Spot' if task['spot'] else ''}"

def limits(result: Mapping[str, Any]) -> list[str]:
    """The limits in every scenario (wsfleet.plan.limits), the first one hit and what moves it."""
    if "limits" not in result:
        return []
    rows = [
        [lim["scenario"], lim["name"], _figure(lim["used"]), _figure(lim["limit"]), "ok" if lim["ok"] else "OVER"]
        for lim in result["limits"]
    ]
    m = result["month"]
    first = result["first_limit"]
    lines = [
        "",
        f"limits, {result['workers']:,} workers (steady; 10 % crash; a zone of two lost; 10 % join; 10 % scale-in; a deploy's 2x tasks):",
        _indent(table(["SCENARIO", "LIMIT", "USED", "OF", ""], rows)),
        "",
        f"$ per month, the whole fleet: {m['total']:,.0f} (DynamoDB {m['dynamodb_writes'] + m['dynamodb_reads']:,.0f}, "
        f"Fargate {m['fargate']:,.0f} ({_task(result['task'])}), NAT gateways {m['nat_hours']:,.0f} + addresses {m['nat_addresses']:,.0f} "
        f"+ data {m['nat_data']:,.0f}, "
        f"SQS {m['sqs']:,.0f}, CloudWatch metrics {m['cloudwatch']:,.0f}"
        + (f", the messages as deployed ({result['modes']['deployed']['label']}) {m['messages']:,.0f}" if "messages" in m else "")
        + ")",
        f"a rolling deploy launches {result['workers']:,} tasks: about {result['deploy_minutes']:,.1f} min at the "
        f"service's launch rate; START of every connection at the API's rate: {result['fill_seconds'] / 60:,.0f} min",
    ]
    if first is None:
        lines.append("first limit hit: none")
    else:
        lines.append(
            f"first limit hit: {first} ({result['first_limit_scenario']}); moved by: {result['first_limit_fix']}"
        )
        if len(result["exceeded"]) > 1:
            lines.append("also exceeded: " + "; ".join(result["exceeded"][1:]))
    cells = result["cells"]
    if cells:
        lines.append(
            f"one fleet cannot hold this whatever its settings and quotas: {cells['limit']} ({cells['scenario']}) "
            f"needs {cells['cells']} cells, independent fleets behind the one API (docs/scaling.md: \"Beyond one fleet: cells\")"
        )
    return lines


def _percent(share: float) -> str:
    """A share as a person reads it: ``2,490 %``, ``49.8 %``, ``0.0488 %`` (no exponent)."""
    pct = share * 100
    return f"{pct:,.0f} %" if pct >= 100 else f"{pct:.3g} %" if pct >= 0.001 else "under 0.001 %" if pct else "0 %"


def _figure(x: float) -> str:
    """A number as a person reads it: no exponent, no ".0" on a whole one."""
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:,.1f}"


def _sinks(p: Mapping[str, Any] | None) -> list[str]:
    if not p:
        return []
    if not p["rate"]:
        return ["", "where frames go (SINK): no frames priced (--rate R to price the table and the stream side by side)"]
    parts = ("holding", "checkpoints", "dynamodb", "kinesis", "firehose")
    rows = [
        [name, *(f"{s['month'][k]:,.0f}" if k in s["month"] else "-" for k in parts),
         f"{s['month']['total']:,.0f}", f"{s['per_1000_connections']:,.2f}"]
        for name, s in p["sinks"].items()
    ]
    k, t = p["kinesis"], p["dynamodb"]
    km = k["month"]
    consumer = p["consumer"]
    packed = p["packing"]["kinesis"]
    stream = (
        f"stream: each frame a {p['record_bytes']} B record, a connection's frames of one flush "
        f"({packed['period_s'] * 1000:,.0f} ms: FLUSH_INTERVAL_MS {p['flush_ms']:,}, or a full batch sooner; "
        f"{packed['frames_per_flush']:,.3g} frames) in one: {packed['records_per_message']:.3f} Kinesis records and "
        f"{packed['billed_kb_per_message']:.3f} KB billed per message (unpacked: 1 and "
        f"{math.ceil(p['record_bytes'] / 1024)}); {k['gb_ingested_per_month']:,.0f} GB in per month: "
        f"ingest {km['ingest']:,.0f}, retrieval {km['retrieval']:,.0f}, "
        f"stream-hours {km['stream']:,.0f}, retention past 24 h {km['retention']:,.0f}, KMS key and requests {km['kms']:,.2f}"
    )
    if consumer:
        c = k["consumer"]
        stream += (
            f"; reference consumer (batches of up to {consumer['batch_size']:,} or {consumer['window_s']:g} s, "
            f"{c['shards']} shards): {c['invocations']:,.1f} invocations/s of {c['records_per_invocation']:,.0f} records, "
            f"Lambda {km['consumer_lambda']:,.0f}, S3 PUTs {km['consumer_s3']:,.0f}, "
            f"state writes {km['consumer_state']:,.0f} ({c['state_writes']:,.1f}/s)"
        )
    else:
        stream += "; no consumer priced (--no-consumer)"
    def load(lim: Mapping[str, Any]) -> str:
        if lim["unit"] == "bytes/s":  # shown in MB/s (2^20 bytes), as Kinesis states its limits
            return f"{_figure(lim['load'] / (1 << 20))} / {_figure(lim['limit'] / (1 << 20))} MB/s"
        return f"{_figure(lim['load'])} / {_figure(lim['limit'])} {lim['unit']}"

    limit_rows = [
        [lim["sink"], lim["name"], load(lim), _percent(lim["utilisation"]),
         "-" if lim["reached_at"] is None else
         (f"{lim['reached_at']:,.4g} msg/s per connection" if lim["scales_with"] == "rate" else f"{lim['reached_at']:,.0f} connections")]
        for lim in p["limits"]
    ]
    return [
        "",
        f"where frames go (SINK), each sink's part of the month side by side, $ at {p['rate']:g} msg/s of "
        f"{p['frame_bytes']:,} B per connection (stream kept {p['retention_hours']:g} h, table items "
        f"{p['ttl_days']:g} days; the whole fleet's month is above):",
        _indent(table(["SINK", "HOLDING", "CHECKPOINTS", "TABLE", "STREAM", "DELIVERY", "SINK'S PART", "PER 1,000 CONNECTIONS"], rows)),
        f"table: {t['wru_per_message']} write unit(s) per {p['item_bytes']} B item, writes {t['month']['writes']:,.0f}, "
        f"storage {t['month']['storage']:,.0f} ({t['stored_gb']:,.0f} GB)",
        stream,
        _delivery(p["firehose"]),
        "Kinesis: On-demand Standard list prices (On-demand Advantage is lower); KMS free tier not counted; the "
        "consumer's Lambda duration is an assumption; its output objects' storage is yours",
        "",
        "where the sinks' limits bind:",
        _indent(table(["SINK", "LIMIT", "LOAD / LIMIT", "USED", "REACHED AT"], limit_rows)),
    ]


def _modes(c: Mapping[str, Any] | None, p: Mapping[str, Any] | None) -> list[str]:
    """Every way to keep the messages (wsfleet.plan.modes), the environment's, the cheapest."""
    if not c or not p:
        return []

    def sized(m: Mapping[str, Any]) -> str:
        if m["mode"] == "table_provisioned":
            return f"{m['write_units']:,} WCU ({m['target_utilisation']:.0%} used), {m['read_units']:,} RCU"
        if m["mode"] == "stream_provisioned":
            return f"{m['shards']:,} shard{'s' if m['shards'] != 1 else ''} ({m['shards_needed']:,} needed)"
        if "write_units_per_s" in m:
            return f"{_figure(m['write_units_per_s'])} WRU/s"
        if "records_per_s" in m:
            return f"{_figure(m['records_per_s'])} records/s"
        return f"{_figure(m['calls_per_s'])} calls/s of {_size(round(m['record_bytes']))}"

    def verdict(m: Mapping[str, Any]) -> str:
        raise_first = f", raise first: {'; '.join(m['raise_first'])}" if m["raise_first"] else ""
        return "ok" + raise_first if m["holds"] else "OVER: " + "; ".join(m["over"])

    rows = [[m["label"], f"{m['month']['total']:,.0f}", f"{m['per_1000_connections']:,.2f}", sized(m), verdict(m)]
            for m in c["modes"]]
    parts = {m["label"]: ", ".join(f"{k.replace('_', ' ')} {_figure(v)}" for k, v in m["month"].items() if k != "total")
             for m in c["modes"]}
    d, r = c["deployed"], c["recommended"]
    return [
        "",
        f"the messages, each way to keep them, $ at {p['rate']:g} msg/s of {p['frame_bytes']:,} B per connection (the "
        "sink's own bill: holding and checkpoints are the fleet's; a stream's reader apart, but for on-demand retrieval):",
        _indent(table(["MODE", "$ / MONTH", "$ / 1,000 / MONTH", "SIZED", "LIMITS"], rows)),
        *(f"  {label}: {text}" for label, text in parts.items()),
        f"this environment deploys {d['label']}: {d['total']:,.0f} $ a month, {d['per_1000_connections']:,.2f} per 1,000 "
        "connections" + ("" if d["holds"] else f", and it does not hold: {'; '.join(d['over'])}"),
        f"recommended: {r['why']}",
    ]


def _delivery(h: Mapping[str, Any]) -> str:
    m = h["month"]
    return (
        f"delivery stream (firehose): each frame a {h['line_bytes']} B line, a worker's lines of one flush (every connection's) in one "
        f"record: {h['records_per_message']:.3f} Firehose records and {h['billed_kb_per_message']:.2f} KB billed per "
        f"message (each record rounded up to 5 KB); ingest {m['ingest']:,.0f}, dynamic partitioning {m['partitioning']:,.0f}, "
        f"S3 PUTs {m['s3_puts']:,.0f} ({h['objects_per_month']:,.0f} objects a month), S3 storage {m['storage']:,.0f} "
        f"({h['stored_gb']:,.0f} GB GZIP'd, {h['gzip_ratio']:g} times smaller than the lines: --gzip-ratio); "
        f"${h['per_message'] * 1e6:,.2f} per million messages (JQ hours and Athena scans not priced)"
    )


def _secrets(s: Mapping[str, Any] | None) -> list[str]:
    if not s:
        return ["Secrets Manager: no secret_headers priced (--secrets N [--reconnects R] [--refused N])"]
    calls, month = s["calls_per_hour"], s["month"]
    refused = f", {s['refused']:,} refused ({calls['refused']:,.0f} calls/h)" if s["refused"] else ""
    return [
        f"Secrets Manager: {s['secrets']:,} secret{'s' if s['secrets'] != 1 else ''} "
        f"({s['secrets_per_worker']:,.1f} per worker), "
        f"{s['reconnects_per_hour']:g} connects per connection-hour, a value cached {s['cache_s']:g} s per worker"
        f"{refused}: {calls['total']:,.0f} GetSecretValue calls/h ({s['calls_per_connection_hour']:.3g} per connection-hour); "
        f"$ per month {month['total']:,.2f} (calls {month['calls']:,.2f}, secrets {month['secrets']:,.2f}), "
        f"${s['per_connection_hour'] * 1e6:,.2f} per million connection-hours",
    ]


def _large_frames(result: Mapping[str, Any]) -> list[str]:
    costs = result.get("large_frame_cost") or []
    if not costs:
        return []

    def money(v: float | None) -> str:
        return "-" if v is None else f"{v:,.2f}"

    rows = []
    for c in costs:
        s3, inline = c["per_million_s3"], c["per_million_inline"]
        rows.append([
            _size(c["bytes"]), money(s3["put"] + s3["pointer_item"]), money(s3["reads"]), money(s3["storage"]), money(s3["total"]),
            money(inline and inline["write"]), money(inline and inline["reads"]), money(inline and inline["storage"]),
            money(inline and inline["total"]) if inline else "over the 400 KB item limit",
        ])
    days = costs[0]["retention_days"]
    lines = [
        "",
        f"$ per million large frames (kept {days:g} days, read once; S3 Standard list prices; transfer out extra):",
        _indent(table(["DATA", "S3: PUT + ITEM", "S3: READ", "S3: STORAGE", "S3: TOTAL",
                       "INLINE: WRITE", "INLINE: READ", "INLINE: STORAGE", "INLINE: TOTAL"], rows)),
    ]
    big = result.get("large_frames")
    if big:
        lines.append(
            f"large frames: {_size(big['per_frame']['bytes'])} each, {big['frames_per_month']:,.0f} per month "
            f"({big['puts_per_second']:,.1f} S3 PUTs/s, {big['stored_gb']:,.0f} GB stored): ${big['dollars_s3']:,.0f} per month"
        )
    return lines


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n / 1000:,.0f} KB" if n >= 1000 else f"{n} B"
