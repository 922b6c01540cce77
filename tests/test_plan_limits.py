"""The plan's limits (wsfleet.plan.limits): its arithmetic against a case computed by
hand, and what it says of prod at 500k and 1M connections with its documented settings."""

from __future__ import annotations

import json
import math

import pytest

from wsfleet.plan import corrections, environments, model
from wsfleet.plan import limits as plan_limits
from wsfleet.cli import main
from wsfleet.plan.model import Measured, Op

PRICES = {"region": "us-east-1", "dynamodb_wru_per_million": 1.0, "dynamodb_rru_per_million": 0.5,
          "sqs_requests_per_million": 0.0, "cloudwatch_logs_ingest_per_gb": 0.0, "cloudwatch_custom_metric_month": 0.0}

# Round figures, measured (as bench/cost.py does) by 3 workers at STATE_SHARDS 4.
MEASURED = Measured(
    ops=(
        Op("renewal", "sessions", "", "own", 1440, wru=1),
        Op("watch", "sessions", "", "own", 900, rru=1),
        Op("ring", "sessions", "by_ring", "ring", 480, rru=0.5),
        Op("free scan", "connections", "by_owner", "shards", 360, rru=0.5),
        Op("unowned count", "connections", "by_owner", "shards", 60, rru=0.5),
    ),
    fixed_per_worker_hour={"sqs": 0, "cloudwatch": 0},
    message_wru=1,
    checkpoint_wru=1,
    prices=PRICES,
    measured_with={"timings": {"shards": 4}, "workers": 3},
)

SETTINGS = {
    "max_per_worker": 200, "target_per_worker": 100, "shards": 4, "checkpoint_s": 120, "message_ttl_days": 3,
    "min_workers": 1, "max_workers": 50, "worker_cpu": 256, "worker_memory_mib": 512,
    "api_rate_limit": 10, "api_burst_limit": 20, "nat_gateways": 1, "worker_subnet_mask": 24, "azs": 2,
    "lease_s": 10, "heartbeat_s": 2.5, "spot": False, "architecture": "x86_64",
}


def _by(result, scenario, name):
    return next(lim for lim in result["limits"] if lim["scenario"] == scenario and lim["name"] == name)


