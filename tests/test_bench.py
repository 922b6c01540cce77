"""The benchmarks run (``python -m bench <name> --quick``) and their arithmetic is right.

The four quick runs go in parallel, each in a process of its own with processes of
its own, so the smoke test stays short; nothing here depends on how fast the machine
is: it checks that each run finishes, prints its command and table, and writes its
raw JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import Stats, Window, distribution, md_table, median_spread, percentile
from bench.cost import attribute_size, item_size, month_cost, read_units_eventual, write_units

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("failover", "cost", "capacity", "ingestion")


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


def test_month_cost_scales_per_connection_and_per_task():
    one_wru_per_hour = month_cost(per_conn_hour={"wru": 1}, per_worker_hour={}, connections=1000)
    assert one_wru_per_hour["dynamodb_writes"] == pytest.approx(1000 * 730 / 1e6 * 0.625)
    per_task = month_cost(per_conn_hour={}, per_worker_hour={"sqs": 1e6 / 730}, connections=1000)
    assert per_task["sqs"] == pytest.approx(10 * 0.40)  # 10 tasks of 100 connections


def test_window_is_the_difference_of_two_stats_lines():
    def stats(ts, stored, updates, cpu):
        return Stats(ts, 5, {"MessagesStored": stored}, {"dynamodb.UpdateItem": updates}, 1.0, 2.0, 50.0, cpu)

    w = Window.between(stats(10.0, 100, 7, 1.5), stats(40.0, 400, 19, 2.0))
    assert (w.seconds, w.counters["MessagesStored"], w.ddb("UpdateItem"), w.ddb_total) == (30.0, 300, 12, 12)
    assert w.cpu_s == pytest.approx(0.5)


def test_md_table_formats_numbers_and_keeps_text():
    assert md_table(["a", "b"], [[1.234, "x"]]).splitlines()[2] == "| 1.23 | x |"


@pytest.mark.timeout(180)
def test_every_benchmark_runs_at_tiny_size_and_writes_its_results(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "bench", name, "--quick", "--out", str(tmp_path / name)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in BENCHMARKS
    }
    outputs = {name: p.communicate(timeout=170)[0] for name, p in procs.items()}
    for name, p in procs.items():
        out = outputs[name]
        assert p.returncode == 0, f"{name}:\n{out}"
        assert f"python -m bench {name} --quick" in out, out
        assert "|---|" in out, out
        (raw,) = (tmp_path / name).glob(f"{name}-*.json")
        data = json.loads(raw.read_text())
        assert data["name"] == name and data["quick"] is True and data["machine"]["nproc"] >= 1
