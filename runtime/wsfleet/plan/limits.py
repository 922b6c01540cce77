"""Every limit a fleet of N connections meets, in steady state and in the bursts it must
survive (issue 22): DynamoDB partitions and table quotas, ECS and Fargate, subnet
addresses, NAT gateway connections and addresses, the API's rate; and what it all costs
per month. Pure arithmetic, no AWS calls, on the measured per-worker rates as
:mod:`.corrections` corrects them, with **workers** from the stacks' target tracking
(``target_per_worker``: the average ActiveConnections per task the service scales to),
not from MAX_CONNECTIONS. A checkpoint and an acquisition are transactional writes: twice
their item's units (:attr:`.model.Measured.checkpoint_units`, ``ACQUIRE_WRU``).

Scenarios (each limit is checked in one): ``steady``; ``crash``: 10 % of the workers die
and their connections are acquired by the others within ``CRASH_BURST_S`` (each acquire
moves a ``by_owner`` key: a delete and a put in the index; each taker's count changes, so
its by_ring entry is rewritten: :mod:`.bursts` says how many a second at the peak);
``zone_lost``: one availability zone of two, half the workers, dies at once: what the
survivors cannot hold waits for replacements, and every connection must run again within
``ZONE_RECOVERY_S``; ``scale_in``: 10 % of the workers
drain within ``SCALE_IN_BURST_S``, each connection released at its fence while it stays
attached to the releasing session, and hinted to a named peer whose acquire moves its
by_owner key session to session (no ``FREE#`` write: ``HANDOFF_INDEX_WRITES_PER_MOVE``);
``deploy``: a rolling deploy runs up to twice the tasks (max_healthy_percent 200) and
hands every connection over, as fast as the service launches the new tasks (every
task's count changes: the old ones' fall, the new ones' rise).

A limit that no setting or quota moves past a ceiling (the NAT addresses one fleet's VPC
can have, each good for 55,000 connections to one destination) is a reason for another
fleet: ``cells`` says how many independent fleets the connections need (docs/scaling.md, "Beyond
one fleet: cells").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ..balance import RING_WRITE_EVERY
from ..leases import INBOX_POLL_S, sweep_pass_s
from ..settings_spec import SWEEP_SECONDS, VARIABLES
from .bursts import bursts
from .corrections import corrected_ops
from .fleet import fleet
from .model import HOURS_PER_MONTH, PARTITION_RCU, PARTITION_WCU, TABLE_QUOTA, TRANSACTION_FACTOR, Measured, measured_shards

# --- AWS limits (default quotas and documented figures, December 2026) --------------------
ECS_TASKS_PER_SERVICE = 5000  # "Tasks per service"
# The ECS service scheduler launches about 500 tasks per minute per service; Fargate's own
# launch rate is a token bucket per account and Region (burst 100, sustained 20 tasks per
# second), so the service's rate is the one that binds for one service.
TASK_LAUNCHES_PER_MINUTE = 500
AWS_RESERVED_ADDRESSES = 5  # per subnet
NAT_CONNECTIONS_PER_DESTINATION = 55_000  # simultaneous, per NAT address, to one destination IP and port
# A public NAT gateway takes up to 2 Elastic IP addresses by default (its primary and one
# secondary: "Elastic IP addresses per public NAT gateway", adjustable) and 8 at most; an
# account has 5 Elastic IP addresses per Region by default (adjustable).
NAT_ADDRESSES_PER_GATEWAY = 2
MAX_NAT_ADDRESSES_PER_GATEWAY = 8
EIPS_PER_REGION = 5
# One NAT gateway per AZ, and the stacks' VPC spans two: what one fleet's egress can be.
MAX_NAT_GATEWAYS = 2
DEPLOY_FACTOR = 2  # max_healthy_percent 200: a rolling deploy runs up to twice the tasks
# What a new on-demand table or index absorbs at once (its warm throughput) unless the
# stacks set more: read and write units per second. Beyond it, on-demand doubles its
# previous peak over about 30 minutes, far slower than a crash's burst.
DEFAULT_WARM_READS = 12_000
DEFAULT_WARM_WRITES = 4_000

# The adjustable quotas a plan may be given raised (an environment's ``quotas``, and
# ``--quota NAME=VALUE`` on top), at their defaults.
DEFAULT_QUOTAS = {
    "table_units": TABLE_QUOTA,  # on-demand read or write units per second, per table and per index
    "tasks_per_service": ECS_TASKS_PER_SERVICE,
    "task_launches_per_minute": TASK_LAUNCHES_PER_MINUTE,
    "eips_per_nat_gateway": NAT_ADDRESSES_PER_GATEWAY,
    "eips_per_region": EIPS_PER_REGION,
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
# A zone lost is recovered within a minute: every connection running again, those the
# survivors have no room for on replacements. Its acquisitions spread over what the
# minute leaves after the lease (nobody may take a session's connections before).
ZONE_RECOVERY_S = 60.0
FILL_TARGET_S = 3600.0  # the plan expects N STARTs to fit in an hour at the API's rate

# --- the code's own sizes the bursts assume (see :mod:`.corrections` for the rest) ----------
ACQUIRE_WRU = TRANSACTION_FACTOR * 1  # a connection item's update (under 1 KB), in a TransactWriteItems
ACQUIRE_RRU = 1  # the consistent read of the connection before its transaction (under 4 KB)
RELEASE_WRU = 1  # a graceful release: the item's update at its fence; its by_owner key stays
OWNER_INDEX_WRITES_PER_MOVE = 2  # a by_owner key moved: a delete and a put
# A handoff to a named peer moves the key once, from the releasing session's S# partition
# straight to the taker's: no FREE# entry is written or deleted.
HANDOFF_INDEX_WRITES_PER_MOVE = OWNER_INDEX_WRITES_PER_MOVE
# A renewal that carries a changed count rewrites the session's by_ring entry (the count
# is projected there), all of them in the one RING partition; a changed count is written
# at most every RING_WRITE_EVERY renewals (wsfleet.balance.ring_write_due), so a
# worker writes the RING at most once in that many heartbeats, however fast its count moves.
RING_WRITES_PER_CHANGED_RENEWAL = 1
# The reachability sweep's pass (worker/sweep.py): parallel segments of SWEEP_PAGE_ITEMS
# a second each, as many as fit a pass in half of SWEEP_SECONDS, up to SWEEP_MAX_SEGMENTS.
SWEEP_S = VARIABLES[SWEEP_SECONDS].default

# --- prices (us-east-1, December 2026: check them before relying on them) ------------------
# Fargate on Linux, per architecture: Graviton (arm64) costs 20 % less for the same task
# size; Fargate Spot runs only x86_64 tasks (70 % off), so an environment picks one or the
# other (ARCHITECTURES, and the stacks refuse spot with arm64).
FARGATE_PRICES = {
    "x86_64": {"vcpu_hour": 0.04048, "gb_hour": 0.004445},
    "arm64": {"vcpu_hour": 0.03238, "gb_hour": 0.00356},
    "spot_discount": 0.7,
}
ARCHITECTURES = ("arm64", "x86_64")
SPOT_ARCHITECTURE = "x86_64"
NAT_PRICES = {"hour": 0.045, "gb": 0.045}
EIP_HOUR = 0.005  # a public IPv4 address, per hour (a NAT gateway's primary one included)
WS_FRAME_OVERHEAD_BYTES = 40  # TLS record and WebSocket header per frame, about


@dataclass(frozen=True)
class Check:
    name: str
    scenario: str  # steady | crash | zone_lost | join | scale_in | deploy
    used: float
    limit: float
    fix: str  # the setting or quota that moves it
    # The most any setting or quota can raise ``limit`` to, where the load does not shrink
    # with another setting either (the NAT: its addresses have a most, and every
    # connection to one destination needs a port on one of them): beyond it, only another
    # fleet helps. None: a setting or a quota moves it as far as needed (a partition's
    # load shrinks with fewer, larger tasks; a table quota is raised).
    ceiling: float | None = None

    @property
    def ok(self) -> bool:
        return self.used <= self.limit

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "scenario": self.scenario, "used": self.used, "limit": self.limit, "ok": self.ok,
                "utilisation": self.used / self.limit if self.limit else math.inf, "fix": self.fix,
                "ceiling": self.ceiling}

    def sentence(self) -> str:
        """One line saying what is over, by how much, and what moves it."""
        return (f"{self.name} ({self.scenario}): {_figure(self.used)} needed, {_figure(self.limit)} available; "
                f"change {self.fix}")


def _figure(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:,.1f}"


def workers_for(connections: int, settings: Mapping[str, Any], per_worker: int | None = None) -> int:
    """Tasks target tracking runs for ``connections``: their average ActiveConnections
    near the target (never fewer than min_workers)."""
    target = per_worker or settings["target_per_worker"]
    return max(settings["min_workers"], math.ceil(connections / target))



def quotas_for(settings: Mapping[str, Any], quotas: Mapping[str, float] | None = None) -> dict[str, float]:
    """The quotas a plan assumes: the defaults, the environment's ``quotas`` (raised
    before deploying it), then ``quotas``. An unknown name is a ValueError naming it."""
    given = {**settings.get("quotas", {}), **(quotas or {})}
    unknown = set(given) - set(DEFAULT_QUOTAS)
    if unknown:
        raise ValueError(f"unknown quota {sorted(unknown)[0]!r}: one of {', '.join(DEFAULT_QUOTAS)}")
    return {**DEFAULT_QUOTAS, **given}


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
    ``settings`` (an environment, :func:`.environments.load`). ``upstream_addresses``: the
    distinct upstream IP:port the connections go to (1: all to one endpoint, the worst
    case for a NAT address). ``quotas``: raised on top of the environment's own
    (:func:`quotas_for`)."""
    q = quotas_for(settings, quotas)
    table_quota, tasks_quota, launches_quota = q["table_units"], q["tasks_per_service"], q["task_launches_per_minute"]
    target = per_worker or settings["target_per_worker"]
    workers = workers_for(connections, settings, target)
    held = connections / workers
    shards = settings["shards"]
    ops = corrected_ops(measured, workers)
    holding = fleet(ops, connections=connections, per_worker=target, shards=shards, prices=measured.prices,
                             fixed_per_worker_hour=measured.fixed_per_worker_hour,
                             message_wru_per_connection_hour=measured.message_wru_per_connection_hour(rate, settings["checkpoint_s"]),
                             measured_shards=measured_shards(measured, shards))
    holding["workers"] = workers  # min_workers may hold more than connections / target
    checks: list[Check] = []
    add = checks.append
    quota = "the account's on-demand table quota (Service Quotas: adjustable)"
    index_quota = "the account's on-demand table quota (it bounds each index too)"
    heartbeat_s = settings["heartbeat_s"]
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
    steady_conn_r = holding["tables"].get("connections", {}).get("rru", 0.0)
    if rate:
        add(Check("partition messages CONN#<id> (one connection): writes", "steady", rate * measured.message_wru,
                  PARTITION_WCU, "the upstream's rate per connection: split it over connections"))
    add(Check("ECS tasks per service", "steady", workers, tasks_quota,
              "target_connections_per_worker (fewer, larger tasks), or the Tasks per service quota"))
    add(Check("max_workers (the service's scaling ceiling)", "steady", workers, settings["max_workers"], "max_workers"))
    _nat_checks(add, settings, q, connections=connections, upstream_addresses=upstream_addresses)
    fill_s = connections / settings["api_rate_limit"]
    add(Check("API rate: seconds to START every connection", "steady", fill_s, FILL_TARGET_S, "api_rate_limit"))
    start_w = 2 * settings["api_rate_limit"] / shards  # a START puts the FREE# entry, its acquire deletes it
    add(Check("partition connections.by_owner FREE#<shard> (each): writes, START at the API's rate", "steady",
              start_w, PARTITION_WCU, "state_shards"))
    ring_fix = "heartbeat_seconds, or target_connections_per_worker (fewer, larger tasks)"
    ring_every_s = RING_WRITE_EVERY * heartbeat_s  # a worker writes the RING at most this often
    burst = bursts(workers=workers, per_worker=round(held), settings=settings, tasks_quota=tasks_quota,
                   launches_per_minute=launches_quota)
    inbox_fix = "schema.ASSIGNED_MAX (the inbox's length: what a move may add before the owner's renewal empties it)"
    add(Check("partition sessions.by_ring RING: writes, counts changed by STARTs at the API's rate", "steady",
              RING_WRITES_PER_CHANGED_RENEWAL * min(settings["api_rate_limit"], workers / ring_every_s), PARTITION_WCU,
              ring_fix))
    add(Check("reachability sweep: seconds for one pass (parallel segments)", "steady",
              sweep_pass_s(connections, sweep_s=SWEEP_S), SWEEP_S,
              "SWEEP_SECONDS (a pass fits half of it, up to 16 segments: 960,000 connections at 600 s)"))
    # crash: 10 % of the workers die; the others acquire their connections
    crashed = math.ceil(workers * CRASH_SHARE)
    moved = min(connections, crashed * held)
    survivors = max(1, workers - crashed)
    acquires_s = moved / CRASH_BURST_S
    owner_w = steady_owner_w + OWNER_INDEX_WRITES_PER_MOVE * acquires_s
    conn_w = steady_conn_w + ACQUIRE_WRU * acquires_s
    conn_r = steady_conn_r + ACQUIRE_RRU * acquires_s
    warm = "the connections table's warm throughput (connections_warm_throughput)"
    add(Check("connections.by_owner: writes (index quota)", "crash", owner_w, table_quota,
              index_quota))
    add(Check("connections.by_owner: writes absorbed at once (warm throughput)", "crash", owner_w,
              _warm(settings, "owner_index_warm", "write"), "the by_owner index's warm throughput (owner_index_warm_throughput)"))
    add(Check("connections: writes (table quota)", "crash", conn_w, table_quota, quota))
    add(Check("connections: writes absorbed at once (warm throughput)", "crash", conn_w,
              _warm(settings, "connections_warm", "write"), warm))
    add(Check("connections: reads absorbed at once (warm throughput)", "crash", conn_r,
              _warm(settings, "connections_warm", "read"), warm))
    add(Check("partition connections.by_owner S#<session> (a taker's): writes", "crash",
              OWNER_INDEX_WRITES_PER_MOVE / 2 * moved / survivors / CRASH_BURST_S, PARTITION_WCU, "-"))
    add(Check("partition sessions.by_ring RING: writes, the dead ended and the takers' counts changed", "crash",
              burst["crash"]["ring_writes_per_s"], PARTITION_WCU, ring_fix))
    add(Check("partition sessions <session> (a taker's item): writes, its inbox of moves filled", "crash",
              burst["crash"]["inbox_units_per_s"], PARTITION_WCU, inbox_fix))
    add(_inbox_reads(holding, survivors, "crash"))
    add(Check("connections per surviving worker", "crash", connections / survivors, settings["max_per_worker"],
              "target_connections_per_worker (more headroom below MAX_CONNECTIONS)"))
    add(Check("task launches per minute to replace the crashed", "crash", crashed * 60 / RELAUNCH_WITHIN_S,
              launches_quota, "target_connections_per_worker (fewer tasks)"))
    add(_inbox_reads(holding, max(1, workers - burst["zone_lost"]["dead"]), "zone_lost"))
    _zone_checks(add, burst["zone_lost"], settings, workers=workers, connections=connections, quota=quota,
                 table_quota=table_quota, steady_conn_w=steady_conn_w,
                 steady_owner_w=steady_owner_w, ring_fix=ring_fix, inbox_fix=inbox_fix)
    # join: 10 % more workers; the others shed to them
    add(Check("partition sessions.by_ring RING: writes, newcomers opening and the others shedding", "join",
              burst["join"]["ring_writes_per_s"], PARTITION_WCU, ring_fix))
    add(Check("partition sessions <session> (a newcomer's item): writes, its inbox of moves filled", "join",
              burst["join"]["inbox_units_per_s"], PARTITION_WCU, inbox_fix))
    # scale-in: 10 % of the workers hand theirs to named peers
    drained = math.floor(workers * SCALE_IN_SHARE)
    per_s = drained * held / SCALE_IN_BURST_S
    add(Check("connections.by_owner: writes (index quota)", "scale_in", steady_owner_w + HANDOFF_INDEX_WRITES_PER_MOVE * per_s,
              table_quota, index_quota))
    add(Check("partition sessions.by_ring RING: writes, the leavers and the takers' counts changed", "scale_in",
              burst["scale_in"]["ring_writes_per_s"], PARTITION_WCU, ring_fix))
    handoff_w = steady_conn_w + (RELEASE_WRU + ACQUIRE_WRU) * per_s
    add(Check("connections: writes (table quota)", "scale_in", handoff_w, table_quota, quota))
    add(Check("connections: writes absorbed at once (warm throughput)", "scale_in", handoff_w,
              _warm(settings, "connections_warm", "write"), warm))
    # deploy: up to twice the tasks; every connection handed over as the new tasks start
    per_subnet = 2 ** (32 - settings["worker_subnet_mask"]) - AWS_RESERVED_ADDRESSES
    add(Check("subnet addresses (task ENIs, 2x tasks during a deploy)", "deploy", DEPLOY_FACTOR * workers,
              per_subnet * settings["azs"], "the worker subnets' size (worker_subnet_mask)"))
    add(Check("ECS tasks per service during a deploy", "deploy", DEPLOY_FACTOR * workers, tasks_quota,
              "target_connections_per_worker (fewer, larger tasks), or the Tasks per service quota"))
    handed_s = min(workers, launches_quota) / 60 * held
    add(Check("connections.by_owner: writes (index quota)", "deploy",
              steady_owner_w + HANDOFF_INDEX_WRITES_PER_MOVE * handed_s, table_quota,
              index_quota))
    add(Check("partition sessions.by_ring RING: writes, tasks replaced and the takers' counts changed", "deploy",
              burst["deploy"]["ring_writes_per_s"], PARTITION_WCU, ring_fix))
    limits = [c.as_json() for c in checks]
    ranked = sorted((c for c in checks if not c.ok), key=lambda c: -c.used / c.limit)  # worst first
    first = ranked[0] if ranked else None
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
        "exceeded": [c.name + f" ({c.scenario})" for c in ranked],
        "refusals": [c.sentence() for c in ranked],
        "cells": _cells(checks),
        "usd_per_month": month["total"],
        "month": month,
        "deploy_minutes": workers / launches_quota,
        # The task the month's Fargate line prices (Spot runs only x86_64).
        "task": {"cpu": settings["worker_cpu"], "memory_mib": settings["worker_memory_mib"], "spot": bool(settings.get("spot")),
                 "architecture": SPOT_ARCHITECTURE if settings.get("spot") else settings["architecture"]},
        "quotas": q,
        "fill_seconds": fill_s,
        "tables": holding["tables"],
        "partitions": holding["partitions"],
    }


