"""``python -m bench [failover|cost|capacity|ingestion|faults|rebalance|pauses|readapi|largeframes|amplification|hostile|sinks|simulate|all] [--quick] [--kinds-only] [--tracing-only] [--join4-only] [--out DIR]``

``python -m bench simulate --workers W --per-worker N --scenario S --seed N [--json]``
runs the virtual-time simulator alone with its own flags (:mod:`.simulate`).

Runs the chosen benchmarks one after another (each with processes of its own), prints
each one's markdown table with the command that produced it, and writes the raw
results to ``<out>/<name>-<timestamp>.json``, the tables to ``<out>/report-<timestamp>.md``
and, but for ``--quick``, BENCHMARKS.md's charts of what ran to ``bench/charts/`` (``bench.charts``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from sim import children

from . import (
    amplification, capacity, charts, cost, failover, faults, hostile, ingestion, largeframes, pauses, readapi, rebalance,
    simulate, sinks,
)
from .common import Result, machine

BENCHMARKS: dict[str, Callable[..., Result]] = {
    "failover": failover.run,
    "cost": cost.run,
    "capacity": capacity.run,
    "ingestion": ingestion.run,
    "faults": faults.run,
    "rebalance": rebalance.run,
    "pauses": pauses.run,
    "readapi": readapi.run,
    "largeframes": largeframes.run,
    "amplification": amplification.run,
    "hostile": hostile.run,
    "sinks": sinks.run,
    "simulate": simulate.run,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("which", nargs="*", default=["all"], choices=["all", *BENCHMARKS], help="benchmarks to run [all]")
    p.add_argument("--quick", action="store_true", help="tiny sizes and fast timings (the smoke test)")
    p.add_argument("--kinds-only", action="store_true",
                   help="ingestion: only the rows that compare upstream kinds (the 100 x 2/s row, default and authenticated + subscribe)")
    p.add_argument("--tracing-only", action="store_true",
                   help="ingestion: only the rows that compare TRACING=otel with off (the 100 x 2/s row, untraced and traced)")
    p.add_argument("--join4-only", action="store_true",
                   help="rebalance: only the join of 4 workers into 4 (no join of 1, steady window or crash)")
    p.add_argument("--out", default=".bench", help="where raw results and the report go [.bench]")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["simulate"] and any(a.split("=")[0] in simulate.OWN_FLAGS for a in given[1:]):
        return simulate.main(given[1:])  # the simulator alone, with its own flags
    args = parse_args(argv)
    names = list(BENCHMARKS) if "all" in args.which else list(dict.fromkeys(args.which))
    out = Path(args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = out / f"run-{stamp}"
    command = "PYTHONPATH=runtime:. python -m bench " + (shlex.join(given) if given else "all")
    # Every process a benchmark starts imports a copy of the runtime taken now: code
    # edited while a long run goes on must not reach the workers it starts later.
    run_dir.mkdir(parents=True, exist_ok=True)
    children.RUNTIME_DIR = children.pin_runtime(run_dir.resolve())
    host = machine()
    print(f"# wsfleet benchmarks ({', '.join(names)}{', quick' if args.quick else ''})")
    print(f"machine: {host['nproc']} cores ({host['cpu']}), Python {host['python']}, {host['platform']}")
    print(f"date: {host['date']}, commit {host['commit']}; logs under {run_dir}\n", flush=True)
    report = [f"machine: {host['nproc']} cores ({host['cpu']}), Python {host['python']}; {host['date']}; commit {host['commit']}", ""]
    failed = []
    raw: dict[str, dict] = {}
    for name in names:
        began = time.monotonic()
        try:
            extra = {
                "ingestion": {"kinds_only": args.kinds_only, "tracing_only": args.tracing_only},
                "rebalance": {"join4_only": args.join4_only},
            }.get(name, {})
            result = BENCHMARKS[name](quick=args.quick, run_dir=run_dir, command=command, **extra)
        except Exception as exc:  # noqa: BLE001 - one failed benchmark must not hide the others
            print(f"### {name}: FAILED: {type(exc).__name__}: {exc}\n", flush=True)
            failed.append(name)
            continue
        took = time.monotonic() - began
        text = result.render() + f"\n({name} took {took:.0f} s)\n"
        print(text, flush=True)
        report.append(text)
        out.mkdir(parents=True, exist_ok=True)
        raw[name] = {"name": name, "command": command, "machine": host, "took_s": took, "quick": args.quick,
                     "notes": result.notes, **result.data}
        (out / f"{name}-{stamp}.json").write_text(json.dumps(raw[name], indent=1, default=str))
    if report[2:]:
        (out / f"report-{stamp}.md").write_text("\n".join(report))
        print(f"raw results: {out}/*-{stamp}.json; tables: {out}/report-{stamp}.md")
    if raw and not args.quick:  # BENCHMARKS.md's charts, redrawn from what ran (a --quick run's figures mean nothing)
        # JSON's round trip, as python -m bench.charts reads them back: the same keys either way.
        for path in charts.write({name: json.loads(json.dumps(r, default=str)) for name, r in raw.items()}):
            print(f"chart: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