def test_the_limits_match_a_hand_computed_fleet():
    r = plan_limits.evaluate(MEASURED, SETTINGS, connections=10_000)
    # Workers: 10,000 / 100 (the target-tracking setting, not MAX_CONNECTIONS 200) = 100.
    assert r["workers"] == 100
    # FREE# shard, each: every worker queries every shard, so a shard takes the measured
    # 360/h (measured with the idle backoff, used as it is), / 4 shards measured at = 90/h
    # from each of 100 workers: 2.5/s x 0.5 RRU = 1.25; the unowned count is the
    # summarizer's alone: 60/h x 3 bench workers = 180/h for the fleet, / 4 shards = 45/h
    # = 0.0125/s x 0.5 = 0.00625. Sum 1.25625.
    free = _by(r, "steady", "partition connections.by_owner FREE#<shard> (each): reads")
    assert free["used"] == pytest.approx(1.25625)
    # RING: watchers refresh every 15 s: 240/h x 100 workers = 6.667/s x 0.5 = 3.3333;
    # the summarizer's passes = what the 3 bench workers read beyond their refreshes:
    # 3 x 480 - 3 x 240 = 720/h = 0.2/s, each the whole ring: 100 entries x 100 B = 3 x 4 KB
    # pages' worth = 1.5 RRU: 0.3. Sum 3.6333. No session item is read for the summary.
    assert _by(r, "steady", "partition sessions.by_ring RING: reads")["used"] == pytest.approx(3.63333, rel=1e-4)
    # #fleet: read with every third watch read by 100 workers: 300/h x 100 = 8.333/s x 1.5
    # (11.1 KB: its figures, 128 sessions under and 25 over their targets and 32 dead, each
    # an id and a number: three 4 KB thirds) = 12.5 RRU/s; written when it changed, every
    # pass at this size: 720/h x 11 WRU = 2.2 WRU/s.
    assert _by(r, "steady", "partition sessions #fleet: reads")["used"] == pytest.approx(12.5, rel=1e-4)
    assert _by(r, "steady", "partition sessions #fleet: writes")["used"] == pytest.approx(2.2)
    # Sessions table writes: 100 x 1,440/h = 40/s, + the #fleet's 2.2 = 42.2.
    assert _by(r, "steady", "sessions: writes (table quota)")["used"] == pytest.approx(42.2)
    # STARTs at the API's 10/s change 10 workers' counts a second (100 workers renew 40
    # times a second): 10 by_ring entries rewritten a second, all in the RING partition.
    ring_w = "partition sessions.by_ring RING: writes, counts changed by STARTs at the API's rate"
    assert _by(r, "steady", ring_w)["used"] == 10
    # Crash of 10 %: 10 workers' 1,000 connections acquired within 4 s = 250/s, each a
    # by_owner key moved (2 index writes): 500/s; each acquire a transactional update (2
    # WRU): 500/s, after a consistent read (1 RRU): 250/s; against the 4,000 writes and
    # 12,000 reads a new on-demand table absorbs at once. 1,000 / 90 survivors = 111.1
    # each. The ring at the peak: the 10 dead ended over a heartbeat (4/s), and the 90
    # takers' first changes (each takes 11: all 90 take) over a heartbeat and the 90/1,000
    # of one it takes a taker to get its first: 90 / (2.5 x 1.09) = 33.03/s.
    assert _by(r, "crash", "connections.by_owner: writes (index quota)")["used"] == pytest.approx(500)
    assert _by(r, "crash", "connections: writes (table quota)")["used"] == pytest.approx(500)
    warm = _by(r, "crash", "connections.by_owner: writes absorbed at once (warm throughput)")
    assert (warm["used"], warm["limit"]) == (pytest.approx(500), 4000)
    warm = _by(r, "crash", "connections: reads absorbed at once (warm throughput)")
    assert (warm["used"], warm["limit"]) == (pytest.approx(250), 12_000)
    assert _by(r, "crash", "connections per surviving worker")["used"] == pytest.approx(10_000 / 90)
    ring = _by(r, "crash", "partition sessions.by_ring RING: writes, the dead ended and the takers' counts changed")
    assert ring["used"] == pytest.approx(4 + 90 * (1 - math.exp(-1000 / 90)) / (2.5 * 1.09))
    assert _by(r, "crash", "task launches per minute to replace the crashed")["used"] == 10
    # Each of the 90 survivors reads its own session item 4 times a second while the moves
    # come (no partition near its limit: one item each): 360/s on top of the sessions
    # table's steady 37.5 (watch 25 + #fleet 12.5), against the 12,000 a new on-demand table
    # absorbs; a zone lost leaves 50 readers: 200/s.
    inbox = "sessions: reads absorbed at once, every survivor reading its inbox between renewals (warm throughput)"
    assert (_by(r, "crash", inbox)["used"], _by(r, "crash", inbox)["limit"]) == (pytest.approx(397.5, rel=1e-4), 12_000)
    assert _by(r, "zone_lost", inbox)["used"] == pytest.approx(237.5, rel=1e-4)
    # Scale-in of 10 %: 1,000 handed to named peers within 4 s = 250/s: each key moved
    # once, session to session (2 index writes, no FREE# entry): 500/s; the release (1 WRU)
    # and the taker's transactional acquire (2): 750 WRU/s.
    assert _by(r, "scale_in", "connections.by_owner: writes (index quota)")["used"] == pytest.approx(500)
    assert _by(r, "scale_in", "connections: writes (table quota)")["used"] == pytest.approx(750)
    assert not [lim for lim in r["limits"] if lim["scenario"] == "scale_in" and "FREE#" in lim["name"]]
    # Deploy: 2 x 100 tasks against two /24 subnets of 256 - 5 addresses = 502; the 100
    # new tasks start within a minute (the service launches 500 a minute), and each old
    # one hands its 100 over: 166.7 moves/s, 333.3 index writes/s.
    subnets = _by(r, "deploy", "subnet addresses (task ENIs, 2x tasks during a deploy)")
    assert (subnets["used"], subnets["limit"], subnets["ok"]) == (200, 502, True)
    assert _by(r, "deploy", "connections.by_owner: writes (index quota)")["used"] == pytest.approx(1000 / 3)
    # ... as ECS starts them (100 in 12 s of launch slots, give or take 10 s: 3.125/s), each
    # new one writes the ring twice (open, first renewal) and the old one it replaces three times
    # (draining, ENDED, leaving): 15.625/s; the old one's 100 hints a replacement, 312.5 a second,
    # change every one of the 200 tasks' counts, each entry written at most every 5 s: 40/s.
    ring = _by(r, "deploy", "partition sessions.by_ring RING: writes, tasks replaced and the takers' counts changed")
    assert ring["used"] == pytest.approx(55.625)
    # The sweep: 10,000 connections in one segment of 200 a second: 50 s, against 600.
    sweep = _by(r, "steady", "reachability sweep: seconds for one pass (parallel segments)")
    assert (sweep["used"], sweep["limit"]) == (50, 600)
    # NAT: 10,000 connections to one destination through 1 address (1 Elastic IP of the 5
    # a Region has by default); API: 10,000 / 10 per s.
    assert _by(r, "steady", "NAT connections per address to one destination")["used"] == 10_000
    assert _by(r, "steady", "Elastic IP addresses in the Region (the NAT gateways')")["limit"] == 5
    assert _by(r, "steady", "API rate: seconds to START every connection")["used"] == 1000
    # Only max_workers (50) is exceeded: 100 / 50; one fleet does it (no cells).
    assert r["first_limit"] == "max_workers (the service's scaling ceiling)"
    assert [lim["name"] for lim in r["limits"] if not lim["ok"]] == [r["first_limit"]]
    assert r["refusals"] == ["max_workers (the service's scaling ceiling) (steady): 100 needed, 50 available; "
                             "change max_workers"]
    assert r["cells"] is None
    # $: reads per second: sessions 25 (watch: 100 x 900/h x 1) + 12.5 (#fleet) = 37.5;
    # by_ring 3.6333; by_owner 5 (free scan: 100 x 360/h x 0.5) + 0.025 (unowned: 180/h x
    # 0.5) = 5.025: 46.1583 RRU/s; writes 42.2 WRU/s. A month is 730 h = 2.628 M s: reads
    # 121.30 M x $0.5 = 60.65, writes 110.90 M x $1 = 110.90. Fargate: 100 x
    # (0.25 vCPU x 0.04048 + 0.5 GB x 0.004445) x 730 = 901.00; one NAT gateway 0.045 x 730
    # = 32.85 and its address 0.005 x 730 = 3.65; no frames: no NAT data.
    m = r["month"]
    assert m["dynamodb_reads"] == pytest.approx(60.65, abs=0.01)
    assert m["dynamodb_writes"] == pytest.approx(110.90, abs=0.01)
    assert m["fargate"] == pytest.approx(901.00, abs=0.01)
    assert (m["nat_hours"], m["nat_addresses"]) == (pytest.approx(32.85), pytest.approx(3.65))
    assert r["usd_per_month"] == pytest.approx(60.65 + 110.90 + 901.00 + 32.85 + 3.65, abs=0.02)


