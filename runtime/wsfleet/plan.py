"""Capacity and cost plan: the fleet at any size, computed from the per-operation counts a
benchmark run measured. Pure arithmetic, no AWS calls; ``wsfleet plan`` and ``make bench``
(``bench/cost.py``) both use it.

The cost benchmark measures, per worker-hour, how many requests of each kind a worker
sends while holding (renewal, watch, ring, free scan, audit, UnownedConnections counts),
which table, index and partition each one reaches, and what each costs in capacity
units (from real item sizes); it writes them to ``measured_ops.json`` beside this module,
with the commit and command that measured them. Every one of those rates is per worker,
so a fleet of W workers sends W times as many; where they land decides what they load:

* ``own``: a partition of the worker's own (its session item, its ``S#<session>``
  partition of ``by_owner``), or of one of its ring successors: the load per partition
  is one worker's, whatever the fleet's size;
* ``shards``: the ``FREE#<shard>`` partitions of ``by_owner``, shared by every worker:
  W / STATE_SHARDS workers' load on each;
* ``ring``: the one ``RING`` partition of ``by_ring``: every worker's load on it;
* ``fleet``: sent by one worker for the whole fleet (the summarizer): its rate is the
  fleet's, whatever the fleet's size (see :mod:`wsfleet.plan_limits` for the ops whose
  units grow with it).

A partition serves at most 3,000 read units and 1,000 write units per second (one
partition key value of an index is one partition: it never splits further), and an
on-demand table (and each of its indexes) at most 40,000 of each per second by default
(an adjustable account quota). Every rate grows linearly with the fleet, so each limit is
reached at one fleet size: the smallest is the limit that binds first.
"""


from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

PARTITION_RCU = 3000  # read units per second per partition (eventually consistent 4 KB read = 0.5)
PARTITION_WCU = 1000
TABLE_QUOTA = 40000  # on-demand read or write units per second per table or index (default quota)
HOURS_PER_MONTH = 730
TRANSACTION_FACTOR = 2  # a write inside TransactWriteItems costs twice its units



@dataclass(frozen=True)
class Op:
    """One kind of request a worker sends while holding, as measured."""

    purpose: str  # "renewal", "watch", ...
    table: str  # "sessions" | "connections" | "messages"
    index: str  # "" for the table itself
    spread: str  # "own" | "shards" | "ring" | "fleet" (see the module docstring)
    per_worker_hour: float  # requests (spread "fleet": requests of the whole fleet, one worker's)
    wru: float = 0.0  # write units per request (index writes included)
    rru: float = 0.0  # read units per request
    # Read units that grow with the connections a worker holds (the audit reads every
    # index entry of its own partition): bytes per connection; 0 when it does not grow.
    bytes_per_connection: float = 0.0
    partition: str = ""  # spread "fleet": the partition it lands on, named

    def rru_at(self, per_worker: int) -> float:
        if not self.bytes_per_connection:
            return self.rru
        return 0.5 * max(1, math.ceil(per_worker * self.bytes_per_connection / 4096))


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

    ``fixed_per_worker_hour`` holds the worker's SQS and CloudWatch requests per hour;
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
        "cloudwatch": fixed_per_worker_hour.get("cloudwatch", 0) * workers * month_h / 1e3
        * prices["cloudwatch_put_metric_data_per_thousand"],
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


# --- the measured inputs ----------------------------------------------------------------

MEASURED_OPS = Path(__file__).with_name("measured_ops.json")

# The stacks' environments, as far as a plan needs them (app.py is the source; a stack
# test checks that these agree with it, and synth refuses settings whose plan at
# max_workers x target_per_worker exceeds a limit). ``quotas``: the adjustable quotas the
# environment needs raised before it is deployed (README, "Quotas to raise"); the
# ``*_warm`` figures: the warm throughput the stacks give the connections table and its
# by_owner index (None: a new on-demand table's).
ENVIRONMENTS = {
    "dev": {
        "max_per_worker": 100, "target_per_worker": 70, "shards": 4, "checkpoint_s": 120, "message_ttl_days": 3,
        "min_workers": 1, "max_workers": 4, "worker_cpu": 256, "worker_memory_mib": 512,
        "api_rate_limit": 20, "api_burst_limit": 40, "nat_gateways": 1, "nat_addresses_per_gateway": 1,
        "worker_subnet_mask": 20, "azs": 2, "lease_s": 10, "heartbeat_s": 2.5, "spot": True,
        "connections_warm": None, "owner_index_warm": None, "quotas": {},
    },
    "prod": {
        "max_per_worker": 350, "target_per_worker": 250, "shards": 16, "checkpoint_s": 120, "message_ttl_days": 30,
        "min_workers": 2, "max_workers": 2000, "worker_cpu": 512, "worker_memory_mib": 1024,
        "api_rate_limit": 200, "api_burst_limit": 400, "nat_gateways": 2, "nat_addresses_per_gateway": 5,
        "worker_subnet_mask": 20, "azs": 2, "lease_s": 10, "heartbeat_s": 2.5, "spot": False,
        "connections_warm": {"read": 15_000, "write": 40_000}, "owner_index_warm": {"read": 12_000, "write": 30_000},
        "quotas": {"eips_per_nat_gateway": 5, "eips_per_region": 10},
    },
}