def _zone_checks(add: Any, zone: Mapping[str, Any], settings: Mapping[str, Any], *, workers: int, connections: int,
                 quota: str, table_quota: float, steady_conn_w: float, steady_owner_w: float,
                 ring_fix: str, inbox_fix: str) -> None:
    """An availability zone of two lost: half the workers dead at once (:mod:`.bursts`'s
    ``zone_lost``): the ring's writes at the peak, a taker's item and owner partition, the
    tables' writes to run every connection again within the minute, and how long what the
    survivors have no room for waits for replacements (their launches at the service's rate
    and a Fargate start: :mod:`.bursts`)."""
    most = settings["max_per_worker"]
    held = connections / workers
    add(Check("partition sessions.by_ring RING: writes, the dead ended and the takers' counts changed", "zone_lost",
              zone["ring_writes_per_s"], PARTITION_WCU, ring_fix))
    add(Check("partition sessions <session> (a taker's item): writes, its inbox of moves filled", "zone_lost",
              zone["inbox_units_per_s"], PARTITION_WCU, inbox_fix))
    room = min(held, max(0, most - held))  # what a survivor takes before the replacements run
    add(Check("partition connections.by_owner S#<session> (a taker's): writes", "zone_lost",
              OWNER_INDEX_WRITES_PER_MOVE / 2 * room / CRASH_BURST_S, PARTITION_WCU, "-"))
    per_s = zone["moved"] / (ZONE_RECOVERY_S - settings["lease_s"])
    warm = "the connections table's warm throughput (connections_warm_throughput)"
    conn_w = steady_conn_w + ACQUIRE_WRU * per_s
    add(Check("connections: writes to run every connection again within the minute (table quota)", "zone_lost",
              conn_w, table_quota, quota))
    add(Check("connections: writes absorbed at once (warm throughput)", "zone_lost", conn_w,
              _warm(settings, "connections_warm", "write"), warm))
    add(Check("connections.by_owner: writes absorbed at once (warm throughput)", "zone_lost",
              steady_owner_w + OWNER_INDEX_WRITES_PER_MOVE * per_s, _warm(settings, "owner_index_warm", "write"),
              "the by_owner index's warm throughput (owner_index_warm_throughput)"))
    add(Check("seconds until the connections the survivors cannot hold run on replacements", "zone_lost",
              zone["recovery_s"], ZONE_RECOVERY_S,
              "target_connections_per_worker (more headroom below MAX_CONNECTIONS), or max_connections_per_worker"))