def test_graviton_tasks_cost_a_fifth_less_and_spot_prices_x86_64():
    # arm64: 100 x (0.25 vCPU x 0.03238 + 0.5 GB x 0.00356) x 730 = 720.88; Fargate Spot
    # runs only x86_64 tasks: 901.00 x (1 - 0.7) = 270.30 whatever the file says.
    arm = plan_limits.evaluate(MEASURED, SETTINGS | {"architecture": "arm64"}, connections=10_000)["month"]["fargate"]
    spot = plan_limits.evaluate(MEASURED, SETTINGS | {"architecture": "arm64", "spot": True}, connections=10_000)["month"]["fargate"]
    assert (arm, spot) == (pytest.approx(720.875, abs=0.01), pytest.approx(270.30, abs=0.01))


def test_frames_through_the_nat_and_the_checkpoints_are_priced():
    r = plan_limits.evaluate(MEASURED, SETTINGS, connections=10_000, rate=1.0, frame_bytes=960)
    # 10,000 x 1 frame/s x (960 + 40 bytes of TLS and WebSocket framing) x 2.628 M s =
    # 26,280 GB x $0.045 = 1,182.60.
    assert r["month"]["nat_data"] == pytest.approx(1182.60)
    # The messages table: 10,000 x 1 WRU per frame, + a checkpoint per connection every
    # 120 s at 2 WRU (transactional) = 10,000 + 166.67 WRU/s.
    assert r["tables"]["messages"]["wru"] == pytest.approx(10_000 + 10_000 * 2 / 120)
    one = _by(r, "steady", "partition messages CONN#<id> (one connection): writes")
    assert one["used"] == 1 and one["ok"]


