"""Cost: DynamoDB requests and capacity units per connection-hour and per message,
counted at the client (each worker's own request counter) over a steady window at the
worker's DEFAULT timings, turned into an on-demand price per 1,000 connections per
month, and scaled to fleets of 10k to 1M connections (:mod:`wsfleet.plan`, which also reads
the per-operation counts this benchmark writes to ``runtime/wsfleet/measured_ops.json``).

Several workers (so that each has ring successors to watch) holding 100 connections each
on average, a tenth of them receiving frames, with room to spare (MAX_CONNECTIONS 200, as
prod runs): a full worker neither polls for hints nor scans for free connections, so a
fleet with room is the dearer case, and the one measured. The worker counts requests
per operation; the emulator's request ledger splits each operation by table, index and
partition (a Query may be a free scan, an audit, a ring read, an UnownedConnections
count or a stored-end read), so every request is charged to what it is for.

Capacity units are computed from the sizes of real items read back from the emulator,
with DynamoDB's rules (moto does not report consumed capacity faithfully):

* a write costs ceil(item size / 1 KB) write request units (WRU); an update is sized
  by the larger of the item before and after;
* a global secondary index costs WRU when a write changes it (:func:`.units.index_writes`):
  2 when an index key attribute changes (the entry is deleted and put again), 1 when
  the item enters or leaves a sparse index or a projected non-key attribute changes,
  0 otherwise. Sessions: a renewal changes neither key of ``by_ring_load`` (ring,
  session_id) nor, unless the load changed, what it projects: 0. Connections: an acquire
  moves ``owner_key`` (the key of ``by_owner``): 2; a graceful handoff leaves it (the
  connection stays attached to its session): 0; a free release moves it into ``FREE#``
  (a handoff nobody took: 2) or out of the index (a STOP: 1); a checkpoint changes
  ``last_seq``, which ``by_owner`` does not project: 0. The release items are the
  store's own writes read back (:func:`.units.release_items`), not a copy of them;
* an eventually consistent Query costs 0.5 read request units (RRU) per 4 KB of what
  it reads (index entries, for an index query), and 0.5 even when it reads nothing; a
  strongly consistent one (the stored-end read at a takeover) 1 per 4 KB;
* BatchGetItem costs per item: 0.5 RRU per eventually consistent item up to 4 KB;
* BatchWriteItem costs what its items cost (it saves requests, not units).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

from wsfleet import config as cfg
from wsfleet import settings_spec
from wsfleet import schema
from wsfleet.leases import INBOX_IDLE_POLL_S
from sim.emulator import request_ledger
from sim.processes import eventually
from wsfleet.plan import metrics_cost, model
from wsfleet.plan.fleet import fleet
from wsfleet.store import SessionsStore, unmarshal

from . import before, scaling, sinks_plan
from .common import Result, Rig, Stats, Window, WorkerProcess, fmt, fmt_spread, machine, md_table, median_spread
from .units import index_spec, index_writes, item_size, read_units_eventual, release_items, write_units

# On-demand list prices, us-east-1, Standard table class, as published after the
# November 2024 on-demand price reduction. They change: check
# https://aws.amazon.com/dynamodb/pricing/on-demand/ before relying on them.
PRICES = {
    "region": "us-east-1",
    "dynamodb_wru_per_million": 0.625,
    "dynamodb_rru_per_million": 0.125,
    "sqs_requests_per_million": 0.40,  # standard queue, beyond the free tier
    "cloudwatch_logs_ingest_per_gb": metrics_cost.CLOUDWATCH_LOGS_INGEST_PER_GB,  # the metrics' EMF lines
    "cloudwatch_custom_metric_month": metrics_cost.CLOUDWATCH_CUSTOM_METRIC_MONTH,  # first 10,000 metrics
}
HOURS_PER_MONTH = model.HOURS_PER_MONTH


def custom_metrics() -> tuple[int, int]:
    """Custom metrics the fleet publishes: (per service, per worker while it runs). Every
    metric carries ServiceName only (EMF lines: wsfleet.plan.metrics_cost), so none per worker."""
    return metrics_cost.metric_count(), 0


TARGET_WRU = 20  # per connection-hour, holding, at 100 connections per worker (the target)
TARGET_RRU = 20
HOLDING = ("renewal", "inbox", "watch", "ring", "free scan", "unowned count", "audit", "sweep")


# --- the run -------------------------------------------------------------------------------


def settings_for(quick: bool) -> dict[str, Any]:
    per_worker = 4 if quick else 100
    worker: dict[str, Any] = {settings_spec.MAX_CONNECTIONS: 2 * per_worker}
    if quick:
        worker.update({
            settings_spec.LEASE_SECONDS: 3, settings_spec.HEARTBEAT_SECONDS: 1, settings_spec.RECONCILE_SECONDS: 1, settings_spec.MAX_CLOCK_SKEW_MS: 200,
            settings_spec.METRICS_SECONDS: 1, settings_spec.CHECKPOINT_SECONDS: 1,
        })
    return {
        "workers": 3,  # each watches WATCH_K = 2 ring successors
        "per_worker": per_worker,
        "busy": 3 if quick else 30,
        "rate_per_busy_connection": 2.0 if quick else 0.5,  # messages/s per stream
        "intervals": 2 if quick else 3,  # stats intervals (METRICS_SECONDS each) in the steady window
        "worker": worker,
    }


def timings(worker: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's settings as it parses them: its defaults, and what the run sets."""
    env = {"TABLE_NAME": "t", "SESSIONS_TABLE_NAME": "s", "MESSAGES_TABLE_NAME": "m", "MESSAGES_BUCKET_NAME": "b", "QUEUE_URL": "q", "AWS_REGION": "r"}
    c = cfg.WorkerConfig.from_env({**env, **{k: str(v) for k, v in worker.items()}})
    return {"lease_s": c.lease_ms / 1000, "heartbeat_s": c.heartbeat_ms / 1000, "reconcile_s": c.reconcile_ms / 1000,
            "checkpoint_s": c.checkpoint_ms / 1000, "metrics_s": c.metrics_seconds, "shards": c.state_shards,
            "sweep_s": c.sweep_ms / 1000,
            "skew_ms": c.max_clock_skew_ms, "flush_ms": c.flush_interval_ms, "max_connections": c.max_connections}


