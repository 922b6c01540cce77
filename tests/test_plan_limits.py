"""The plan's limits (wsfleet.plan_limits): its arithmetic against a case computed by
hand, and what it says of prod at 500k and 1M connections with today's settings."""

from __future__ import annotations

import json

import pytest

from wsfleet import plan, plan_limits
from wsfleet.cli import main
from wsfleet.plan import Measured, Op

PRICES = {"region": "us-east-1", "dynamodb_wru_per_million": 1.0, "dynamodb_rru_per_million": 0.5,
          "sqs_requests_per_million": 0.0, "cloudwatch_put_metric_data_per_thousand": 0.0}

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
    "lease_s": 10, "spot": False,
}


def _by(result, scenario, name):
    return next(lim for lim in result["limits"] if lim["scenario"] == scenario and lim["name"] == name)


def test_the_limits_match_a_hand_computed_fleet():
    r = plan_limits.evaluate(MEASURED, SETTINGS, connections=10_000)
    # Workers: 10,000 / 100 (the target-tracking setting, not MAX_CONNECTIONS 200) = 100.
    assert r["workers"] == 100
    # FREE# shard, each: every worker queries every shard, so a shard takes the measured
    # 360/h / 4 shards measured at = 90/h from each of 100 workers: 2.5/s x 0.5 RRU = 1.25;
    # the unowned count is the summarizer's alone: 60/h x 3 bench workers = 180/h for the
    # fleet, / 4 shards = 45/h = 0.0125/s x 0.5 = 0.00625. Sum 1.25625.
    free = _by(r, "steady", "partition connections.by_owner FREE#<shard> (each): reads")
    assert free["used"] == pytest.approx(1.25625)
    # RING: watchers refresh every 15 s: 240/h x 100 workers = 6.667/s x 0.5 = 3.3333;
    # the summarizer's passes = what the 3 bench workers read beyond their refreshes:
    # 3 x 480 - 3 x 240 = 720/h = 0.2/s, each the whole ring: 100 entries x 100 B = 3 x 4 KB
    # pages' worth = 1.5 RRU: 0.3. Sum 3.6333.
    assert _by(r, "steady", "partition sessions.by_ring RING: reads")["used"] == pytest.approx(3.63333, rel=1e-4)
    # #fleet: read with every third watch read by 100 workers: 300/h x 100 = 8.333/s x 0.5 =
    # 4.1667 RRU/s; written once per pass: 720/h x 2 WRU (1.5 KB) = 0.4 WRU/s.
    assert _by(r, "steady", "partition sessions #fleet: reads")["used"] == pytest.approx(4.16667, rel=1e-4)
    assert _by(r, "steady", "partition sessions #fleet: writes")["used"] == pytest.approx(0.4)
    # Sessions table writes: 100 x 1,440/h = 40/s, + the #fleet's 0.4 = 40.4.
    assert _by(r, "steady", "sessions: writes (table quota)")["used"] == pytest.approx(40.4)
    # Crash of 10 %: 10 workers' 1,000 connections acquired within 4 s = 250/s, each a
    # by_owner key moved (2 index writes): 500/s; 1,000 / 90 survivors = 111.1 each.
    assert _by(r, "crash", "connections.by_owner: writes (index quota)")["used"] == pytest.approx(500)
    assert _by(r, "crash", "connections: writes (table quota)")["used"] == pytest.approx(250)
    assert _by(r, "crash", "connections per surviving worker")["used"] == pytest.approx(10_000 / 90)
    assert _by(r, "crash", "task launches per minute to replace the crashed")["used"] == 10
    # Scale-in of 10 %: 1,000 released into FREE# and acquired out of it within 4 s:
    # 250/s x 2 writes / 4 shards = 125 per shard; 4 index writes each: 1,000 in the index.
    assert _by(r, "scale_in", "partition connections.by_owner FREE#<shard> (each): writes")["used"] == pytest.approx(125)
    assert _by(r, "scale_in", "connections.by_owner: writes (index quota)")["used"] == pytest.approx(1000)
    # Deploy: 2 x 100 tasks against two /24 subnets of 256 - 5 addresses = 502.
    subnets = _by(r, "deploy", "subnet addresses (task ENIs, 2x tasks during a deploy)")
    assert (subnets["used"], subnets["limit"], subnets["ok"]) == (200, 502, True)
    # NAT: 10,000 connections to one destination through 1 address; API: 10,000 / 10 per s.
    assert _by(r, "steady", "NAT connections per address to one destination")["used"] == 10_000
    assert _by(r, "steady", "API rate: seconds to START every connection")["used"] == 1000
    # Only max_workers (50) is exceeded: 100 / 50.
    assert r["first_limit"] == "max_workers (the service's scaling ceiling)"
    assert [lim["name"] for lim in r["limits"] if not lim["ok"]] == [r["first_limit"]]
    # $: reads per second: sessions 25 (watch: 100 x 900/h x 1) + 10 (summary: 0.2/s x
    # 100 sessions x 0.5) + 4.1667 (#fleet) = 39.1667; by_ring 3.6333; by_owner 5 (free scan:
    # 100 x 360/h x 0.5, 4 shards as measured) + 0.025 (unowned: 180/h x 0.5) = 47.825 RRU/s;
    # writes 40.4 WRU/s. A month is 730 h = 2.628 M s: reads 125.68 M x $0.5 = 62.84, writes
    # 106.17 M x $1 = 106.17. Fargate: 100 x (0.25 vCPU x 0.04048 + 0.5 GB x 0.004445) x 730
    # = 901.00; one NAT gateway 0.045 x 730 = 32.85; no frames: no NAT data.
    m = r["month"]
    assert m["dynamodb_reads"] == pytest.approx(62.84, abs=0.01)
    assert m["dynamodb_writes"] == pytest.approx(106.17, abs=0.01)
    assert m["fargate"] == pytest.approx(901.00, abs=0.01)
    assert m["nat_hours"] == pytest.approx(32.85)
    assert r["usd_per_month"] == pytest.approx(62.84 + 106.17 + 901.00 + 32.85, abs=0.02)


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
    big = {**SETTINGS, "max_workers": 10_000, "worker_subnet_mask": 16, "shards": 64, "api_rate_limit": 1000}
    ecs = {"tasks_per_service": 30_000, "task_launches_per_minute": 2_000}
    r = plan_limits.evaluate(MEASURED, big, connections=1_000_000, upstream_addresses=20, quotas=ecs)
    # The scale-in: 100,000 moved in 4 s, 4 index writes each = 100,000/s, 2.5x 40,000.
    assert (r["first_limit"], r["first_limit_scenario"]) == ("connections.by_owner: writes (index quota)", "scale_in")
    # Then, each at 50,000/s: the crash's 25,000 acquires/s x 2 index writes, and the
    # scale-in's 2 table writes per moved connection.
    assert r["exceeded"][0] == "connections.by_owner: writes (index quota) (scale_in)"
    assert set(r["exceeded"][1:]) == {"connections: writes (table quota) (scale_in)",
                                      "connections.by_owner: writes (index quota) (crash)"}
    raised = plan_limits.evaluate(MEASURED, big, connections=1_000_000, upstream_addresses=20,
                                  quotas={**ecs, "table_units": 100_000})
    assert raised["first_limit"] is None
    with pytest.raises(ValueError, match="unknown quota 'tasks'"):
        plan_limits.evaluate(MEASURED, SETTINGS, connections=10, quotas={"tasks": 1})