def test_a_raised_quota_moves_the_limit_it_names_and_an_unknown_one_is_refused():
    big = {**SETTINGS, "max_workers": 10_000, "worker_subnet_mask": 16, "shards": 64, "api_rate_limit": 1000,
           "heartbeat_s": 10, "connections_warm": {"read": 30_000, "write": 40_000},
           "owner_index_warm": {"read": 12_000, "write": 40_000}}
    ecs = {"tasks_per_service": 30_000, "task_launches_per_minute": 2_000}
    r = plan_limits.evaluate(MEASURED, big, connections=1_000_000, upstream_addresses=20, quotas=ecs)
    # 10,000 workers: a crash's 9,000 survivors reading their inboxes 4 times a second are
    # 36,000 reads a second of the sessions table, 3x what a new table absorbs at once (a
    # zone's 5,000: 20,000), the first limit; no quota moves it, fewer workers do.
    inbox = "sessions: reads absorbed at once, every survivor reading its inbox between renewals (warm throughput)"
    assert (r["first_limit"], r["first_limit_scenario"]) == (inbox, "crash")
    assert r["exceeded"][:2] == [f"{inbox} (crash)", f"{inbox} (zone_lost)"]
    # The scale-in: 100,000 handed over in 4 s = 25,000/s, 3 WRU each = 75,000/s in the
    # table, 1.875x 40,000; then the crash's 25,000 acquires/s at 2 WRU and 2 index writes:
    # 50,000/s each, and the scale-in's 2 index writes per move.
    assert set(r["exceeded"][2:4]) == {"connections: writes (table quota) (scale_in)",
                                       "connections: writes absorbed at once (warm throughput) (scale_in)"}
    assert set(r["exceeded"][4:]) == {"connections: writes (table quota) (crash)",
                                      "connections: writes absorbed at once (warm throughput) (crash)",
                                      "connections.by_owner: writes (index quota) (crash)",
                                      "connections.by_owner: writes absorbed at once (warm throughput) (crash)",
                                      "connections.by_owner: writes (index quota) (scale_in)",
                                      # and 10,000 workers' ring: 1,000 leavers writing three times and
                                      # 9,000 takers within a heartbeat; a deploy's replacements and takers
                                      "partition sessions.by_ring RING: writes, the leavers and the takers' "
                                      "counts changed (scale_in)",
                                      "partition sessions.by_ring RING: writes, tasks replaced and the takers' "
                                      "counts changed (deploy)"}
    # The environment's own quotas count, and one given to the plan goes on top of them.
    raised = plan_limits.evaluate(MEASURED, {**big, "quotas": {"table_units": 60_000}}, connections=1_000_000,
                                  upstream_addresses=20, quotas={**ecs, "table_units": 100_000})
    assert raised["quotas"]["table_units"] == 100_000
    assert not [e for e in raised["exceeded"] if "quota" in e]
    with pytest.raises(ValueError, match="unknown quota 'tasks'"):
        plan_limits.evaluate(MEASURED, SETTINGS, connections=10, quotas={"tasks": 1})
    with pytest.raises(ValueError, match="unknown quota 'eips'"):
        plan_limits.evaluate(MEASURED, {**SETTINGS, "quotas": {"eips": 9}}, connections=10)