def _stats_from(w: WorkerProcess, since: float, skip: int, timeout: float) -> Stats:
    """The worker's ``skip``-th stats line at or after ``since`` (0: the first)."""
    def found() -> Stats | None:
        lines = [st for st in w.stats() if st.ts >= since]
        return lines[skip] if len(lines) > skip else None

    return eventually(found, timeout, f"stats line {skip} of {w.name}", interval=0.2)


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    t = timings(s["worker"])
    n = s["workers"] * s["per_worker"]
    with Rig(run_dir / "cost") as rig:
        env = rig.aws_env
        sessions = SessionsStore(rig.ddb, env["SESSIONS_TABLE_NAME"])
        quiet = rig.upstream(None, "upstream-quiet")
        busy = rig.upstream(s["rate_per_busy_connection"], "upstream-busy")
        busy_ids = [f"busy{i:03d}" for i in range(s["busy"])]
        quiet_ids = [f"cost{i:04d}" for i in range(n - s["busy"])]
        workers = [rig.worker(f"w{i + 1}", s["worker"]) for i in range(s["workers"])]
        rig.start_connections(quiet_ids[:1], quiet)  # no hint: the free scan takes it, after this read
        free_item = rig.connections.get(quiet_ids[0])
        rig.start_connections(busy_ids, busy, hint=True)
        rig.start_connections(quiet_ids[1:], quiet, hint=True)
        eventually(lambda: quiet.open_sockets() + busy.open_sockets() >= n, 120 + 3 * t["reconcile_s"], f"{n} sockets open",
                   interval=0.5)
        owned_item, busy_first = rig.connections.get(quiet_ids[0]), rig.connections.get(busy_ids[0])
        steady = time.time()
        wait = (s["intervals"] + 2) * t["metrics_s"] + 60
        starts = [_stats_from(w, steady, 0, wait) for w in workers]
        session_a = sessions.get(starts[0].session_id)  # (outside the ledger's window: the bench's own reads)
        ledger0, t0 = request_ledger(rig.emulator.endpoint_url), time.time()
        ends = [_stats_from(w, a.ts, s["intervals"], wait) for w, a in zip(workers, starts, strict=True)]
        ledger1, t1 = request_ledger(rig.emulator.endpoint_url), time.time()
        session_b = sessions.get(starts[0].session_id)
        busy_last = rig.connections.get(busy_ids[0])
        releases = release_items(rig.ddb, quiet.url_for(quiet_ids[0]), shards=t["shards"],
                                 last_seq=int((busy_last or {}).get(schema.LAST_SEQ, 0)))
        entries = [unmarshal(raw) for raw in rig.ddb.query(
            TableName=env["TABLE_NAME"], IndexName=schema.OWNER_INDEX, KeyConditionExpression="#k = :k",
            ExpressionAttributeNames={"#k": schema.OWNER_KEY},
            ExpressionAttributeValues={":k": {"S": schema.owner_key_session(starts[0].session_id)}},
        )["Items"]]
        free_left = sum(rig.connections.count_free(shard) for shard in range(t["shards"]))
        msg = rig.ddb.query(
            TableName=env["MESSAGES_TABLE_NAME"], KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": {"S": schema.connection_pk(busy_ids[0])}}, Limit=1,
        )["Items"]
        windows = [Window.between(a, b) for a, b in zip(starts, ends, strict=True)]
        parts = [p for w, a, b in zip(workers, starts, ends, strict=True) for p in Window.series(w.stats_between(a, b))]
        tables = {env["TABLE_NAME"]: "connections", env["SESSIONS_TABLE_NAME"]: "sessions", env["MESSAGES_TABLE_NAME"]: "messages"}
        own = {a.session_id for a in starts}
    measured = {
        "free_item": free_item, "owned_item": owned_item, "busy_first": busy_first, "busy_last": busy_last,
        "session_a": session_a, "session_b": session_b, "index_entries": entries, "free_left": free_left,
        "message_item": unmarshal(msg[0]) if msg else {}, "releases": releases,
        "ledger": ledger_diff(ledger0, ledger1, tables, own), "ledger_seconds": t1 - t0,
    }
    return _result(s, t, windows, parts, measured, command, quick)


