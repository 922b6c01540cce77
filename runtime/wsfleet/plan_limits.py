"""Every limit a fleet of N connections meets, in steady state and in the bursts it must
survive (issue 22): DynamoDB partitions and table quotas, ECS and Fargate, subnet
addresses, NAT gateway connections, the API's rate; and what it all costs per month.
Pure arithmetic, no AWS calls, like :mod:`wsfleet.plan`, whose measured per-worker rates
it corrects where the benchmark's 3-worker fleet misled them:

* **workers** come from the stacks' target tracking (``target_per_worker``: the average
  ActiveConnections per task the service scales to), not from MAX_CONNECTIONS;
* **free scans**: each worker queries every ``FREE#`` shard, so a shard's load is
  W x the measured rate / the shards it was measured at (4), whatever STATE_SHARDS is;
* **the summarizer** (one worker for the fleet) reads the whole ``RING``, every session
  (BatchGetItem) and the ``FREE#`` shards to count the unowned, and writes the ``#fleet``
  item, once per pass: in a 3-worker benchmark that was a third of each worker's rate, so
  it is taken out of the per-worker ``ring`` and ``unowned count`` rates and priced once
  for the fleet, with read units that grow with the fleet;
* the ``#fleet`` item is read by every worker with every SUMMARY_EVERY-th watch read;
* a checkpoint is a transactional write: 2 write units (:attr:`plan.Measured.checkpoint_units`).

Scenarios (each limit is checked in one): ``steady``; ``crash``: 10 % of the workers die
and their connections are acquired by the others within ``CRASH_BURST_S`` (each acquire
moves a ``by_owner`` key: a delete and a put in the index); ``scale_in``: 10 % of the
workers drain, releasing into ``FREE#`` and acquired out of it (2 index writes in a
``FREE#`` shard per moved connection, 4 in the index), within ``SCALE_IN_BURST_S``;
``deploy``: a rolling deploy runs up to twice the tasks (max_healthy_percent 200).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from . import plan as planning
from .plan import HOURS_PER_MONTH, PARTITION_RCU, PARTITION_WCU, TABLE_QUOTA, Measured, Op

# --- AWS limits (default quotas and documented figures, December 2026) --------------------
ECS_TASKS_PER_SERVICE = 5000  # "Tasks per service" (adjustable)
# The ECS service scheduler launches about 500 tasks per minute per service; Fargate's own
# launch rate is a token bucket per account and Region (burst 100, sustained 20 tasks per
# second), so the service's rate is the one that binds for one service.
TASK_LAUNCHES_PER_MINUTE = 500
AWS_RESERVED_ADDRESSES = 5  # per subnet
NAT_CONNECTIONS_PER_DESTINATION = 55_000  # simultaneous, per NAT address, to one destination IP and port
DEPLOY_FACTOR = 2  # max_healthy_percent 200: a rolling deploy runs up to twice the tasks

# The adjustable quotas a plan may be given raised (``--quota NAME=VALUE``), at their defaults.
DEFAULT_QUOTAS = {
    "table_units": TABLE_QUOTA,  # on-demand read or write units per second, per table and per index
    "tasks_per_service": ECS_TASKS_PER_SERVICE,
    "task_launches_per_minute": TASK_LAUNCHES_PER_MINUTE,
}

# --- the bursts ----------------------------------------------------------------------------
CRASH_SHARE = 0.1
SCALE_IN_SHARE = 0.1
# A crash's connections are acquired within a few seconds of their session's end (the
# crash target is about 12 s p99 with a 10 s lease: the takeovers fit in what is left),
# and the tasks a scale-in stops release theirs within a few seconds of SIGTERM.
CRASH_BURST_S = 4.0
SCALE_IN_BURST_S = 4.0
# A crashed share must be relaunched within a minute (the scale-out cooldown).
RELAUNCH_WITHIN_S = 60.0
FILL_TARGET_S = 3600.0  # the plan expects N STARTs to fit in an hour at the API's rate

# --- the code's own constants and sizes the plan assumes -------------------------------------
RING_REFRESH_S = 15.0  # worker/takeover.py: a watcher re-reads its successors this often
SUMMARY_EVERY = 3  # worker/takeover.py: the #fleet item rides with every third watch read
BENCH_WORKERS = 3  # the cost benchmark's fleet (bench/cost.py), when measured_ops.json omits it
RING_ENTRY_BYTES = 100  # a by_ring entry (keys and projection), about
SESSION_ITEM_BYTES = 400  # a session item as the summarizer reads it, about
SUMMARY_ITEM_BYTES = 1500  # the #fleet item (counts and the largest few under / over), about
ACQUIRE_WRU = 1  # a connection item's update (it is under 1 KB)
OWNER_INDEX_WRITES_PER_MOVE = 2  # a by_owner key moved: a delete and a put

# --- prices (us-east-1, December 2026: check them before relying on them) ------------------
FARGATE_PRICES = {"vcpu_hour": 0.04048, "gb_hour": 0.004445, "spot_discount": 0.7}
NAT_PRICES = {"hour": 0.045, "gb": 0.045}
WS_FRAME_OVERHEAD_BYTES = 40  # TLS record and WebSocket header per frame, about


@dataclass(frozen=True)
class Check:
    name: str
    scenario: str  # steady | crash | scale_in | deploy
    used: float
    limit: float
    fix: str  # the setting or quota that moves it

    @property
    def ok(self) -> bool:
        return self.used <= self.limit

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "scenario": self.scenario, "used": self.used, "limit": self.limit, "ok": self.ok,
                "utilisation": self.used / self.limit if self.limit else math.inf, "fix": self.fix}


def workers_for(connections: int, settings: Mapping[str, Any], per_worker: int | None = None) -> int:
    """Tasks target tracking runs for ``connections``: their average ActiveConnections
    near the target (never fewer than min_workers)."""
    target = per_worker or settings["target_per_worker"]
    return max(settings["min_workers"], math.ceil(connections / target))


def corrected_ops(measured: Measured, workers: int) -> tuple[Op, ...]:
    """The measured ops with the summarizer's share taken out of the per-worker rates and
    priced once for a fleet of ``workers`` (see the module docstring)."""
    bench = int(measured.measured_with.get("workers", BENCH_WORKERS))
    ops: list[Op] = []
    passes_h = 0.0
    for op in measured.ops:
        if op.purpose == "ring":
            watcher_h = 3600 / RING_REFRESH_S
            passes_h = max(0.0, op.per_worker_hour * bench - watcher_h * bench)  # the summarizer's ring reads
            ops.append(Op("ring (watchers)", op.table, op.index, "ring", min(watcher_h, op.per_worker_hour), rru=op.rru))
            ring_rru = 0.5 * max(1, math.ceil(workers * RING_ENTRY_BYTES / 4096))
            ops.append(Op("ring (summarizer)", op.table, op.index, "ring", passes_h / workers, rru=ring_rru))
        elif op.purpose == "unowned count":
            # one worker counts for the fleet, every shard: per shard the measured share
            ops.append(Op("unowned count (summarizer)", op.table, op.index, "shards", op.per_worker_hour * bench / workers,
                          rru=op.rru))
        else:
            ops.append(op)
    session_rru = 0.5 * math.ceil(SESSION_ITEM_BYTES / 4096)
    ops.append(Op("summary: every session", "sessions", "", "fleet", passes_h, rru=session_rru * workers,
                  partition="(every session item, once)"))
    ops.append(Op("summary: #fleet write", "sessions", "", "fleet", passes_h, wru=math.ceil(SUMMARY_ITEM_BYTES / 1024),
                  partition="#fleet"))
    watch = next((op for op in measured.ops if op.purpose == "watch"), None)
    if watch is not None:
        reads_h = watch.per_worker_hour / SUMMARY_EVERY * workers
        ops.append(Op("summary: #fleet reads", "sessions", "", "fleet", reads_h, rru=0.5 * math.ceil(SUMMARY_ITEM_BYTES / 4096),
                      partition="#fleet"))
    return tuple(ops)


def evaluate(
    measured: Measured,
    settings: Mapping[str, Any],
    *,
    connections: int,
    rate: float = 0.0,
    per_worker: int | None = None,
    frame_bytes: int = 256,
    upstream_addresses: int = 1,
    quotas: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Workers, every limit in every scenario, the first one hit and $ per month for
    ``connections`` receiving ``rate`` frames/s of ``frame_bytes`` each, under
    ``settings`` (one of :data:`plan.ENVIRONMENTS`). ``upstream_addresses``: the
    distinct upstream IP:port the connections go to (1: all to one endpoint, the worst
    case for a NAT address). ``quotas``: :data:`DEFAULT_QUOTAS` raised. Optional
    settings a later stack may add: ``nat_addresses_per_gateway`` (1)."""
    q = {**DEFAULT_QUOTAS, **(quotas or {})}
    unknown = set(q) - set(DEFAULT_QUOTAS)
    if unknown:
        raise ValueError(f"unknown quota {sorted(unknown)[0]!r}: one of {', '.join(DEFAULT_QUOTAS)}")
    table_quota, tasks_quota, launches_quota = q["table_units"], q["tasks_per_service"], q["task_launches_per_minute"]
    target = per_worker or settings["target_per_worker"]
    workers = workers_for(connections, settings, target)
    held = connections / workers
    shards = settings["shards"]
    ops = corrected_ops(measured, workers)
    holding = planning.fleet(ops, connections=connections, per_worker=target, shards=shards, prices=measured.prices,
                             fixed_per_worker_hour=measured.fixed_per_worker_hour,
                             message_wru_per_connection_hour=measured.message_wru_per_connection_hour(rate, settings["checkpoint_s"]),
                             measured_shards=planning.measured_shards(measured, shards))
    holding["workers"] = workers  # min_workers may hold more than connections / target
    checks: list[Check] = []
    add = checks.append
    quota = "the account's on-demand table quota (Service Quotas: adjustable)"
    # steady: every partition and table
    for name, p in sorted(holding["partitions"].items()):
        if "(every" in name:  # spread over every session item: no one partition
            continue
        fix = _partition_fix(name)
        add(Check(f"partition {name}: reads", "steady", p["rru"], PARTITION_RCU, fix))
        if p["wru"]:
            add(Check(f"partition {name}: writes", "steady", p["wru"], PARTITION_WCU, fix))
    for name, t in sorted(holding["tables"].items()):
        add(Check(f"{name}: reads (table quota)", "steady", t["rru"], table_quota, quota))
        add(Check(f"{name}: writes (table quota)", "steady", t["wru"], table_quota, quota))
    steady_owner_w = holding["tables"].get("connections.by_owner", {}).get("wru", 0.0)
    steady_conn_w = holding["tables"].get("connections", {}).get("wru", 0.0)
    if rate:
        add(Check("partition messages CONN#<id> (one connection): writes", "steady", rate * measured.message_wru,
                  PARTITION_WCU, "the upstream's rate per connection: split it over connections"))
    add(Check("ECS tasks per service", "steady", workers, tasks_quota,
              "target_connections_per_worker (fewer, larger tasks), or the Tasks per service quota"))
    add(Check("max_workers (the service's scaling ceiling)", "steady", workers, settings["max_workers"], "max_workers"))
    nat_addresses = settings["nat_gateways"] * settings.get("nat_addresses_per_gateway", 1) * upstream_addresses
    add(Check("NAT connections per address to one destination", "steady", connections / nat_addresses,
              NAT_CONNECTIONS_PER_DESTINATION, "nat_gateways, or secondary addresses per NAT gateway"))
    fill_s = connections / settings["api_rate_limit"]
    add(Check("API rate: seconds to START every connection", "steady", fill_s, FILL_TARGET_S, "api_rate_limit"))
    start_w = 2 * settings["api_rate_limit"] / shards  # a START puts the FREE# entry, its acquire deletes it
    add(Check("partition connections.by_owner FREE#<shard> (each): writes, START at the API's rate", "steady",
              start_w, PARTITION_WCU, "state_shards"))
    # crash: 10 % of the workers die; the others acquire their connections
    crashed = math.ceil(workers * CRASH_SHARE)
    moved = min(connections, crashed * held)
    survivors = max(1, workers - crashed)
    acquires_s = moved / CRASH_BURST_S
    add(Check("connections.by_owner: writes (index quota)", "crash", steady_owner_w + OWNER_INDEX_WRITES_PER_MOVE * acquires_s,
              table_quota, "the index's write quota, or warm throughput sized for the burst"))
    add(Check("connections: writes (table quota)", "crash", steady_conn_w + ACQUIRE_WRU * acquires_s, table_quota, quota))
    add(Check("partition connections.by_owner S#<session> (a taker's): writes", "crash",
              OWNER_INDEX_WRITES_PER_MOVE / 2 * moved / survivors / CRASH_BURST_S, PARTITION_WCU, "-"))
    add(Check("connections per surviving worker", "crash", connections / survivors, settings["max_per_worker"],
              "target_connections_per_worker (more headroom below MAX_CONNECTIONS)"))
    add(Check("task launches per minute to replace the crashed", "crash", crashed * 60 / RELAUNCH_WITHIN_S,
              launches_quota, "target_connections_per_worker (fewer tasks)"))
    # scale-in: 10 % of the workers drain through FREE#
    drained = math.floor(workers * SCALE_IN_SHARE)
    moved_in = drained * held
    per_s = moved_in / SCALE_IN_BURST_S
    add(Check("partition connections.by_owner FREE#<shard> (each): writes", "scale_in", 2 * per_s / shards, PARTITION_WCU,
              "state_shards, or a release that hints named peers instead of passing through FREE#"))
    add(Check("connections.by_owner: writes (index quota)", "scale_in", steady_owner_w + 4 * per_s, table_quota,
              "the index's write quota, or warm throughput"))
    add(Check("connections: writes (table quota)", "scale_in", steady_conn_w + 2 * ACQUIRE_WRU * per_s, table_quota, quota))
    # deploy: up to twice the tasks
    per_subnet = 2 ** (32 - settings["worker_subnet_mask"]) - AWS_RESERVED_ADDRESSES
    add(Check("subnet addresses (task ENIs, 2x tasks during a deploy)", "deploy", DEPLOY_FACTOR * workers,
              per_subnet * settings["azs"], "the worker subnets' size (cidr_mask)"))
    add(Check("ECS tasks per service during a deploy", "deploy", DEPLOY_FACTOR * workers, tasks_quota,
              "the Tasks per service quota, or target_connections_per_worker"))
    limits = [c.as_json() for c in checks]
    over = [c for c in checks if not c.ok]
    first = max(over, key=lambda c: c.used / c.limit) if over else None
    month = _month(holding, settings, workers=workers, connections=connections, rate=rate, frame_bytes=frame_bytes)
    return {
        "env_settings": dict(settings),
        "connections": connections,
        "per_worker": target,
        "workers": workers,
        "limits": limits,
        "first_limit": first.name if first else None,
        "first_limit_scenario": first.scenario if first else None,
        "first_limit_fix": first.fix if first else None,
        "exceeded": [c.name + f" ({c.scenario})" for c in sorted(over, key=lambda c: -c.used / c.limit)],
        "usd_per_month": month["total"],
        "month": month,
        "deploy_minutes": workers / launches_quota,
        "quotas": q,
        "fill_seconds": fill_s,
        "tables": holding["tables"],
        "partitions": holding["partitions"],
    }