def test_prod_today_does_not_hold_500k_and_names_what_binds(capsys):
    assert main(["plan", "--env", "prod", "--connections", "500000", "--json"], env={}) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == 3572  # 500,000 / 140, target tracking's setting
    assert {"name", "scenario", "used", "limit", "ok"} <= set(out["limits"][0])
    assert {lim["scenario"] for lim in out["limits"]} == {"steady", "crash", "scale_in", "deploy"}
    assert out["first_limit"] == "max_workers (the service's scaling ceiling)"
    over = {(lim["name"], lim["scenario"]) for lim in out["limits"] if not lim["ok"]}
    assert ("NAT connections per address to one destination", "steady") in over
    assert ("partition connections.by_owner FREE#<shard> (each): writes", "scale_in") in over
    assert out["usd_per_month"] > 0


def test_prod_with_the_settings_a_later_stack_would_need_holds_500k():
    # What the plan says prod needs for 500k: max_workers >= 3,572; NAT: 500,000 / 55,000
    # = 10 addresses (2 gateways x 5); scale-in: 2 x 12,500/s over 32 shards = 781 per
    # shard; the index's 50k writes/s and a deploy's 7,144 tasks need raised quotas.
    prod = {**plan.ENVIRONMENTS["prod"], "max_workers": 4000, "nat_addresses_per_gateway": 5, "shards": 32}
    r = plan_limits.evaluate(plan.load_measured(), prod, connections=500_000,
                             quotas={"table_units": 60_000, "tasks_per_service": 8_000})
    assert r["first_limit"] is None, r["exceeded"]
    assert all(lim["ok"] for lim in r["limits"])


def test_plan_in_tables_shows_the_limits_and_the_first_hit(capsys):
    assert main(["plan", "--env", "dev", "--connections", "1000000"], env={}) == 0
    out = capsys.readouterr().out
    assert "limits, 14,286 workers" in out
    assert "first limit hit: max_workers (the service's scaling ceiling) (steady); moved by: max_workers" in out


def test_plan_refuses_a_bad_quota_with_a_sentence(capsys):
    assert main(["plan", "--connections", "10", "--quota", "tasks_per_service=-1"], env={}) == 2
    assert "tasks_per_service: expected a positive number" in capsys.readouterr().err


def test_the_plan_mirrors_the_workers_own_constants():
    from wsfleet.worker import takeover

    # The summarizer's share is worked out from the watchers' ring refresh, and the #fleet
    # reads from how often a watch read carries it: the worker's figures, not a guess.
    assert plan_limits.RING_REFRESH_S == takeover.RING_REFRESH_S
    assert plan_limits.SUMMARY_EVERY == takeover.SUMMARY_EVERY