def test_prod_as_documented_holds_500k(capsys):
    assert main(["plan", "--env", "prod", "--connections", "500000", "--json"], env={}) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == 296  # 500,000 / 1,690, target tracking's setting
    assert {"name", "scenario", "used", "limit", "ok"} <= set(out["limits"][0])
    assert {lim["scenario"] for lim in out["limits"]} == {"steady", "crash", "zone_lost", "join", "scale_in", "deploy"}
    assert out["first_limit"] is None, out["exceeded"]
    assert all(lim["ok"] for lim in out["limits"])
    # With the quotas prod lists raised: 2 NAT gateways x 5 Elastic IPs.
    assert out["quotas"]["eips_per_nat_gateway"] == 5 and out["quotas"]["eips_per_region"] == 10
    assert out["usd_per_month"] > 0


def test_prod_at_1m_names_the_first_limit_its_fix_and_the_cells_it_needs(capsys):
    assert main(["plan", "--env", "prod", "--connections", "1000000", "--json"], env={}) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["first_limit"], out["first_limit_fix"]) == ("max_workers (the service's scaling ceiling)", "max_workers")
    # 1M to one destination through at most 2 gateways x 8 addresses x 55,000 = 880,000:
    # no setting or quota lets one fleet's NAT hold it.
    assert out["cells"] == {"cells": 2, "limit": "NAT connections per address to one destination", "scenario": "steady"}
    spread = plan_limits.evaluate(model.load_measured(), environments.load("prod"), connections=1_000_000,
                                  upstream_addresses=2)
    assert spread["cells"] is None  # two upstream addresses: 500,000 each


def test_plan_in_tables_shows_the_limits_and_the_first_hit(capsys):
    assert main(["plan", "--env", "dev", "--connections", "1000000"], env={}) == 0
    out = capsys.readouterr().out
    assert "limits, 14,286 workers" in out
    assert "first limit hit: max_workers (the service's scaling ceiling) (steady); moved by: max_workers" in out
    assert "one fleet cannot hold this whatever its settings and quotas: NAT connections per address" in out


def test_plan_refuses_a_bad_quota_with_a_sentence(capsys):
    assert main(["plan", "--connections", "10", "--quota", "tasks_per_service=-1"], env={}) == 2
    assert "tasks_per_service: expected a positive number" in capsys.readouterr().err


def test_the_plan_mirrors_the_workers_own_constants():
    from wsfleet.worker import takeover

    # The summarizer's share is worked out from the watchers' ring refresh, and the #fleet
    # reads from how often a watch read carries it: the worker's figures, not a guess.
    assert corrections.RING_REFRESH_S == takeover.RING_REFRESH_S
    assert corrections.SUMMARY_EVERY == takeover.SUMMARY_EVERY


def test_msgs_per_s_is_the_rate(capsys):
    # The issue names `--msgs-per-s R`; `--rate R` stays, the same option.
    runs = []
    for flag in ("--msgs-per-s", "--rate"):
        assert main(["plan", "--env", "prod", "--connections", "20000", flag, "0.5", "--json"], env={}) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0] == runs[1] and runs[0]["rate"] == 0.5
    assert runs[0]["month"]["nat_data"] > 0