def ledger_diff(a: list[dict], b: list[dict], tables: Mapping[str, str], own: set[str]) -> dict[str, dict[str, float]]:
    """Requests (and items) per purpose between two snapshots of the emulator's ledger."""
    def key(r: Mapping[str, Any]) -> tuple:
        return r["op"], r["table"], r["index"], r["partition"], r["select"]

    before_ = {key(r): r for r in a}
    out: dict[str, dict[str, float]] = {}
    for r in b:
        old = before_.get(key(r), {"n": 0, "items": 0})
        n, items = r["n"] - old["n"], r["items"] - old["items"]
        if n:
            p = out.setdefault(purpose(r, tables, own), {"op": r["op"], "n": 0, "items": 0})
            p["n"] += n
            p["items"] += items
    return out


def purpose(r: Mapping[str, Any], tables: Mapping[str, str], own: set[str]) -> str:
    """What a request recorded by the ledger is for (see the worker's takeover and lifecycle)."""
    op, table, index, part, select = r["op"], tables.get(r["table"], r["table"]), r["index"], r["partition"], r["select"]
    if table == "sessions":
        # GetItem: a worker's read of its own item between renewals (its inbox of moves)
        return {"UpdateItem": "renewal", "GetItem": "inbox", "BatchGetItem": "watch", "Query": "ring"}.get(op, f"sessions {op}")
    if table == "connections":
        if op == "Query" and index == schema.OWNER_INDEX:
            if select in ("COUNT", "SPECIFIC_ATTRIBUTES"):
                return "unowned count"  # COUNT for a watched dead session, keys only for FREE#
            if part.startswith(schema.OWNER_KEY_FREE_PREFIX):
                return "free scan"
            return "audit" if part[len(schema.OWNER_KEY_SESSION_PREFIX):] in own else "drain"
        return {"UpdateItem": "connection write", "GetItem": "audit check",
                "TransactWriteItems": "checkpoints"}.get(op, f"connections {op}")
    if table == "messages":
        return {"BatchWriteItem": "messages", "Query": "stored end"}.get(op, f"messages {op}")
    return f"{table} {op}"


