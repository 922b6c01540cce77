"""The DynamoDB requests, capacity units and $ per month of a fleet, per table and per
hottest partition, from the measured ops (:mod:`.model`, corrected by
:mod:`.corrections`). Pure arithmetic, no AWS calls; ``wsfleet plan`` and ``make bench``
(``bench/cost.py``) both use it.

A partition serves at most 3,000 read units and 1,000 write units per second (one
partition key value of an index is one partition: it never splits further), and an
on-demand table (and each of its indexes) at most 40,000 of each per second by default
(an adjustable account quota). Every rate grows linearly with the fleet, so each limit is
reached at one fleet size: the smallest is the limit that binds first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import metrics_cost
from .corrections import corrected_ops
from .model import HOURS_PER_MONTH, PARTITION_RCU, PARTITION_WCU, TABLE_QUOTA, Measured, Op, measured_shards


@dataclass(frozen=True)
class Limit:
    name: str
    per_second: float
    load: float  # units per second on it at the fleet size computed


def fleet(
    ops: Sequence[Op],
    *,
    connections: int,
    per_worker: int,
    shards: int,
    prices: Mapping[str, float],
    fixed_per_worker_hour: Mapping[str, float],
    message_wru_per_connection_hour: float = 0.0,
    measured_shards: int | None = None,
) -> dict[str, Any]:
    """What a fleet holding ``connections`` at ``per_worker`` each sends, per table and
    per hottest partition, what it costs per month, and which limit it meets first.

    ``measured_shards``: the STATE_SHARDS the ``shards`` ops were measured at. Every
    worker queries every shard, so a shard takes W x rate / measured_shards whatever
    ``shards`` is, and the table W x rate x shards / measured_shards (without it, the old
    reading: the measured rate spread over ``shards``, which understated prod's 16 4x).

    ``fixed_per_worker_hour`` holds the worker's SQS requests per hour (its metrics are
    log lines: :mod:`.metrics_cost`);
    ``message_wru_per_connection_hour``, when given, adds the messages table's writes
    (and checkpoints) of connections that receive frames."""
    workers = math.ceil(connections / per_worker)
    tables: dict[str, dict[str, float]] = {}
    partitions: dict[str, dict[str, float]] = {}
    for op in ops:
        per_s = op.per_worker_hour / 3600
        rru, wru = op.rru_at(per_worker) * per_s, op.wru * per_s
        name = op.table + (f".{op.index}" if op.index else "")
        t = tables.setdefault(name, {"requests": 0.0, "rru": 0.0, "wru": 0.0})
        grow = shards / measured_shards if measured_shards and op.spread == "shards" else 1.0
        senders = 1 if op.spread == "fleet" else workers * grow
        t["requests"] += per_s * senders
        t["rru"] += rru * senders
        t["wru"] += wru * senders
        on_shard = workers / (measured_shards or shards)
        on_one = {"own": 1, "shards": on_shard, "ring": workers, "fleet": 1}[op.spread]
        key = f"{name} {_partition_label(op)}"
        p = partitions.setdefault(key, {"rru": 0.0, "wru": 0.0})
        p["rru"] += rru * on_one
        p["wru"] += wru * on_one
    if message_wru_per_connection_hour:
        t = tables.setdefault("messages", {"requests": 0.0, "rru": 0.0, "wru": 0.0})
        t["wru"] += message_wru_per_connection_hour * connections / 3600
    limits = [Limit(f"partition {k}: reads", PARTITION_RCU, v["rru"]) for k, v in partitions.items()]
    limits += [Limit(f"partition {k}: writes", PARTITION_WCU, v["wru"]) for k, v in partitions.items() if v["wru"]]
    limits += [Limit(f"{k}: reads (table quota)", TABLE_QUOTA, v["rru"]) for k, v in tables.items() if v["rru"]]
    limits += [Limit(f"{k}: writes (table quota)", TABLE_QUOTA, v["wru"]) for k, v in tables.items() if v["wru"]]
    binding = max(limits, key=lambda lim: lim.load / lim.per_second)
    month_h = HOURS_PER_MONTH
    dollars = {
        "dynamodb_writes": sum(t["wru"] for t in tables.values()) * 3600 * month_h / 1e6 * prices["dynamodb_wru_per_million"],
        "dynamodb_reads": sum(t["rru"] for t in tables.values()) * 3600 * month_h / 1e6 * prices["dynamodb_rru_per_million"],
        "sqs": fixed_per_worker_hour.get("sqs", 0) * workers * month_h / 1e6 * prices["sqs_requests_per_million"],
        # The metrics: EMF lines in the workers' logs (no PutMetricData; metrics_cost).
        "cloudwatch": metrics_cost.month(workers, prices)["total"],
    }
    dollars["total"] = sum(dollars.values())
    return {
        "connections": connections,
        "per_worker": per_worker,
        "workers": workers,
        "tables": tables,
        "partitions": partitions,
        "binding": {"name": binding.name, "utilisation": binding.load / binding.per_second,
                    "connections_at_limit": connections * binding.per_second / binding.load},
        "month": dollars,
    }


def _partition_label(op: Op) -> str:
    return {"own": "(one per worker)", "shards": "FREE#<shard> (each)", "ring": "RING", "fleet": op.partition}[op.spread]


def plan(measured: Measured, *, connections: int, per_worker: int, rate: float, shards: int, checkpoint_s: float) -> dict[str, Any]:
    """A fleet of ``connections`` at ``per_worker`` each, receiving ``rate`` messages per
    second per connection: holding and with messages (see :func:`fleet`), from the
    measured ops as :func:`.corrections.corrected_ops` corrects them."""
    kw = dict(shards=shards, prices=measured.prices, fixed_per_worker_hour=measured.fixed_per_worker_hour,
              measured_shards=measured_shards(measured, shards))
    ops = corrected_ops(measured, math.ceil(connections / per_worker))
    holding = fleet(ops, connections=connections, per_worker=per_worker, **kw)
    busy = fleet(
        ops,
        connections=connections,
        per_worker=per_worker,
        message_wru_per_connection_hour=measured.message_wru_per_connection_hour(rate, checkpoint_s),
        **kw,
    )
    return {"holding": holding, "with_messages": busy, "rate": rate, "measured_with": dict(measured.measured_with)}