def _inbox_reads(holding: Mapping[str, Any], survivors: int, scenario: str) -> Check:
    """Every survivor reading its session item between renewals while the dead sessions'
    moves come (``INBOX_POLL_S``; each its own item, so no partition is near its limit),
    on top of the sessions table's steady reads, against what a new on-demand table
    absorbs at once (the stacks set no warm throughput for the sessions table)."""
    steady = holding["tables"].get("sessions", {}).get("rru", 0.0)
    return Check("sessions: reads absorbed at once, every survivor reading its inbox between renewals (warm throughput)",
                 scenario, steady + survivors / INBOX_POLL_S, DEFAULT_WARM_READS,
                 "fewer, larger tasks (target_connections_per_worker): the stacks set no warm throughput for the sessions table")


def _warm(settings: Mapping[str, Any], key: str, kind: str) -> float:
    """The warm throughput the stacks give a table or index (``settings[key]``: read and
    write units per second), or a new on-demand table's."""
    given = settings.get(key) or {}
    return given.get(kind) or {"read": DEFAULT_WARM_READS, "write": DEFAULT_WARM_WRITES}[kind]


def _nat_addresses(settings: Mapping[str, Any]) -> int:
    """The NAT gateways' addresses in all: each gateway's primary and secondary ones."""
    return settings["nat_gateways"] * settings.get("nat_addresses_per_gateway", 1)