def renewals(win: Window) -> int:
    """Session renewals: the worker counts its successful ones (a retried renewal is
    one renewal and several requests)."""
    return win.renewals


def _result(s: dict, t: dict, windows: list[Window], parts: list[Window], m: dict, command: str, quick: bool) -> Result:
    per_worker = s["per_worker"]
    n = s["workers"] * per_worker
    worker_s = sum(w.seconds for w in windows)
    worker_h = worker_s / 3600
    total = Window.combined(windows)
    client_per_worker_h = {op: v / worker_h for op, v in sorted(total.requests.items()) if v}
    ledger = m["ledger"]
    ledger_h = s["workers"] * m["ledger_seconds"] / 3600

    def rate(p: str) -> float:
        """Requests per worker-hour for one purpose: the client's count of its operation,
        split by the ledger's share of that operation."""
        if p not in ledger:
            return 0.0
        op = ledger[p]["op"]
        of_op = sum(v["n"] for v in ledger.values() if v["op"] == op)
        return client_per_worker_h.get(f"dynamodb.{op}", 0.0) * ledger[p]["n"] / of_op

    # Sizes and units, from real items.
    sessions_spec, conn_spec = schema.sessions_table_spec("s"), schema.connections_table_spec("c")
    session_size = max(item_size(m["session_a"] or {}), item_size(m["session_b"] or {}))
    # A renewal writes the load (projected into the ring index) only when it changed since
    # the one before: that is a move's cost (connections taken or released in the window
    # change it), not a heartbeat's; what a heartbeat changes is compared without it.
    load = (schema.ACTIVE, schema.MAX_CONNECTIONS, schema.DRAINING)
    b_same_load = {**(m["session_b"] or {}), **{k: v for k, v in (m["session_a"] or {}).items() if k in load}}
    renew_index = index_writes(m["session_a"], b_same_load if m["session_b"] else None, index_spec(sessions_spec, schema.RING_INDEX))
    renew_wru = write_units(session_size) + renew_index
    owner_index = index_spec(conn_spec, schema.OWNER_INDEX)
    acquire_index = index_writes(m["free_item"], m["owned_item"], owner_index)
    r = m["releases"]
    handoff_index = index_writes(r["owned"], r["handed"], owner_index)
    give_up_index = index_writes(r["handed"], r["given_up"], owner_index)
    stop_index = index_writes(r["stop_owned"], r["stopped"], owner_index)
    release_wru = write_units(max(map(item_size, r.values())))
    checkpoint_index = index_writes(m["busy_first"], m["busy_last"], owner_index)
    conn_size = max(item_size(m["free_item"] or {}), item_size(m["owned_item"] or {}), item_size(m["busy_last"] or {}))
    conn_wru = write_units(conn_size)
    entries = m["index_entries"]
    entry_bytes = sum(map(item_size, entries)) / len(entries) if entries else 0.0
    watch_items = ledger["watch"]["items"] / ledger["watch"]["n"] if "watch" in ledger else 0.0
    msg_size = item_size(m["message_item"])
    msg_wru = write_units(msg_size)

    ops = [
        model.Op("renewal", "sessions", "", "own", renewals(total) / worker_h, wru=renew_wru),
        # Strongly consistent: 1 RRU per 4 KB of the item.
        model.Op("inbox", "sessions", "", "own", rate("inbox"), rru=2 * read_units_eventual(session_size)),
        model.Op("watch", "sessions", "", "own", rate("watch"),
                   rru=watch_items * read_units_eventual(session_size)),
        model.Op("ring", "sessions", schema.RING_INDEX, "ring", rate("ring"), rru=read_units_eventual(0)),
        model.Op("free scan", "connections", schema.OWNER_INDEX, "shards", rate("free scan"), rru=read_units_eventual(0)),
        model.Op("unowned count", "connections", schema.OWNER_INDEX, "shards", rate("unowned count"),
                   rru=read_units_eventual(0)),
        model.Op("audit", "connections", schema.OWNER_INDEX, "own", rate("audit"),
                   rru=read_units_eventual(int(per_worker * entry_bytes)), bytes_per_connection=entry_bytes),
        # The reachability sweep: one worker for the fleet Scans every connection item once
        # per SWEEP_SECONDS (its first pass waits a whole interval, so a window this short
        # sees none): priced from its design and real item sizes, as a worker's share of
        # the Scan. The sessions its pages name (a page of 200 spans a few workers: one
        # BatchGetItem of a few items) add about 0.05 RRU per connection-hour, left out.
        model.Op("sweep", "connections", "", "own", 3600 / t["sweep_s"], bytes_per_connection=conn_size),
    ]
    by = {op.purpose: op for op in ops}
    wru_ch = sum(op.wru * op.per_worker_hour for op in ops) / per_worker
    rru_ch = {op.purpose: op.rru_at(per_worker) * op.per_worker_hour / per_worker for op in ops}
    rru_total = sum(rru_ch.values())
    ddb_req_ch = sum(op.per_worker_hour for op in ops) / per_worker
    sqs_h = sum(v for k, v in client_per_worker_h.items() if k.startswith("sqs."))
    cw_h = client_per_worker_h.get("cloudwatch.PutMetricData", 0.0)
    fixed = {"sqs": sqs_h, "cloudwatch": cw_h}

    # Connections that receive frames: messages and checkpoints, per busy connection-hour.
    busy_h = s["busy"] * worker_s / len(windows) / 3600
    messages = total.counters["MessagesStored"]
    batches = total.ddb("BatchWriteItem")
    msgs_per_h = messages / busy_h if busy_h else 0.0
    # Checkpoints leave up to 25 in a TransactWriteItems: the ledger counts its items.
    ckpt_ledger = ledger.get("checkpoints", {"n": 0, "items": 0})
    ckpt = ckpt_ledger["items"]  # the ledger's window is the stats windows' (all workers)
    ckpt_per_h = ckpt / busy_h if busy_h else 0.0
    ckpt_fill = ckpt_ledger["items"] / ckpt_ledger["n"] if ckpt_ledger["n"] else None
    # A connection that keeps receiving frames checkpoints every CHECKPOINT_SECONDS; a window
    # a few of them long sees one or two per connection, so the price takes the steady rate.
    # A transactional write costs twice the units of a plain one.
    ckpt_steady = 3600 / t["checkpoint_s"]
    ckpt_wru = 2 * conn_wru + checkpoint_index
    busy_wru_ch = msgs_per_h * msg_wru + ckpt_steady * ckpt_wru
    kw = dict(shards=t["shards"], prices=PRICES, fixed_per_worker_hour=fixed)
    month = fleet(ops, connections=1000, per_worker=per_worker, **kw)["month"]
    month_busy = fleet(ops, connections=1000, per_worker=per_worker, message_wru_per_connection_hour=busy_wru_ch, **kw)["month"]
    before_busy = before.COST["month_holding_per_1000"] + msgs_per_h * 1000 * HOURS_PER_MONTH / 1e6 * PRICES["dynamodb_wru_per_million"]

    spread = {
        "renewals_per_worker_hour": median_spread(renewals(w) * 3600 / w.seconds for w in parts),
        "batch_requests_per_message": median_spread(
            w.ddb("BatchWriteItem") / w.counters["MessagesStored"] for w in parts if w.counters["MessagesStored"]),
    }

    def judged(value: float, target: float) -> str:
        return f"≤ {target:g}: {'met' if value <= target else 'MISSED'}"

    hb, rc = t["heartbeat_s"], t["reconcile_s"]
    service_metrics, worker_metrics = custom_metrics()
    window_s = (t["lease_s"] - 1.5 * hb) + t["skew_ms"] / 1000
    rows = [
        ["session renewals (UpdateItem) / worker-hour", fmt_spread(spread["renewals_per_worker_hour"], 0), "-",
         f"{before.COST['renewals_per_connection_hour']} per connection-hour",
         f"one per heartbeat ({hb:g} s) per worker, whatever it holds: {renewals(total) / worker_h / per_worker:.1f} per "
         f"connection-hour at {per_worker} per worker"],
        ["index writes per heartbeat", str(renew_index), "0: " + ("met" if renew_index == 0 else "MISSED"),
         f"{before.COST['index_writes_per_renewal']} per connection",
         f"{schema.RING_INDEX} keys (ring, session_id) and state unchanged between two reads of a session item "
         f"{m['ledger_seconds']:.0f} s apart; its load (active, max_connections, draining) is written only when it changed "
         "(a move's cost, not a heartbeat's)"],
        [f"WRU / connection-hour, holding ({per_worker} per worker)", fmt(wru_ch, 1), judged(wru_ch, TARGET_WRU),
         f"{before.COST['wru_per_connection_hour']:,}",
         f"session item {session_size} B -> {write_units(session_size)} WRU + {renew_index} index per renewal"],
        [f"RRU / connection-hour, holding ({per_worker} per worker)", fmt(rru_total, 1), judged(rru_total, TARGET_RRU),
         fmt(before.COST["rru_per_connection_hour"], 1), "the rows below"],
        ["- inbox", fmt(rru_ch["inbox"], 2), "", "-",
         f"{fmt(by['inbox'].per_worker_hour, 0)} GetItem / worker-hour of the worker's own session item between "
         f"renewals (strongly consistent, {by['inbox'].rru:g} each): a move named to it waits about "
         f"{INBOX_IDLE_POLL_S:g} s, not a heartbeat"],
        ["- watch", fmt(rru_ch["watch"], 2), "", "-",
         f"{fmt(by['watch'].per_worker_hour, 0)} BatchGetItem / worker-hour of {watch_items:.1f} sessions (0.5 each), "
         f"every 60-85 % of the {window_s:g} s watch window"],
        ["- free scan", fmt(rru_ch["free scan"], 2), "", "-",
         f"{fmt(by['free scan'].per_worker_hour, 0)} FREE# Queries / worker-hour ({t['shards']} per scan, every 75-100 % of "
         f"{rc:g} s), 0.5 each (free connections left: {m['free_left']})"],
        ["- audit", fmt(rru_ch["audit"], 2), "", "-",
         f"{fmt(by['audit'].per_worker_hour, 0)} own S# Queries / worker-hour, {per_worker} index entries of "
         f"{entry_bytes:.0f} B -> {by['audit'].rru_at(per_worker):g} RRU each"],
        ["- ring", fmt(rru_ch["ring"], 2), "", "-", f"{fmt(by['ring'].per_worker_hour, 0)} {schema.RING_INDEX} Queries / worker-hour, 0.5 each"],
        ["- UnownedConnections counts", fmt(rru_ch["unowned count"], 2), "", "-",
         f"{fmt(by['unowned count'].per_worker_hour, 0)} Queries / worker-hour ({t['shards']} per publish, keys only, "
         f"METRICS_SECONDS {t['metrics_s']:g}), 0.5 each"],
        ["- reachability sweep", fmt(rru_ch["sweep"], 2), "", "-",
         f"a Scan of every connection ({conn_size} B each) per SWEEP_SECONDS ({t['sweep_s']:g} s), by one worker for "
         "the fleet; priced from its design (the window is shorter than a pass)"],
        ["DynamoDB requests / connection-hour, holding", fmt(ddb_req_ch, 1), "-",
         fmt(before.COST["dynamodb_requests_per_connection_hour"], 1), f"renewal tries, inbox, watch, ring, free scan, audit, counts, / {per_worker}"],
        ["SQS + CloudWatch requests / connection-hour", f"{fmt(sqs_h / per_worker, 1)} + {fmt(cw_h / per_worker, 2)}", "-",
         f"{before.COST['sqs_requests_per_connection_hour']} + {before.COST['cloudwatch_requests_per_connection_hour']}",
         f"hint long polls ({sqs_h:.0f} / worker-hour) and CloudWatch calls ({cw_h:.0f} / worker-hour: the metrics are "
         f"EMF log lines, {metrics_cost.line_bytes():,} B each per METRICS_SECONDS), / {per_worker}"],
        ["per connection taken: requests, units", f"3: {2 * conn_wru + acquire_index + 2} WRU + 2 RRU", "-",
         "2: 3 WRU + 1 RRU", f"consistent read (BatchGetItem, 1 RRU), then a TransactWriteItems: the connection's Update "
         f"(2 x {conn_wru} WRU, transactional, + {acquire_index} index: owner_key moves) and the ConditionCheck that "
         "the acquirer's session is LIVE (2 WRU; one per transaction of up to 25); + the stored-end Query (strongly "
         "consistent, 1 RRU) unless the last owner released it cleanly"],
        ["per connection handed off (SIGTERM, a shed): requests, units", f"1: {release_wru + handoff_index} WRU", "-",
         "1 UpdateItem: 3 WRU", f"release UpdateItem at its fence ({release_wru} WRU + {handoff_index} index: it stays "
         "attached to its session, owner_key unmoved); the taker's transaction moves the key (per connection taken)"],
        ["per connection freed (a STOP; a handoff nobody took): requests, units",
         f"STOP 1: {release_wru + stop_index} WRU; not taken +1: {release_wru + give_up_index} WRU", "-",
         "1 UpdateItem: 3 WRU",
         f"a STOP's release UpdateItem ({release_wru} WRU + {stop_index} index: out of by_owner); a handoff not taken "
         f"within its wait, freed after the handoff's write ({release_wru} WRU + {give_up_index} index: into FREE#)"],
        ["checkpoints / connection-hour while frames arrive", fmt(ckpt_per_h, 0), f"≤ {ckpt_steady:g}",
         "in the renewals", f"CHECKPOINT_SECONDS {t['checkpoint_s']:g} (the window sees one or two per connection; the "
         f"price below takes {ckpt_steady:g}); in TransactWriteItems of {fmt(ckpt_fill, 1)} on average: "
         f"2 x {conn_wru} WRU (transactional) + {checkpoint_index} index each (last_seq is not projected)"],
        [f"DynamoDB requests / message at {s['rate_per_busy_connection']:g} msg/s", fmt_spread(spread["batch_requests_per_message"], 3),
         "-", "1.000", f"BatchWriteItem, {fmt(messages / batches if batches else None, 1)} messages per batch: the worker's "
         f"one writer fills batches across its connections (FLUSH_INTERVAL_MS {t['flush_ms']}), and the local upstream "
         "produces every stream's frames on one schedule, so they arrive together"],
        ["WRU / message", str(msg_wru), "-", str(before.COST["wru_per_message"]), f"message item {msg_size} B; no index"],
        ["$ / 1,000 connections / month, holding (requests)", fmt(month["total"], 2), "-", f"{before.COST['month_holding_per_1000']:,}",
         f"DynamoDB writes {fmt(month['dynamodb_writes'], 2)} + reads {fmt(month['dynamodb_reads'], 2)} + SQS "
         f"{fmt(month['sqs'], 2)} + CloudWatch metrics {fmt(month['cloudwatch'], 2)} (the workers' EMF lines ingested, "
         f"and the fleet's {service_metrics} custom metrics, ${service_metrics * PRICES['cloudwatch_custom_metric_month']:.2f}, "
         f"{worker_metrics} per worker)"],
        [f"$ / 1,000 connections / month, with messages ({s['rate_per_busy_connection']:g} msg/s each)", fmt(month_busy["total"], 0),
         "-", f"{before_busy:,.0f}", f"+ {msgs_per_h:,.0f} messages and {ckpt_steady:.0f} checkpoints per connection-hour"],
        ["$ / million messages (writes only, storage extra)", fmt(msg_wru * PRICES["dynamodb_wru_per_million"], 3), "-",
         fmt(before.COST["month_per_million_messages"], 3), "same units; batching saves requests, not units"],
    ]
    message_rate = s["rate_per_busy_connection"]
    markdown = "\n".join([
        md_table(["figure", "measured", "target", before.LABEL, "how"], rows),
        "",
        "The fleet at any size (every limit in steady state, a crash, a scale-in and a deploy) is BENCHMARKS.md's "
        "Scaling section: `wsfleet plan`'s output on these counts, rewritten by `python -m bench.scaling`.",
    ])
    notes = [
        f"{s['workers']} workers, {n} connections ({per_worker} per worker on average; MAX_CONNECTIONS {t['max_connections']}), "
        f"{s['busy']} of them receiving {message_rate:g} msg/s, the rest quiet; worker defaults otherwise: LEASE {t['lease_s']:g} s, HEARTBEAT {hb:g} s, RECONCILE "
        f"{rc:g} s, STATE_SHARDS {t['shards']}, METRICS_SECONDS {t['metrics_s']:g}, CHECKPOINT_SECONDS {t['checkpoint_s']:g}, "
        f"MAX_CLOCK_SKEW_MS {t['skew_ms']}, FLUSH_INTERVAL_MS {t['flush_ms']}.",
        f"Steady window: {s['intervals']} stats intervals per worker ({worker_s / len(windows):.0f} s per worker, "
        f"{len(parts)} sub-windows in all for medians and spreads); requests counted by the workers per operation (retries "
        "included): " + ", ".join(f"{k} {v}" for k, v in sorted(total.requests.items()) if v) + ".",
        "Split by the emulator's request ledger over the same period: " + ", ".join(
            f"{p} {v['n']}" for p, v in sorted(ledger.items())) + f" ({m['ledger_seconds']:.0f} s, all workers).",
        f"Prices: {PRICES['region']} on-demand, ${PRICES['dynamodb_wru_per_million']}/M WRU, "
        f"${PRICES['dynamodb_rru_per_million']}/M RRU, SQS ${PRICES['sqs_requests_per_million']}/M requests, "
        f"CloudWatch Logs ${PRICES['cloudwatch_logs_ingest_per_gb']}/GB ingested (the metrics' EMF lines), "
        f"${PRICES['cloudwatch_custom_metric_month']}/custom metric-month; month = {HOURS_PER_MONTH} h; "
        "check them before relying on them.",
    ]
    if not total.same_session:
        notes.append("A worker lost its session during the window (see its log): the figures include a new session's start.")
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    data = {
        "settings": s, "timings": t, "windows": [vars(w) for w in windows], "total": vars(total), "spread": spread,
        "client_per_worker_hour": client_per_worker_h, "ledger": ledger, "ledger_seconds": m["ledger_seconds"],
        "ledger_per_worker_hour": {p: v["n"] / ledger_h for p, v in ledger.items()},
        "sizes": {"session_item_bytes": session_size, "connection_item_bytes": conn_size, "message_item_bytes": msg_size,
                  "owner_index_entry_bytes": entry_bytes},
        "index_writes": {"renewal": renew_index, "acquire": acquire_index, "handoff": handoff_index,
                         "free_stop": stop_index, "free_give_up": give_up_index, "checkpoint": checkpoint_index},
        "ops": [vars(op) for op in ops],
        "per_connection_hour": {"wru_holding": wru_ch, "rru_holding": rru_ch, "rru_holding_total": rru_total,
                                "dynamodb_requests_holding": ddb_req_ch, "messages": msgs_per_h, "checkpoints": ckpt_per_h},
        "month_per_1000_connections": {"holding": month, "with_messages": month_busy},
        "prices": PRICES,
    }
    if not quick:
        # The CLI's `wsfleet plan` computes from these: the ops as measured, with provenance.
        measured = model.Measured(
            ops=tuple(ops),
            fixed_per_worker_hour=fixed,
            message_wru=msg_wru,
            checkpoint_wru=conn_wru + checkpoint_index,
            prices=PRICES,
            measured_with={"command": command, "commit": machine()["commit"], "date": machine()["date"], "timings": t,
                           "per_worker": per_worker, "workers": s["workers"]},
        )
        model.MEASURED_OPS.write_text(json.dumps(measured.as_json(), indent=1) + "\n")
        notes.append(f"Per-operation counts written to {model.MEASURED_OPS.name} (what `wsfleet plan` computes from).")
        # BENCHMARKS.md's Scaling section is the plan's output: rewritten from the new counts.
        if scaling.write():
            notes.append("BENCHMARKS.md's Scaling section rewritten from them (bench/scaling.py).")
        if sinks_plan.write():
            notes.append("BENCHMARKS.md's sinks plan table rewritten from them (bench/sinks_plan.py).")
    return Result("Cost", command, s, markdown, data, notes)
