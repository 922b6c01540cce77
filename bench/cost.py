"""Cost: DynamoDB requests and capacity units per connection-hour and per message,
counted at the client (the worker's own request counter) over a steady window, turned
into an on-demand price per 1,000 connections per month.

Capacity units are computed from the sizes of real items read back from the emulator,
with DynamoDB's rules (moto does not report consumed capacity faithfully):

* a write costs ceil(item size / 1 KB) write request units (WRU); an update is sized
  by the larger of the item before and after;
* a global secondary index write costs WRU for the index entry: when an update changes
  an index key attribute, the index entry is deleted and put again (2 writes). A
  renewal always moves ``lease_expires_at_ms``, the sort key of ``by_state_expiry``, so
  every renewal costs the base-table write plus 2 index writes (KEYS_ONLY entries are
  far below 1 KB: 1 WRU each);
* an eventually consistent Query costs 0.5 read request units (RRU) per 4 KB read,
  and at least 0.5 even when it returns nothing;
* BatchWriteItem costs what its items cost (it saves requests, not units).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping

from wsfleet import config as cfg
from wsfleet import metrics_names
from wsfleet import schema
from wsfleet.local.fleet import eventually

from .common import Result, Rig, Window, fmt, fmt_spread, md_table, median_spread

# On-demand list prices, us-east-1, Standard table class, as published after the
# November 2024 on-demand price reduction. They change: check
# https://aws.amazon.com/dynamodb/pricing/on-demand/ before relying on them.
PRICES = {
    "region": "us-east-1",
    "dynamodb_wru_per_million": 0.625,
    "dynamodb_rru_per_million": 0.125,
    "sqs_requests_per_million": 0.40,  # standard queue, beyond the free tier
    "cloudwatch_put_metric_data_per_thousand": 0.01,
    "cloudwatch_custom_metric_month": 0.30,  # first 10,000 metrics
}
HOURS_PER_MONTH = 730
CONNECTIONS_PER_TASK = 100  # the published design's figure, and MAX_CONNECTIONS' default
PRODUCTION_METRICS_SECONDS = 60  # the worker's default; the benchmark publishes faster
CUSTOM_METRICS = 2 + len(metrics_names.COUNTERS)  # + ActiveConnections, UnownedConnections; one ServiceName value
SUB_WINDOWS = 4  # the steady window is also cut into this many, for medians and spreads

# The published design: one renew per heartbeat, one GetItem per connection per 10 s
# (read as strongly consistent, 1 RRU), one PutItem per message.
PUBLISHED_GETITEM_EVERY_S = 10


def attribute_size(name: str, value: Any) -> int:
    """DynamoDB's size of one attribute: name bytes plus value bytes (numbers: 1 byte
    per two significant digits, plus 1)."""
    n = len(name.encode())
    if isinstance(value, bool) or value is None:
        return n + 1
    if isinstance(value, (int, float)):
        digits = str(abs(int(value))).strip("0") or "0"
        return n + math.ceil(len(digits) / 2) + 1
    if isinstance(value, bytes):
        return n + len(value)
    return n + len(str(value).encode())


def item_size(item: Mapping[str, Any]) -> int:
    return sum(attribute_size(k, v) for k, v in item.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def read_units_eventual(size: int) -> float:
    return 0.5 * max(1, math.ceil(size / 4096))


def month_cost(*, per_conn_hour: Mapping[str, float], per_worker_hour: Mapping[str, float], connections: int = 1000) -> dict[str, float]:
    """Dollars per month for ``connections`` held at CONNECTIONS_PER_TASK per task."""
    conn_h = connections * HOURS_PER_MONTH
    task_h = math.ceil(connections / CONNECTIONS_PER_TASK) * HOURS_PER_MONTH
    wru = per_conn_hour.get("wru", 0) * conn_h + per_worker_hour.get("wru", 0) * task_h
    rru = per_conn_hour.get("rru", 0) * conn_h + per_worker_hour.get("rru", 0) * task_h
    sqs = per_worker_hour.get("sqs", 0) * task_h
    cw = per_worker_hour.get("cloudwatch", 0) * task_h
    out = {
        "dynamodb_writes": wru / 1e6 * PRICES["dynamodb_wru_per_million"],
        "dynamodb_reads": rru / 1e6 * PRICES["dynamodb_rru_per_million"],
        "sqs": sqs / 1e6 * PRICES["sqs_requests_per_million"],
        "cloudwatch": cw / 1e3 * PRICES["cloudwatch_put_metric_data_per_thousand"],
    }
    out["total"] = sum(out.values())
    return out


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "connections": 4 if quick else 40,
        "rate_per_connection": 2.0 if quick else 0.5,  # messages/s per stream
        "window_s": 3 if quick else 60,
        "worker": {
            cfg.LEASE_SECONDS: 3 if quick else 20,
            cfg.HEARTBEAT_SECONDS: 1 if quick else 5,
            cfg.RECONCILE_SECONDS: 1 if quick else 10,
            cfg.MAX_CLOCK_SKEW_MS: 200 if quick else 1000,
            cfg.FLUSH_INTERVAL_MS: 100,
            cfg.METRICS_SECONDS: 0.5 if quick else 5,
            cfg.MAX_CONNECTIONS: 100,
        },
    }


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    n = s["connections"]
    w_env = s["worker"]
    heartbeat = float(w_env[cfg.HEARTBEAT_SECONDS])
    with Rig(run_dir / "cost") as rig:
        upstream = rig.upstream(s["rate_per_connection"])
        worker = rig.worker("w1", w_env)
        ids = [f"cost{i:03d}" for i in range(n)]
        rig.start_connections(ids, upstream)
        eventually(lambda: upstream.open_sockets() == n, 60 + 2 * float(w_env[cfg.RECONCILE_SECONDS]), f"{n} sockets open")
        # Steady: every connection has renewed at least once and batches are flowing.
        time.sleep(heartbeat * 1.5)
        first = worker.next_stats()
        time.sleep(s["window_s"])
        last = worker.next_stats()
        lines = worker.stats_between(first, last)
        conn_item = rig.connections.get(ids[0])
        msg = rig.ddb.query(
            TableName=rig.aws_env["MESSAGES_TABLE_NAME"],
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": {"S": schema.connection_pk(ids[0])}},
            Limit=1,
        )["Items"]
    from wsfleet.store import unmarshal

    msg_item = unmarshal(msg[0]) if msg else {}
    return _result(s, lines, conn_item or {}, msg_item, command, quick)


def renewals(win: Window) -> int:
    """UpdateItem requests that were renewals (acquires and releases are UpdateItem too)."""
    return win.ddb("UpdateItem") - win.counters["LeasesAcquired"] - win.counters["LeasesReleased"]


def _result(s: dict, lines: list, conn_item: dict, msg_item: dict, command: str, quick: bool) -> Result:
    w_env = s["worker"]
    heartbeat = float(w_env[cfg.HEARTBEAT_SECONDS])
    shards = cfg.state_shards({})
    win = Window.between(lines[0], lines[-1])
    parts = Window.series(lines, step=max(1, (len(lines) - 1) // SUB_WINDOWS))
    conn_hours = win.active * win.seconds / 3600
    worker_hours = win.seconds / 3600
    messages = win.counters["MessagesStored"]
    batches = win.ddb("BatchWriteItem")
    gets = win.ddb("GetItem")
    # Every metrics publish also counts unowned connections: one COUNT Query per shard.
    # Those follow METRICS_SECONDS (scaled to production below); the rest are the reconciler's.
    publishes = len(lines) - 1
    count_queries = publishes * shards
    reconcile_queries = win.ddb("Query") - count_queries
    spread = {
        "renewals_per_connection_hour": median_spread(renewals(w) * 3600 / (w.active * w.seconds) for w in parts),
        "messages_per_connection_hour": median_spread(w.counters["MessagesStored"] * 3600 / (w.active * w.seconds) for w in parts),
        "batch_requests_per_message": median_spread(
            w.ddb("BatchWriteItem") / w.counters["MessagesStored"] for w in parts if w.counters["MessagesStored"]
        ),
    }

    conn_size = item_size(conn_item)
    msg_size = item_size(msg_item)
    renew_wru = write_units(conn_size)
    gsi_wru_per_renew = 2  # delete + put of the index entry: the sort key moved
    msg_wru = write_units(msg_size)
    query_rru = read_units_eventual(0)  # steady state: no suspects, nothing returned

    per_conn_hour = {
        "renewals": spread["renewals_per_connection_hour"]["median"],
        "batch_requests": batches / conn_hours,
        "getitem": gets / conn_hours,
        "messages": spread["messages_per_connection_hour"]["median"],
    }
    per_conn_hour["wru_renew_table"] = per_conn_hour["renewals"] * renew_wru
    per_conn_hour["wru_renew_gsi"] = per_conn_hour["renewals"] * gsi_wru_per_renew
    per_conn_hour["wru_messages"] = per_conn_hour["messages"] * msg_wru
    metrics_scale = float(w_env[cfg.METRICS_SECONDS]) / PRODUCTION_METRICS_SECONDS
    queries_per_worker_hour = reconcile_queries / worker_hours + count_queries * metrics_scale / worker_hours
    per_worker_hour = {
        "query": queries_per_worker_hour,
        "reconcile_query": reconcile_queries / worker_hours,
        "count_unowned_query": count_queries * metrics_scale / worker_hours,
        "rru": queries_per_worker_hour * query_rru,
        "sqs": sum(v for k, v in win.requests.items() if k.startswith("sqs.")) / worker_hours,
        "cloudwatch": win.requests.get("cloudwatch.PutMetricData", 0) * metrics_scale / worker_hours,
    }
    holding = month_cost(
        per_conn_hour={"wru": per_conn_hour["wru_renew_table"] + per_conn_hour["wru_renew_gsi"]},
        per_worker_hour=per_worker_hour,
    )
    holding_no_gsi = month_cost(per_conn_hour={"wru": per_conn_hour["wru_renew_table"]}, per_worker_hour=per_worker_hour)
    per_million_messages = 1e6 * msg_wru / 1e6 * PRICES["dynamodb_wru_per_million"]
    published = {
        "renewals": 3600 / heartbeat,
        "getitem": 3600 / PUBLISHED_GETITEM_EVERY_S,
        "requests_per_message": 1.0,
    }
    published_month = month_cost(
        per_conn_hour={"wru": published["renewals"] * renew_wru, "rru": published["getitem"] * 1.0},
        per_worker_hour={},
    )
    custom_metrics_month = CUSTOM_METRICS * PRICES["cloudwatch_custom_metric_month"]

    rows = [
        ["lease renewals (UpdateItem) / connection-hour", fmt_spread(spread["renewals_per_connection_hour"], 0), fmt(published["renewals"], 0),
         f"one per heartbeat ({heartbeat:g} s)"],
        ["GetItem / connection-hour", fmt(per_conn_hour["getitem"], 0), fmt(published["getitem"], 0),
         "STOP is seen in the renewal's failed condition: no polling read"],
        ["WRU / connection-hour, table", fmt(per_conn_hour["wru_renew_table"], 0), fmt(published["renewals"] * renew_wru, 0),
         f"connection item {conn_size} B -> {renew_wru} WRU per renewal"],
        ["WRU / connection-hour, GSI", fmt(per_conn_hour["wru_renew_gsi"], 0), "not stated",
         "renewal moves the index sort key: delete + put of the index entry"],
        ["RRU / connection-hour", fmt(per_worker_hour["rru"] / CONNECTIONS_PER_TASK, 1), fmt(published["getitem"] * 1.0, 0),
         f"Query per worker-hour: {fmt(per_worker_hour['reconcile_query'], 0)} reconcile ({w_env[cfg.RECONCILE_SECONDS]} s, "
         f"{shards} shards) + {fmt(per_worker_hour['count_unowned_query'], 0)} UnownedConnections counts (at "
         f"METRICS_SECONDS {PRODUCTION_METRICS_SECONDS}), 0.5 RRU each, shared by {CONNECTIONS_PER_TASK} connections per task"],
        ["DynamoDB requests / message", fmt_spread(spread["batch_requests_per_message"], 3), "1.000",
         f"BatchWriteItem, {fmt(messages / batches if batches else None, 1)} messages per batch at "
         f"{s['rate_per_connection']:g} msg/s per connection, FLUSH_INTERVAL_MS {w_env[cfg.FLUSH_INTERVAL_MS]}"],
        ["WRU / message", fmt(msg_wru, 0), "1", f"message item {msg_size} B; no index"],
        ["$ / 1,000 connections / month, holding (DynamoDB + SQS + CloudWatch requests)",
         fmt(holding["total"], 0), fmt(published_month["total"], 0),
         f"of which GSI {fmt(holding['total'] - holding_no_gsi['total'], 0)}; DynamoDB reads "
         f"{fmt(holding['dynamodb_reads'], 2)}, SQS {fmt(holding['sqs'], 2)}, CloudWatch {fmt(holding['cloudwatch'], 2)}"
         f" (+ {fmt(custom_metrics_month, 2)} for {CUSTOM_METRICS} custom metrics per service)"],
        ["$ / million messages (writes only, storage extra)", fmt(per_million_messages, 3),
         fmt(PRICES["dynamodb_wru_per_million"], 3), "same units; batching saves requests, not units"],
    ]
    markdown = md_table(["figure", "measured", "published design", "how"], rows)
    notes = [
        f"Steady window {win.seconds:.0f} s ({len(parts)} sub-windows: median (min-max)), {win.active} connections on one "
        f"worker, {messages} messages; "
        f"requests counted by the worker per operation (retries included): "
        + ", ".join(f"{k} {v}" for k, v in win.requests.items() if v),
        f"Prices: {PRICES['region']} on-demand, ${PRICES['dynamodb_wru_per_million']}/M WRU, "
        f"${PRICES['dynamodb_rru_per_million']}/M RRU, SQS ${PRICES['sqs_requests_per_million']}/M requests, "
        f"PutMetricData ${PRICES['cloudwatch_put_metric_data_per_thousand']}/1,000; check them before relying on them.",
        f"Month = {HOURS_PER_MONTH} h; {CONNECTIONS_PER_TASK} connections per task; CloudWatch scaled to "
        f"METRICS_SECONDS={PRODUCTION_METRICS_SECONDS} (the benchmark publishes every {w_env[cfg.METRICS_SECONDS]} s).",
    ]
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    data = {
        "settings": s,
        "window": vars(win),
        "sub_windows": [vars(w) for w in parts],
        "spread": spread,
        "sizes": {"connection_item_bytes": conn_size, "message_item_bytes": msg_size},
        "units": {"renew_wru": renew_wru, "gsi_wru_per_renew": gsi_wru_per_renew, "message_wru": msg_wru, "query_rru": query_rru},
        "per_connection_hour": per_conn_hour,
        "per_worker_hour": per_worker_hour,
        "month_per_1000_connections": {"holding": holding, "holding_without_gsi": holding_no_gsi, "published_design": published_month},
        "per_million_messages": per_million_messages,
        "prices": PRICES,
    }
    return Result("Cost", command, s, markdown, data, notes)