def _nat_checks(add: Any, settings: Mapping[str, Any], q: Mapping[str, float], *, connections: int,
                upstream_addresses: int) -> None:
    """NAT: connections per address to one destination, and the Elastic IP addresses the
    gateways take (per gateway and in the Region)."""
    per_gateway, addresses = settings.get("nat_addresses_per_gateway", 1), _nat_addresses(settings)
    most = MAX_NAT_GATEWAYS * MAX_NAT_ADDRESSES_PER_GATEWAY * NAT_CONNECTIONS_PER_DESTINATION
    add(Check("NAT connections per address to one destination", "steady", connections / (addresses * upstream_addresses),
              NAT_CONNECTIONS_PER_DESTINATION, "nat_gateways, or nat_addresses_per_gateway (secondary addresses)",
              most / addresses))
    add(Check("Elastic IP addresses per NAT gateway", "steady", per_gateway, q["eips_per_nat_gateway"],
              "the Elastic IP addresses per public NAT gateway quota", MAX_NAT_ADDRESSES_PER_GATEWAY))
    add(Check("Elastic IP addresses in the Region (the NAT gateways')", "steady", addresses, q["eips_per_region"],
              "the EC2-VPC Elastic IPs quota"))


def _cells(checks: list[Check]) -> dict[str, Any] | None:
    """How many independent fleets the connections need when a limit is over what any
    setting or quota can give (its ceiling), and which one; None when one fleet can
    hold them (perhaps with settings and quotas changed)."""
    beyond = [c for c in checks if c.ceiling is not None and c.used > c.ceiling]
    if not beyond:
        return None
    worst = max(beyond, key=lambda c: c.used / c.ceiling)
    return {"cells": math.ceil(worst.used / worst.ceiling), "limit": worst.name, "scenario": worst.scenario}