def _partition_fix(name: str) -> str:
    if "FREE#" in name:
        return "the free scans' rate (RECONCILE_SECONDS) or scanning fewer shards per pass; state_shards does not spread it"
    if "RING" in name or "#fleet" in name:
        return "the watchers' and summarizer's read rate (the summary carried in by_ring)"
    return "-"


def _month(holding: Mapping[str, Any], settings: Mapping[str, Any], *, workers: int, connections: int, rate: float,
           frame_bytes: int) -> dict[str, float]:
    """$ per month: DynamoDB, SQS, CloudWatch (plan.fleet), Fargate tasks, NAT gateways
    and the frames' bytes through them."""
    m = dict(holding["month"])
    task_h = settings["worker_cpu"] / 1024 * FARGATE_PRICES["vcpu_hour"] + settings["worker_memory_mib"] / 1024 * FARGATE_PRICES["gb_hour"]
    if settings.get("spot"):
        task_h *= 1 - FARGATE_PRICES["spot_discount"]
    m["fargate"] = workers * task_h * HOURS_PER_MONTH
    m["nat_hours"] = settings["nat_gateways"] * NAT_PRICES["hour"] * HOURS_PER_MONTH
    gb = connections * rate * (frame_bytes + WS_FRAME_OVERHEAD_BYTES) * 3600 * HOURS_PER_MONTH / 1e9
    m["nat_data"] = gb * NAT_PRICES["gb"]
    m["total"] = sum(v for k, v in m.items() if k != "total")
    return m
