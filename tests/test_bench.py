"""The benchmarks run (``python -m bench <name> --quick``) and their arithmetic is right.

The quick runs are ``make bench-smoke`` (CI runs it after ``make test``, which leaves them
out: together they took as long as the rest of the suite). Each quick run is a test of its own, in a process of its own with processes of its
own, so that ``make test`` spreads them over its workers; nothing here depends on how
fast the machine is: it checks that each run finishes, prints its command and table,
and writes its raw JSON.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from wsfleet import records
from wsfleet.plan.fleet import fleet
from wsfleet.plan.model import Op
from bench.common import Stats, Window, distribution, md_table, median_spread, percentile
from bench.cost import PRICES
from bench.units import attribute_size, index_writes, item_size, read_units_eventual, release_items, write_units
from bench.faults import session_loss
from bench.sinks import audit
from wsfleet import schema
from wsfleet.leases import SessionTiming

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("failover", "cost", "capacity", "ingestion", "faults", "rebalance", "pauses", "readapi", "largeframes", "amplification", "hostile", "sinks")


def test_percentile_interpolates_between_closest_ranks():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([], 50) is None
    assert distribution([3, 1, 2])["p50"] == 2 and distribution([3, 1, 2])["max"] == 3


def test_median_spread_is_half_the_range_relative_to_the_median():
    assert median_spread([9, 10, 11]) == {"n": 3, "median": 10, "min": 9, "max": 11, "spread_pct": 10.0}
    assert median_spread([None])["median"] is None


def test_item_size_follows_dynamodb_rules_for_strings_and_numbers():
    assert attribute_size("pk", "CONN#a") == 2 + 6
    assert attribute_size("n", 0) == 1 + 1 + 1
    assert attribute_size("n", 1234) == 1 + 2 + 1  # 4 digits: 2 bytes, plus 1
    assert attribute_size("n", 1000) == 1 + 1 + 1  # trailing zeros are not significant
    assert item_size({"pk": "x", "sk": 7}) == 3 + 4


def test_capacity_units_round_up_with_a_minimum():
    assert write_units(1) == 1 and write_units(1024) == 1 and write_units(1025) == 2
    assert read_units_eventual(0) == 0.5 and read_units_eventual(4097) == 1.0


def test_index_writes_follow_which_index_attributes_an_update_changes():
    by_owner = schema.connections_table_spec("t")["GlobalSecondaryIndexes"][0]
    by_ring = schema.sessions_table_spec("s")["GlobalSecondaryIndexes"][0]
    free = {"pk": "CONN#a", "owner_key": "FREE#1", "desired_state": "STARTED", "last_seq": 0}
    owned = {**free, "owner_key": "S#w1#1-ab"}
    session = {"session_id": "w1#1-ab", "ring": "RING", "expires_at_ms": 1000}

    assert index_writes(free, owned, by_owner) == 2  # the key moved: delete and put
    assert index_writes({**owned, "last_seq": 5}, {**owned, "last_seq": 9}, by_owner) == 0  # not projected
    assert index_writes(owned, {**owned, "desired_state": "STOPPED"}, by_owner) == 1  # projected: in place
    assert index_writes({k: v for k, v in free.items() if k != "owner_key"}, free, by_owner) == 1  # enters the sparse index
    assert index_writes(session, {**session, "expires_at_ms": 3500}, by_ring) == 0  # a renewal
    loaded = {**session, "state": "LIVE", "active": 10, "max_connections": 100, "draining": False}
    assert index_writes(loaded, {**loaded, "expires_at_ms": 3500, "heartbeat_at_ms": 3400}, by_ring) == 0  # same load
    assert index_writes(loaded, {**loaded, "active": 11}, by_ring) == 1  # the load the summary reads changed
    assert index_writes(None, None, by_ring) == 0


def test_release_rows_price_the_stores_own_writes(ddb):
    # What the cost table's handoff and free rows price, from items the store's real
    # writes leave in the emulator: a graceful handoff moves no index key, a handoff nobody
    # took is freed into FREE# (a delete and a put), a STOP's release leaves the index.
    by_owner = schema.connections_table_spec("t")["GlobalSecondaryIndexes"][0]
    r = release_items(ddb, "ws://127.0.0.1:9/s", shards=4, last_seq=123_456)
    assert r["handed"][schema.RELEASED_FENCE] == r["owned"][schema.FENCE_TOKEN] and r["handed"][schema.LAST_SEQ] == 123_456
    assert index_writes(r["owned"], r["handed"], by_owner) == 0
    assert r["given_up"][schema.OWNER_KEY].startswith(schema.OWNER_KEY_FREE_PREFIX)
    assert index_writes(r["handed"], r["given_up"], by_owner) == 2
    assert schema.OWNER_KEY not in r["stopped"] and r["stop_owned"][schema.DESIRED_STATE] == schema.STOPPED
    assert index_writes(r["stop_owned"], r["stopped"], by_owner) == 1
    assert max(map(write_units, map(item_size, r.values()))) == 1


def test_the_fleet_scales_per_worker_rates_onto_tables_and_shared_partitions():
    ops = [
        Op("renewal", "sessions", "", "own", 1440, wru=1),
        Op("free scan", "connections", "by_owner", "shards", 3600, rru=0.5),
        Op("ring", "sessions", "by_ring", "ring", 360, rru=0.5),
    ]
    f = fleet(ops, connections=10_000, per_worker=100, shards=4, prices=PRICES, fixed_per_worker_hour={"sqs": 1e6 / 730})

    assert f["workers"] == 100
    assert f["tables"]["sessions"]["wru"] == pytest.approx(100 * 1440 / 3600)
    assert f["partitions"]["connections.by_owner FREE#<shard> (each)"]["rru"] == pytest.approx(100 * 0.5 / 4)
    assert f["partitions"]["sessions.by_ring RING"]["rru"] == pytest.approx(100 * 0.05)
    assert f["binding"]["name"].startswith("partition connections.by_owner FREE#")
    assert f["binding"]["connections_at_limit"] == pytest.approx(10_000 * 3000 / 12.5)
    assert f["month"]["dynamodb_writes"] == pytest.approx(100 * 1440 * 730 / 1e6 * 0.625)
    assert f["month"]["sqs"] == pytest.approx(100 * 0.40)  # 100 workers, 1 M requests a month each


def test_reads_that_grow_with_what_a_worker_holds_round_up_per_4_kb():
    audit = Op("audit", "connections", "by_owner", "own", 120, rru=0.5, bytes_per_connection=70)
    assert audit.rru_at(50) == 0.5 and audit.rru_at(100) == 1.0 and audit.rru_at(200) == 2.0


def test_session_loss_is_every_try_failing_until_the_deadline():
    timing = SessionTiming(lease_ms=10_000, heartbeat_ms=2500, max_clock_skew_ms=1000)

    never = session_loss(0.0, timing, rng=random.Random(1), samples=200)
    always = session_loss(1.0, timing, rng=random.Random(1), samples=200)
    half = session_loss(0.5, timing, rng=random.Random(1), samples=200)

    twice = session_loss(0.5, timing, rng=random.Random(1), samples=200, client_retry=True)

    assert never["per_hour"] == 0 and always["per_cycle"] == 1 and always["per_hour"] == 1
    assert half["window_s"] == 6.5 and 40 <= half["tries_min"] <= half["tries_median"] <= 80
    assert half["per_cycle"] <= 0.5 ** half["tries_min"]
    assert twice["tries_median"] < half["tries_median"]  # botocore's 0-1 s backoff leaves fewer requests in time


def test_window_is_the_difference_of_two_stats_lines():
    def stats(ts, stored, updates, cpu, renewals, session="s1"):
        return Stats(ts, 5, {"MessagesStored": stored}, {"dynamodb.UpdateItem": updates}, 1.0, 2.0, 50.0, cpu,
                     session_id=session, renewals=renewals)

    w = Window.between(stats(10.0, 100, 7, 1.5, 3), stats(40.0, 400, 19, 2.0, 15))
    assert (w.seconds, w.counters["MessagesStored"], w.ddb("UpdateItem"), w.ddb_total) == (30.0, 300, 12, 12)
    assert w.cpu_s == pytest.approx(0.5) and w.renewals == 12 and w.same_session
    assert not Window.between(stats(0.0, 0, 0, 0.0, 1), stats(1.0, 0, 0, 0.0, 2, session="s2")).same_session
    both = Window.combined([w, w])
    assert (both.seconds, both.renewals, both.ddb("UpdateItem")) == (60.0, 24, 24)


def test_the_sinks_crash_audit_tells_takeover_duplicates_from_resends_and_finds_broken_rules():
    def rec(seq, fence, skip_to=None):
        return records.Record("c", seq, fence, "w", 0, skip_to is None, data=seq, skipped="upstream_gap" if skip_to else None,
                              skip_to=skip_to)

    # Owner 1 (fence 1) delivered 1-6, seq 3 twice (a resend); it had checkpointed 4.
    # Owner 2 (fence 2) resumed at 5: 5 and 6 again, then a marker for 7-8, then 9.
    clean = [rec(1, 1), rec(2, 1), rec(3, 1), rec(3, 1), rec(4, 1), rec(5, 1), rec(6, 1), rec(5, 2), rec(6, 2),
             rec(7, 2, skip_to=8), rec(9, 2)]
    a = audit(clean, checkpoint=4)
    assert (a["takeover_duplicates"], a["resent_duplicates"], a["takeover_at_or_below_checkpoint"]) == (2, 1, 0)
    assert (a["missing"], a["out_of_order"], a["lower_fence_after_higher"], a["first"], a["last"]) == (0, 0, 0, 1, 9)
    # The same with the checkpoint at 5: seq 5 again at a higher fence was at or below it.
    assert audit(clean, checkpoint=5)["takeover_at_or_below_checkpoint"] == 1
    broken = [rec(1, 2), rec(3, 2), rec(2, 2), rec(1, 1)]  # 2 after 3; fence 1 after 2
    b = audit(broken, checkpoint=0)
    assert (b["out_of_order"], b["lower_fence_after_higher"]) == (2, 1)
    assert audit([rec(1, 1), rec(4, 1)], checkpoint=0)["missing"] == 2


def test_md_table_formats_numbers_and_keeps_text():
    assert md_table(["a", "b"], [[1.234, "x"]]).splitlines()[2] == "| 1.23 | x |"


@pytest.mark.slow
@pytest.mark.bench_smoke
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_runs_at_tiny_size_and_writes_its_results(tmp_path, name):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])
    done = subprocess.run(
        # At a lower priority: nothing here is timed, and fleet tests beside it are.
        ["nice", "-n", "10", sys.executable, "-m", "bench", name, "--quick", "--out", str(tmp_path / name)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=170,
    )
    out = done.stdout
    assert done.returncode == 0, f"{name}:\n{out}"
    assert f"python -m bench {name} --quick" in out, out
    assert "|---|" in out, out
    (raw,) = (tmp_path / name).glob(f"{name}-*.json")
    data = json.loads(raw.read_text())
    assert data["name"] == name and data["quick"] is True and data["machine"]["nproc"] >= 1
