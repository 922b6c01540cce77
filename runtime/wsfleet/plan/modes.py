"""Every way to keep the messages, priced side by side, and the cheapest that holds.

Five modes: the messages table on-demand or provisioned (with autoscaling's headroom),
the Kinesis stream on-demand or provisioned (shards sized from the rate), and Firehose
delivering to S3. Each is the sink's own bill for the frames: the holding fleet and the
checkpoints are the same under every mode and are priced with the fleet; a stream's
reader is apart (retrieval by one reader is counted where Kinesis bills it, on-demand;
the reference consumer's Lambda, objects and state writes are :mod:`.sinks`'s).

Each mode carries its checks: a hard limit over (one connection's shard or partition, a
setting of the environment's) rules it out; an adjustable quota over is named as one to
raise first. :func:`recommend` picks the cheapest mode that holds and says why in one
sentence; :func:`deployed` prices what the environment's settings deploy (its ``sink``,
``messages_capacity``, ``stream_mode`` and ``stream_shards``). Pure arithmetic, no AWS
calls, on :func:`.sinks.sinks`' packing and item sizes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .. import schema
from .environments import MESSAGES_CAPACITY_DEFAULTS, ON_DEMAND, PROVISIONED
from .limits import CRASH_BURST_S, CRASH_SHARE
from .model import HOURS_PER_MONTH, PARTITION_WCU
from .prices import (
    DYNAMODB_PROVISIONED_PRICES,
    KINESIS_PRICES,
    KINESIS_PROVISIONED_PRICES,
    PUT_PAYLOAD_UNIT_BYTES,
)
from .sinks import GB, PROVISIONED_SHARD_QUOTA, SHARD_WRITE_BYTES, SHARD_WRITE_RECORDS, kinesis_month

MONTH_S = HOURS_PER_MONTH * 3600
# Provisioned capacity is sized so that the steady rate uses this share of it: the rest
# absorbs what autoscaling (the table's, minutes behind) or a fixed shard count does not
# follow, and the uneven spread of connections over shards.
TARGET_UTILISATION = MESSAGES_CAPACITY_DEFAULTS["target_utilisation"]
MIN_UNITS = MESSAGES_CAPACITY_DEFAULTS["min_write_units"]
ACCOUNT_PROVISIONED_WCU = 80_000  # the account's provisioned write capacity in a Region (adjustable)
TAIL_READ_RRU = 0.5  # a new owner's read of a connection's stored end: one eventually consistent page

# Firehose's Direct PUT quotas per delivery stream in us-east-1, us-west-2 and eu-west-1
# (the Firehose quotas page, December 2026), each raised on request; a record's most.
FIREHOSE_WRITE_BYTES = 5 << 20
FIREHOSE_CALLS = 2_000
FIREHOSE_RECORDS = 500_000
FIREHOSE_ACTIVE_PARTITIONS = 500


def _mode(name: str, label: str, sink: str, capacity: str, month: Mapping[str, float], connections: int,
          checks: list[dict[str, Any]], detail: Mapping[str, Any]) -> dict[str, Any]:
    total = sum(month.values())
    hard = [c for c in checks if not c["ok"] and not c["adjustable"]]
    raise_first = [c for c in checks if not c["ok"] and c["adjustable"]]
    return {"mode": name, "label": label, "sink": sink, "capacity": capacity, "month": {**month, "total": total},
            "per_1000_connections": total / connections * 1000, "checks": checks, "holds": not hard,
            "over": [c["name"] for c in hard], "raise_first": [c["name"] for c in raise_first], **detail}


def _check(name: str, load: float, limit: float, unit: str, *, adjustable: bool, fix: str) -> dict[str, Any]:
    return {"name": name, "load": load, "limit": limit, "unit": unit, "ok": load <= limit, "adjustable": adjustable,
            "fix": fix}


def table_on_demand(p: Mapping[str, Any], *, wru_per_million: float, table_quota: float) -> dict[str, Any]:
    """The messages table on-demand: each frame's write units (one item per frame: the
    sink does not pack frames into items) and its storage for the message TTL."""
    t, per_s, rate = p["dynamodb"], p["connections"] * p["rate"], p["rate"]
    wru = t["wru_per_message"]
    month = {"writes": per_s * wru * MONTH_S / 1e6 * wru_per_million, "storage": t["month"]["storage"]}
    checks = [
        _check("one connection's table partition", rate * wru, PARTITION_WCU, "WRU/s", adjustable=False,
               fix="the upstream's rate per connection"),
        _check("the table's write quota", per_s * wru, table_quota, "WRU/s", adjustable=True,
               fix="the account's table quota (quotas.table_units)"),
    ]
    return _mode("table_on_demand", "table, on-demand", schema.SINK_DYNAMODB, ON_DEMAND, month, p["connections"], checks,
                 {"write_units_per_s": per_s * wru})


def table_provisioned(p: Mapping[str, Any], *, capacity: Mapping[str, Any] | None, table_quota: float) -> dict[str, Any]:
    """The messages table provisioned: write units for the rate at the target utilisation
    (autoscaling keeps it there, between the environment's bounds), read units for a
    crash's takeovers (each taker reads a connection's stored end, within seconds: faster
    than autoscaling), storage as on-demand. ``capacity``: the environment's
    ``messages_capacity`` (None: the defaults, sized freely)."""
    c = dict(capacity or {})
    target = c.get("target_utilisation", TARGET_UTILISATION)
    t, per_s, rate = p["dynamodb"], p["connections"] * p["rate"], p["rate"]
    wru = t["wru_per_message"]
    need_w = per_s * wru / target
    crash_reads = CRASH_SHARE * p["connections"] / CRASH_BURST_S * TAIL_READ_RRU
    lo_w, hi_w = c.get("min_write_units", MIN_UNITS), c.get("max_write_units", math.ceil(need_w))
    lo_r = c.get("min_read_units", max(MIN_UNITS, math.ceil(crash_reads)))
    wcu = min(max(math.ceil(need_w), lo_w), hi_w)
    month = {
        "writes": wcu * DYNAMODB_PROVISIONED_PRICES["wcu_hour"] * HOURS_PER_MONTH,
        "reads": lo_r * DYNAMODB_PROVISIONED_PRICES["rcu_hour"] * HOURS_PER_MONTH,
        "storage": t["month"]["storage"],
    }
    checks = [
        _check("one connection's table partition", rate * wru, PARTITION_WCU, "WRU/s", adjustable=False,
               fix="the upstream's rate per connection"),
        _check("the table's write quota", need_w, table_quota, "WCU", adjustable=True,
               fix="the account's table quota (quotas.table_units)"),
        _check("the account's provisioned write capacity", need_w, ACCOUNT_PROVISIONED_WCU, "WCU", adjustable=True,
               fix="the account-level write throughput quota"),
    ]
    if capacity is not None:  # the environment's bounds: a setting, so a hard limit of what it deploys
        checks += [
            _check("messages_capacity.max_write_units", need_w, hi_w, "WCU", adjustable=False,
                   fix="messages_capacity.max_write_units"),
            _check("messages_capacity.min_read_units (a crash's takeover reads)", crash_reads, lo_r, "RCU",
                   adjustable=False, fix="messages_capacity.min_read_units"),
        ]
    return _mode("table_provisioned", "table, provisioned", schema.SINK_DYNAMODB, PROVISIONED, month, p["connections"],
                 checks, {"write_units": wcu, "read_units": lo_r, "target_utilisation": target})


def _stream_rates(p: Mapping[str, Any], pack: str) -> tuple[float, float, float]:
    """Kinesis records/s, bytes/s and the mean record's size, as the workers pack them
    (``pack``: the sinks the writer flushes to, which sets its batch: :func:`.sinks.packing`)."""
    k = p["packing"][pack]
    per_s = p["connections"] * p["rate"]
    records_s = per_s * k["records_per_message"]
    bytes_s = per_s * k["bytes_per_message"]
    return records_s, bytes_s, (bytes_s / records_s if records_s else 0.0)


def _stream_checks(p: Mapping[str, Any], records_s: float, record_size: float) -> list[dict[str, Any]]:
    per_connection = records_s / p["connections"]
    shard_rate = min(SHARD_WRITE_RECORDS, SHARD_WRITE_BYTES / record_size) if record_size else SHARD_WRITE_RECORDS
    return [_check("one connection's shard", per_connection, shard_rate, "records/s", adjustable=False,
                   fix="the upstream's rate per connection")]


def stream_on_demand(p: Mapping[str, Any], *, pack: str = schema.SINK_KINESIS) -> dict[str, Any]:
    """The stream on-demand: each record rounded up to 1 KB, per GB in and per GB read by
    one reader, the stream-hours, retention past 24 h and the KMS key (:func:`.sinks.kinesis_month`)."""
    records_s, bytes_s, size = _stream_rates(p, pack)
    k = p["packing"][pack]
    billed_kb = k["billed_kb_per_message"] / k["records_per_message"] if k["records_per_message"] else 1.0
    m = kinesis_month(records_per_s=records_s, record_size=round(size) or 1, connections=p["connections"],
                      workers=p["workers"], retention_hours=p["retention_hours"], consumer=None, prices={},
                      billed_kb_per_record=billed_kb)
    month = dict(m["month"])
    month.pop("total")
    month["retrieval"] = m["gb_ingested_per_month"] * KINESIS_PRICES["retrieval_gb"]  # one reader
    checks = _stream_checks(p, records_s, size) + [
        _check("the on-demand stream's most (10 GB/s in us-east-1)", bytes_s, 10 * GB, "bytes/s", adjustable=False,
               fix="more streams"),
    ]
    return _mode("stream_on_demand", "stream, on-demand", schema.SINK_KINESIS, ON_DEMAND, month, p["connections"],
                 checks, {"records_per_s": records_s, "bytes_per_s": bytes_s, "gb_per_month": m["gb_ingested_per_month"]})


def shards_needed(records_s: float, bytes_s: float, target: float = TARGET_UTILISATION) -> int:
    """Shards a provisioned stream needs: 1 MB/s or 1,000 records/s each, whichever binds,
    kept at ``target`` of it (the headroom also covers the hash's uneven spread)."""
    return max(1, math.ceil(max(records_s / SHARD_WRITE_RECORDS, bytes_s / SHARD_WRITE_BYTES) / target))


def stream_provisioned(p: Mapping[str, Any], *, shards: int | None, shard_quota: float = PROVISIONED_SHARD_QUOTA,
                       kms: float, pack: str = schema.SINK_KINESIS) -> dict[str, Any]:
    """The stream provisioned: shard-hours (``shards``, the environment's, or as needed
    when None), each record's PUT payload units (25 KB each; the mean aggregate's size),
    retention past 24 h, and the KMS key and requests (``kms``, $ a month, as on-demand)."""
    records_s, bytes_s, size = _stream_rates(p, pack)
    need = shards_needed(records_s, bytes_s)
    have = need if shards is None else shards
    units = max(1, math.ceil(size / PUT_PAYLOAD_UNIT_BYTES))
    hours = p["retention_hours"]
    prices = KINESIS_PROVISIONED_PRICES
    month = {
        "shards": have * prices["shard_hour"] * HOURS_PER_MONTH,
        "put_payload_units": records_s * units * MONTH_S / 1e6 * prices["put_payload_units_per_million"],
        "retention": (have * prices["extended_retention_shard_hour"] * HOURS_PER_MONTH if hours > 24 else 0.0)
        + bytes_s * 3600 * max(0.0, hours - 168) / GB * prices["long_term_retention_gb_month"],
        "kms": kms,
    }
    checks = _stream_checks(p, records_s, size) + [
        _check("the account's shard quota", need, shard_quota, "shards", adjustable=True,
               fix="the Kinesis shard quota"),
    ]
    if shards is not None:
        checks.append(_check("stream_shards (the environment's)", max(records_s / SHARD_WRITE_RECORDS,
                             bytes_s / SHARD_WRITE_BYTES) / TARGET_UTILISATION, shards, "shards", adjustable=False,
                             fix=f"stream_shards ({need} at {TARGET_UTILISATION:.0%})"))
    return _mode("stream_provisioned", "stream, provisioned", schema.SINK_KINESIS, PROVISIONED, month, p["connections"],
                 checks, {"shards": have, "shards_needed": need, "records_per_s": records_s, "bytes_per_s": bytes_s,
                          "put_payload_units_per_record": units})


def firehose(p: Mapping[str, Any]) -> dict[str, Any]:
    """Firehose to S3 (Direct PUT, dynamic partitioning), as :func:`.firehose.firehose_month`
    priced it for :func:`.sinks.sinks` (``p["firehose"]``: one model of the delivery
    stream), with the delivery stream's quotas."""
    hose = p["firehose"]
    month = {k: v for k, v in hose["month"].items() if k != "total"}
    raise_quota = "Firehose's Direct PUT quotas of the delivery stream (on request), or more delivery streams"
    checks = [
        _check("a delivery stream's writes", hose["bytes_per_s"], FIREHOSE_WRITE_BYTES, "bytes/s", adjustable=True,
               fix=raise_quota),
        _check("a delivery stream's calls", hose["calls_per_s"], FIREHOSE_CALLS, "calls/s", adjustable=True,
               fix=raise_quota),
        _check("a delivery stream's records", hose["records_per_s"], FIREHOSE_RECORDS, "records/s", adjustable=True,
               fix=raise_quota),
        _check("active partitions", hose["partitions"], FIREHOSE_ACTIVE_PARTITIONS, "partitions", adjustable=True,
               fix="Firehose's active partitions quota"),
    ]
    per_s = p["connections"] * p["rate"]
    billed_s = per_s * hose["billed_kb_per_message"] * 1024
    return _mode("firehose", "Firehose to S3", schema.SINK_FIREHOSE, ON_DEMAND, month, p["connections"], checks,
                 {"record_bytes": hose["record_bytes"], "billed_bytes_per_message": billed_s / per_s if per_s else 0.0,
                  "gb_per_month": hose["gb_per_month"], "objects_per_s": hose["objects_per_s"],
                  "calls_per_s": hose["calls_per_s"]})


# --- all of them, the environment's, the cheapest -------------------------------------------


def compare(p: Mapping[str, Any], settings: Mapping[str, Any], *, wru_per_million: float,
            table_quota: float) -> dict[str, Any]:
    """Every mode priced freely (as the rate needs), what ``settings`` (an environment as
    the plan reads it) deploys, and the cheapest mode that holds (:func:`recommend`)."""
    on_demand = stream_on_demand(p)
    modes = [
        table_on_demand(p, wru_per_million=wru_per_million, table_quota=table_quota),
        table_provisioned(p, capacity=None, table_quota=table_quota),
        on_demand,
        stream_provisioned(p, shards=None, kms=on_demand["month"]["kms"]),
        firehose(p),
    ]
    return {"modes": modes, "recommended": recommend(modes, p),
            "deployed": deployed(p, settings, wru_per_million=wru_per_million, table_quota=table_quota)}


def deployed(p: Mapping[str, Any], settings: Mapping[str, Any], *, wru_per_million: float,
             table_quota: float) -> dict[str, Any]:
    """What the environment deploys for the messages, priced: for each of its sinks, the
    mode its settings choose (``messages_capacity.billing``; ``stream_mode`` with
    ``stream_shards``), the shards and the table's bounds as set, not as needed."""
    sinks = [s.strip() for s in settings["sink"].split(",") if s.strip()]
    # The writer's call is the smallest batch of its sinks: the table's 25 where the table is one.
    both = f"{schema.SINK_DYNAMODB},{schema.SINK_KINESIS}"
    pack = both if schema.SINK_DYNAMODB in sinks else schema.SINK_KINESIS
    parts = []
    for sink in sinks:
        if sink == schema.SINK_DYNAMODB:
            capacity = settings.get("messages_capacity")
            if capacity and capacity.get("billing") == PROVISIONED:
                parts.append(table_provisioned(p, capacity=capacity, table_quota=table_quota))
            else:
                parts.append(table_on_demand(p, wru_per_million=wru_per_million, table_quota=table_quota))
        elif sink == schema.SINK_KINESIS:
            on_demand = stream_on_demand(p, pack=pack)
            if settings.get("stream_mode") == PROVISIONED:
                parts.append(stream_provisioned(p, shards=settings.get("stream_shards"), kms=on_demand["month"]["kms"],
                                                pack=pack))
            else:
                parts.append(on_demand)
        else:
            parts.append(firehose(p))
    total = sum(m["month"]["total"] for m in parts)
    return {"modes": [m["mode"] for m in parts], "label": " + ".join(m["label"] for m in parts), "parts": parts,
            "total": total, "per_1000_connections": total / p["connections"] * 1000,
            "holds": all(m["holds"] for m in parts), "over": [o for m in parts for o in m["over"]],
            "raise_first": [r for m in parts for r in m["raise_first"]]}


def recommend(modes: list[Mapping[str, Any]], p: Mapping[str, Any]) -> dict[str, Any]:
    """The cheapest mode that holds (no hard limit over), and why, in one sentence."""
    per_s = p["connections"] * p["rate"]
    holding = sorted((m for m in modes if m["holds"]), key=lambda m: m["month"]["total"])
    out = [m for m in modes if not m["holds"]]
    ruled_out = "".join(f"; {m['label']} does not hold ({', '.join(m['over'])})" for m in out)
    if not holding:
        return {"mode": None, "why": f"no way to keep the messages holds at {per_s:,.0f} messages/s{ruled_out}"}
    best = holding[0]
    against = (f", against ${holding[1]['per_1000_connections']:,.2f} for the next, {holding[1]['label']}"
               if len(holding) > 1 else "")
    quotas = f"; raise first: {', '.join(best['raise_first'])}" if best["raise_first"] else ""
    why = (f"{best['label']}: the cheapest of the {len(holding)} ways to keep the messages that hold at "
           f"{per_s:,.0f} messages/s, ${best['per_1000_connections']:,.2f} per 1,000 connections a month"
           f"{against}{quotas}{ruled_out}")
    return {"mode": best["mode"], "label": best["label"], "per_1000_connections": best["per_1000_connections"],
            "why": why}


def whole_month(month: Mapping[str, float], chosen: Mapping[str, Any], *, on_demand_message_writes: float) -> dict[str, float]:
    """The fleet's month (:func:`.limits.evaluate`'s, which prices every frame as an
    on-demand table write: ``on_demand_message_writes`` $ of its DynamoDB writes) with the
    messages as the environment deploys them instead: one monthly total."""
    m = dict(month)
    m["dynamodb_writes"] -= on_demand_message_writes
    m["messages"] = chosen["total"]
    m["total"] = sum(v for k, v in m.items() if k != "total")
    return m