def _partition_fix(name: str) -> str:
    if "FREE#" in name:
        return "the free scans' rate (RECONCILE_SECONDS) or scanning fewer shards per pass; state_shards does not spread it"
    if "RING" in name or "#fleet" in name:
        return "the watchers' and summarizer's read rate (the summary carried in by_ring)"
    return "-"


def _month(holding: Mapping[str, Any], settings: Mapping[str, Any], *, workers: int, connections: int, rate: float,
           frame_bytes: int) -> dict[str, float]:
    """$ per month: DynamoDB, SQS, CloudWatch (:func:`.fleet.fleet`), Fargate tasks, NAT gateways,
    their public addresses and the frames' bytes through them."""
    m = dict(holding["month"])
    prices = FARGATE_PRICES[SPOT_ARCHITECTURE if settings.get("spot") else settings["architecture"]]
    task_h = settings["worker_cpu"] / 1024 * prices["vcpu_hour"] + settings["worker_memory_mib"] / 1024 * prices["gb_hour"]
    if settings.get("spot"):
        task_h *= 1 - FARGATE_PRICES["spot_discount"]
    m["fargate"] = workers * task_h * HOURS_PER_MONTH
    m["nat_hours"] = settings["nat_gateways"] * NAT_PRICES["hour"] * HOURS_PER_MONTH
    m["nat_addresses"] = _nat_addresses(settings) * EIP_HOUR * HOURS_PER_MONTH
    gb = connections * rate * (frame_bytes + WS_FRAME_OVERHEAD_BYTES) * 3600 * HOURS_PER_MONTH / 1e9
    m["nat_data"] = gb * NAT_PRICES["gb"]
    m["total"] = sum(v for k, v in m.items() if k != "total")
    return m
