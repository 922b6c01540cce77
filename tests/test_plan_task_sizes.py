"""The task size and the connections per task, from what a worker was measured to cost
(wsfleet.plan.task_sizes), and prod's file holding the plan's pick."""

from __future__ import annotations

import json

import pytest

from wsfleet import budget
from wsfleet.cli import main
from wsfleet.plan import environments, model, task_sizes

MIB = 1 << 20
FRAME = 32 * MIB


def test_what_a_task_holds_by_cpu_and_by_memory_by_hand():
    # 0.5 msg/s: 0.5 x 0.463 ms + 0.061 s / 3600 = 0.24845 ms of loop a second per
    # connection; 60 % of 0.5 vCPU / 0.00024845 = 1,207. Memory: (1,024 MiB - the decoder's
    # reserve of 32 + 6 x 32 = 224 MiB) / 2 = 400 MiB for the process, 80 % of it less
    # 68 MB idle = 267,436,851 bytes / 27,000 = 9,905.
    fit = task_sizes.per_task(512, 1024, rate=0.5, max_frame_bytes=FRAME)
    assert budget.decoder_reserve_bytes(FRAME) == 224 * MIB
    assert fit["by_cpu"] == 1207
    assert fit["by_memory"] == int((0.8 * 400 * MIB - 68_000_000) // 27_000)
    assert (fit["capacity"], fit["bound"], fit["target"]) == (1207, "cpu", 844)


def test_the_loop_uses_one_vcpu_however_many_the_task_has_and_no_more_than_was_measured():
    one = task_sizes.per_task(1024, 4096, rate=0.5, max_frame_bytes=FRAME)
    two = task_sizes.per_task(2048, 4096, rate=0.5, max_frame_bytes=FRAME)
    assert one["by_cpu"] == two["by_cpu"]
    quiet = task_sizes.per_task(1024, 4096, rate=0.0, max_frame_bytes=FRAME)
    assert quiet["by_cpu"] > 5_000 and quiet["by_memory"] > 5_000
    assert (quiet["capacity"], quiet["bound"]) == (5_000, "measured")


def test_a_size_the_frame_decoders_reserve_fills_holds_nothing_and_is_not_picked():
    fit = task_sizes.per_task(256, 512, rate=0.0, max_frame_bytes=64 * MIB)  # reserve 32 + 7 x 64 = 480 MiB
    assert fit["by_memory"] == 0 and fit["target"] == 0
    settings = environments.load("prod", {})
    chosen = task_sizes.choose(model.load_measured(), {**settings, "max_frame_bytes": 64 * MIB}, connections=10_000,
                               rate=0.0, max_frame_bytes=64 * MIB)
    small = chosen["sizes"][0]
    assert (small["cpu"], small["memory_mib"], small["ok"]) == (256, 512, False) and "holds no connection" in small["why_not"]
    assert chosen["picked"]["memory_mib"] > 512


def test_the_pick_is_the_cheapest_size_that_passes_every_limit():
    chosen = task_sizes.choose(model.load_measured(), environments.load("prod", {}), connections=500_000, rate=0.5,
                               max_frame_bytes=FRAME)
    passing = [r for r in chosen["sizes"] if r["ok"]]
    assert chosen["picked"] in passing
    assert chosen["picked"]["usd_per_1000"] == min(r["usd_per_1000"] for r in passing)
    # A larger task than the loop can use only costs more.
    by_size = {(r["cpu"], r["memory_mib"]): r for r in chosen["sizes"]}
    assert by_size[(2048, 4096)]["usd_per_1000"] > by_size[(1024, 4096)]["usd_per_1000"]
    assert "cheapest all-in" in chosen["why"] and "bound by the event loop's CPU" in chosen["why"]


def test_prods_file_holds_the_plans_pick_at_its_design_rate():
    # environments/prod.toml says it was chosen at 500,000 connections and 0.5 msg/s.
    prod = environments.load("prod", {})
    picked = task_sizes.choose(model.load_measured(), prod, connections=500_000, rate=0.5,
                               max_frame_bytes=prod["max_frame_bytes"])["picked"]
    assert (prod["worker_cpu"], prod["worker_memory_mib"]) == (picked["cpu"], picked["memory_mib"])
    assert (prod["target_per_worker"], prod["max_per_worker"]) == (picked["target"], picked["capacity"])
    assert picked["usd_per_1000"] <= 25  # holding all-in at 500k


def test_the_plan_prints_every_size_and_why_it_picked_one(capsys):
    argv = ["plan", "--env", "prod", "--connections", "500000", "--rate", "0.5", "--task-sizes"]
    assert main(argv, env={}) == 0
    out = capsys.readouterr().out
    assert "task sizes (arm64) at 0.5 msg/s" in out and "picked: 1 vCPU / 2,048 MiB" in out
    assert out.count(" vCPU / ") >= len(task_sizes.SIZES)
    assert main([*argv, "--json"], env={}) == 0
    sizes = json.loads(capsys.readouterr().out)["task_sizes"]
    assert len(sizes["sizes"]) == len(task_sizes.SIZES) and sizes["picked"]["cpu"] == 1024


@pytest.mark.parametrize("spot", [False, True])
def test_the_plan_prices_the_task_it_names(spot, capsys):
    argv = ["plan", "--env", "dev" if spot else "prod", "--connections", "1000"]
    assert main(argv, env={}) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("$ per month, the whole fleet"))
    assert ("x86_64 Spot" in line) if spot else ("1 vCPU / 2 GiB arm64" in line)