@dataclass(frozen=True)
class Measured:
    """What one cost benchmark run measured, and where it came from."""

    ops: tuple[Op, ...]
    fixed_per_worker_hour: Mapping[str, float]  # SQS and CloudWatch requests
    message_wru: float  # write units per stored message
    checkpoint_wru: float  # write units per checkpoint (index writes included)
    prices: Mapping[str, float]
    measured_with: Mapping[str, Any]  # command, commit, date, timings

    @property
    def checkpoint_units(self) -> float:
        """Write units a checkpoint costs: the writer checkpoints in TransactWriteItems,
        and a transactional write costs twice the item's units (``checkpoint_wru`` is the
        item's plain units, as the cost benchmark measures them: 1, so 2 in all)."""
        return TRANSACTION_FACTOR * self.checkpoint_wru

    def message_wru_per_connection_hour(self, rate: float, checkpoint_s: float) -> float:
        """Write units of a connection receiving ``rate`` messages per second: its
        messages plus a checkpoint every ``checkpoint_s`` (none when quiet)."""
        if rate <= 0:
            return 0.0
        return rate * 3600 * self.message_wru + 3600 / checkpoint_s * self.checkpoint_units

    def as_json(self) -> dict[str, Any]:
        return {
            "ops": [vars(op) for op in self.ops],
            "fixed_per_worker_hour": dict(self.fixed_per_worker_hour),
            "message_wru": self.message_wru,
            "checkpoint_wru": self.checkpoint_wru,
            "prices": dict(self.prices),
            "measured_with": dict(self.measured_with),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Measured":
        return cls(
            ops=tuple(Op(**op) for op in d["ops"]),
            fixed_per_worker_hour=d["fixed_per_worker_hour"],
            message_wru=float(d["message_wru"]),
            checkpoint_wru=float(d["checkpoint_wru"]),
            prices=d["prices"],
            measured_with=d["measured_with"],
        )


def load_measured(path: Path | None = None) -> Measured:
    """The per-operation counts ``make bench`` last measured (shipped with the package)."""
    return Measured.from_json(json.loads((path or MEASURED_OPS).read_text()))


def plan(measured: Measured, *, connections: int, per_worker: int, rate: float, shards: int, checkpoint_s: float) -> dict[str, Any]:
    """A fleet of ``connections`` at ``per_worker`` each, receiving ``rate`` messages per
    second per connection: holding and with messages (see :func:`fleet`), from the
    measured ops as :func:`holding_ops` corrects them."""
    kw = dict(shards=shards, prices=measured.prices, fixed_per_worker_hour=measured.fixed_per_worker_hour,
              measured_shards=measured_shards(measured, shards))
    ops = holding_ops(measured, math.ceil(connections / per_worker))
    holding = fleet(ops, connections=connections, per_worker=per_worker, **kw)
    busy = fleet(
        ops,
        connections=connections,
        per_worker=per_worker,
        message_wru_per_connection_hour=measured.message_wru_per_connection_hour(rate, checkpoint_s),
        **kw,
    )
    return {"holding": holding, "with_messages": busy, "rate": rate, "measured_with": dict(measured.measured_with)}


def holding_ops(measured: Measured, workers: int) -> tuple[Op, ...]:
    """The measured ops with the summarizer's share priced once for ``workers``
    (:func:`wsfleet.plan_limits.corrected_ops`)."""
    from .plan_limits import corrected_ops  # it builds on this module

    return corrected_ops(measured, workers)


def measured_shards(measured: Measured, default: int) -> int:
    """The STATE_SHARDS the free scans were measured at."""
    return int(measured.measured_with.get("timings", {}).get("shards", default))


# --- large frames -------------------------------------------------------------------------
#
# Data over an item's inline limit (stream.MAX_MESSAGE_BYTES) is stored as an S3 object
# and a small pointer item (CONTRACT.md section 4). What one such frame costs, against
# what the same data would cost inline in the messages table where an item could hold it.

# S3 Standard, us-east-1 list prices (December 2026): check them before relying on them.
S3_PRICES = {"put_per_thousand": 0.005, "get_per_thousand": 0.0004, "gb_month": 0.023}
DYNAMODB_GB_MONTH = 0.25  # on-demand Standard table storage, us-east-1
ITEM_LIMIT_BYTES = 400 * 1024  # DynamoDB's item size limit
POINTER_ITEM_WRU = 1  # the pointer item (keys, data_ref, data_bytes, data_sha256, ...) is under 1 KB
DAYS_PER_MONTH = HOURS_PER_MONTH / 24


def large_frame_cost(size_bytes: int, *, prices: Mapping[str, float], retention_days: float, reads: int = 1) -> dict[str, Any]:
    """$ per million frames of ``size_bytes`` stored, kept ``retention_days`` (0: one
    month, as a floor for "kept forever") and read ``reads`` times each: through S3 (PUT
    + the pointer item's write, GETs of the presigned URL, storage), and inline in the
    messages table (write units of the whole item, the read API's Query reading it,
    storage) or None where an item cannot hold it. Data transfer out is extra in both."""
    gb = size_bytes / 1e9
    months = (retention_days or DAYS_PER_MONTH) / DAYS_PER_MONTH
    s3 = {
        "put": S3_PRICES["put_per_thousand"] * 1000,
        "pointer_item": POINTER_ITEM_WRU * prices["dynamodb_wru_per_million"],
        "reads": reads * (S3_PRICES["get_per_thousand"] * 1000 + 0.5 * prices["dynamodb_rru_per_million"]),
        "storage": gb * S3_PRICES["gb_month"] * months * 1e6,
    }
    s3["total"] = sum(s3.values())
    inline = None
    if size_bytes <= ITEM_LIMIT_BYTES:
        inline = {
            "write": math.ceil(size_bytes / 1024) * prices["dynamodb_wru_per_million"],
            "reads": reads * 0.5 * math.ceil(size_bytes / 4096) * prices["dynamodb_rru_per_million"],
            "storage": gb * DYNAMODB_GB_MONTH * months * 1e6,
        }
        inline["total"] = sum(inline.values())
    return {"bytes": size_bytes, "retention_days": retention_days, "reads": reads,
            "per_million_s3": s3, "per_million_inline": inline}


def large_frames_month(*, connections: int, rate: float, size_bytes: int, prices: Mapping[str, float],
                       retention_days: float, reads: int = 1) -> dict[str, Any]:
    """A fleet's large frames over a month: ``rate`` frames/s of ``size_bytes`` on each
    of ``connections``: their count, $ (see :func:`large_frame_cost`: storage at the
    steady state of ``retention_days``) and the S3 request rate the fleet sends."""
    per_s = rate * connections
    frames = per_s * 3600 * HOURS_PER_MONTH
    cost = large_frame_cost(size_bytes, prices=prices, retention_days=retention_days, reads=reads)
    return {
        "frames_per_month": frames,
        "puts_per_second": per_s,
        "stored_gb": per_s * 86400 * (retention_days or DAYS_PER_MONTH) * size_bytes / 1e9,
        "dollars_s3": frames / 1e6 * cost["per_million_s3"]["total"],
        "dollars_inline": None if cost["per_million_inline"] is None else frames / 1e6 * cost["per_million_inline"]["total"],
        "per_frame": cost,
    }


# --- upstream secrets ---------------------------------------------------------------------
#
# START's secret_headers name Secrets Manager secrets whose values the worker fetches
# (GetSecretValue) at connect time and keeps in a cache shared by its connections. What
# that costs: the API calls and the secrets themselves.

# Secrets Manager, us-east-1 list prices (December 2026): check them before relying on them.
SECRETS_PRICES = {"per_10k_calls": 0.05, "secret_month": 0.40}
# How long a worker reuses a fetched value for another connect. worker/secrets.py keeps the
# same figure: the two must match for the plan to price what the worker does.
SECRET_CACHE_SECONDS = 300
# How long a refused connection waits before it connects again (the worker's
# REFUSED_RETRY_S, jittered around it).
REFUSED_RETRY_SECONDS = 60


def distinct_secrets(secrets: int, per_worker: float) -> float:
    """How many of ``secrets`` a worker holding ``per_worker`` connections needs, on
    average, when each connection names one secret, all equally often, and connections
    land on workers regardless of their secret: each secret is missing from the worker
    with probability (1 - 1/secrets) ** per_worker."""
    if secrets <= 0:
        return 0.0
    return secrets * (1 - (1 - 1 / secrets) ** per_worker)


def cached_fetch_rate(connects_per_hour: float, cache_s: float) -> float:
    """Fetches per hour of one secret on one worker whose connections naming it connect
    ``connects_per_hour`` times an hour (at random times): a fetch serves every connect
    for ``cache_s``; the first connect after that fetches again, 1 / rate later on
    average. So one cycle is cache_s + 1 / rate: never more than one fetch per connect
    nor one per cache period."""
    if connects_per_hour <= 0:
        return 0.0
    return connects_per_hour / (1 + connects_per_hour * cache_s / 3600)


def cached_fetches_per_worker(held: int, secrets: int, reconnects_per_hour: float, cache_s: float) -> float:
    """Fetches per hour of a worker holding ``held`` connections, each naming one of
    ``secrets`` (equally often, regardless of the worker): n of them name a given secret
    with the binomial probability of n in ``held`` at 1 / ``secrets``, and those n connect
    n x ``reconnects_per_hour`` times an hour. The expectation over n, not the rate at the
    average n: the fetch rate flattens as connects grow, so the average would overstate
    it (by about 4 % at 100 connections on 30 secrets)."""
    if secrets <= 0 or held <= 0:
        return 0.0
    p = 1 / secrets
    per_secret = sum(
        math.comb(held, n) * p**n * (1 - p) ** (held - n) * cached_fetch_rate(n * reconnects_per_hour, cache_s)
        for n in range(1, held + 1)
    )
    return secrets * per_secret


def secrets_month(
    *,
    connections: int,
    per_worker: int,
    secrets: int,
    reconnects_per_hour: float,
    refused: int = 0,
    rotations_per_month: float = 1.0,
    cache_s: float = SECRET_CACHE_SECONDS,
    refused_retry_s: float = REFUSED_RETRY_SECONDS,
    prices: Mapping[str, float] = SECRETS_PRICES,
) -> dict[str, Any]:
    """Secrets Manager for ``connections`` (``per_worker`` on each worker) that name
    ``secrets`` distinct secrets, one each, and connect ``reconnects_per_hour`` times an
    hour each (reconnects, takeovers and handoffs): GetSecretValue calls and $ per month.

    * cached: per worker, :func:`cached_fetches_per_worker`;
    * refused: each of ``refused`` connections whose upstream keeps refusing it connects
      every ``refused_retry_s``, and each 401/403 fetches its secret again (once);
    * rotations: after a rotation, the first connect on each worker holding the secret
      may be refused with the old value and fetch it again (at most one per worker and
      secret: the new value is then in the shared cache).
    """
    workers = math.ceil(connections / per_worker)
    held = round(connections / workers)  # connections per worker, on average
    in_use = distinct_secrets(secrets, held)  # per worker
    calls_h = {
        "cached": workers * cached_fetches_per_worker(held, secrets, reconnects_per_hour, cache_s),
        "refused": refused * 3600 / refused_retry_s,
        "rotations": rotations_per_month * workers * in_use / HOURS_PER_MONTH,
    }
    calls_h["total"] = sum(calls_h.values())
    calls_month = calls_h["total"] * HOURS_PER_MONTH
    dollars = {
        "calls": calls_month / 10_000 * prices["per_10k_calls"],
        "secrets": secrets * prices["secret_month"],
    }
    dollars["total"] = dollars["calls"] + dollars["secrets"]
    connection_hours = connections * HOURS_PER_MONTH
    return {
        "connections": connections,
        "workers": workers,
        "secrets": secrets,
        "secrets_per_worker": in_use,
        "reconnects_per_hour": reconnects_per_hour,
        "refused": refused,
        "rotations_per_month": rotations_per_month,
        "cache_s": cache_s,
        "calls_per_hour": calls_h,
        "calls_per_month": calls_month,
        "calls_per_connection_hour": calls_h["total"] / connections,
        "month": dollars,
        "per_connection_hour": dollars["total"] / connection_hours,
    }
