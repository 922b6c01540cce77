"""``python -m bench simulate [--workers 2000] [--per-worker 250] [--scenario crash10|az|join|deploy|scalein|steady|all] [--seed 1] [--json] [--save DIR]``

The fleet in virtual time (:mod:`sim.virtual`): the workers' own roles and decisions
against an in-memory DynamoDB that enforces each partition's limits, SQS with the
stack's dead-letter rule and an ECS service, at prod's settings. Prints each scenario's
figures and the bounds it is held to (``--json``: the raw figures); exits 1 if a bound
failed. In ``make bench`` (``python -m bench simulate`` with no flags, or ``all``) it runs
crash10, join and scalein at 2,000 workers x 250 (``--quick``: 20 x 25).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from sim.virtual import SCENARIOS, Settings, simulate
from sim.virtual.report import render
from wsfleet.plan import environments as plan_environments
from wsfleet.plan.bursts import bursts

from .common import Result

BENCH_SCENARIOS = ("crash10", "join", "scalein")  # what make bench runs at full size
OWN_FLAGS = ("--workers", "--per-worker", "--scenario", "--seed", "--json", "--save")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench simulate", description=__doc__.splitlines()[2])
    p.add_argument("--workers", type=int, default=2000, help="workers at the start [2000]")
    p.add_argument("--per-worker", type=int, default=250, help="connections per worker [250]")
    p.add_argument("--scenario", default="crash10", choices=["all", *SCENARIOS], help="what happens [crash10]")
    p.add_argument("--seed", type=int, default=1, help="the run's seed: the same seed, the same run [1]")
    p.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    p.add_argument("--save", metavar="DIR", type=Path,
                   help="also write each scenario's raw figures (its samples a second included) to DIR/<scenario>.json")
    args = p.parse_args(argv)
    if args.workers < 2:
        p.error("--workers must be at least 2")
    if args.per_worker < 1:
        p.error("--per-worker must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    failed = False
    for name in names:
        figures = simulate(name, workers=args.workers, per_worker=args.per_worker, seed=args.seed)
        failed |= not all(figures["bounds"].values())
        figures["against_plan"] = against_plan(figures)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"{name}.json").write_text(json.dumps(figures, indent=1))
        print(json.dumps(figures, indent=1) if args.json else render(figures) + render_against_plan(figures) + "\n", flush=True)
    return 1 if failed else 0


# The plan's scenario for each of the simulator's, and the peaks compared (wsfleet.plan.bursts).
PLAN_SCENARIO = {"crash10": "crash", "az": "zone_lost", "join": "join", "scalein": "scale_in", "deploy": "deploy"}


# An inbox entry as the simulator's connection ids make it ("c0001234#2", a set member).
SIM_ENTRY_BYTES = 12


def against_plan(figures: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(what, the plan's figure, the simulator's) for one run: the RING partition's peak
    writes a second (a join's over its busiest two heartbeats too: a steady stream), the
    hottest session item's writes against the plan's bound (a full inbox), and a
    deploy's tasks at once."""
    scenario = PLAN_SCENARIO.get(figures["scenario"])
    if scenario is None:
        return []
    # prod's timings, and the simulator's MAX_CONNECTIONS (what a lost zone's survivors can hold)
    most = max(Settings().max_connections, figures["per_worker"])
    settings = {**plan_environments.load("prod"), "max_per_worker": most}
    planned = bursts(workers=figures["workers"], per_worker=figures["per_worker"], settings=settings,
                     tasks_quota=5000, launches_per_minute=500, entry_bytes=SIM_ENTRY_BYTES)[scenario]
    peaks = figures["peak_by_partition_kind"]
    ring = peaks.get("ring", {"write": 0.0})
    rows = [("RING writes / s (peak second)", planned["ring_writes_per_s"], ring["write"])]
    if scenario == "join":
        rows.append(("RING writes / s (busiest 5 s)", planned["ring_writes_per_s"], figures["ring_writes_busiest_5s"]))
    if "inbox_units_per_s" in planned:
        rows.append(("a session item's writes / s (plan: a full inbox, at most)", planned["inbox_units_per_s"],
                     peaks.get("session", {"write": 0.0})["write"]))
    if planned.get("unplaced"):  # what the survivors cannot hold waits for replacements
        rows.append(("seconds until the unplaced run (plan) / recovery p99", planned["recovery_s"],
                     figures["crash_recovery"]["p99_s"] or 0.0))
    if "tasks_at_once" in planned:
        rows.append(("tasks at once", planned["tasks_at_once"], figures["peak_tasks"]))
    return rows


def render_against_plan(figures: dict[str, Any]) -> str:
    rows = against_plan(figures)
    if not rows:
        return ""
    lines = ["", "", "| against the plan (`wsfleet plan`) | plan | simulator |", "|---|---|---|"]
    lines += [f"| {what} | {planned:,.1f} | {measured:,.1f} |" for what, planned, measured in rows]
    return "\n".join(lines)


def run(*, quick: bool, run_dir: Path, command: str, **_: Any) -> Result:
    """The ``make bench`` entry: :data:`BENCH_SCENARIOS` at 2,000 x 250 (quick: 20 x 25)."""
    workers, per_worker = (20, 25) if quick else (2000, 250)
    parts, data = [], {}
    for name in BENCH_SCENARIOS:
        figures = simulate(name, workers=workers, per_worker=per_worker, seed=1)
        data[name] = figures
        args = f"--workers {workers} --per-worker {per_worker} --scenario {name} --seed 1"
        parts.append(f"`PYTHONPATH=runtime:. python -m bench simulate {args}`\n\n{render(figures)}{render_against_plan(figures)}")
    return Result("simulate", command, {"workers": workers, "per_worker": per_worker}, "\n\n".join(parts), data)


if __name__ == "__main__":
    sys.exit(main())
