"""``python -m sim.chaos``: a seeded chaos run against a local fleet; exit
status 1 on any violation (the report prints the command that replays it), 2 if the
harness itself failed to play a fault."""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Sequence

from wsfleet import config as cfg
from wsfleet import settings_spec
from wsfleet.logs import route_stdlib_logging
from ..timing import add_arguments as timing_arguments
from ..timing import from_arguments as timing_from
from .run import Run, Settings
from .schedule import KINDS, dealt_kinds


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="python -m sim.chaos",
        description="Seeded random faults against a local fleet, then an audit of the invariants.",
    )
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed [random, printed]")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the chaos phase [10]")
    p.add_argument("--workers", type=int, default=4, help="worker processes kept running [4]")
    p.add_argument("--connections", type=int, default=40, help="connections STARTed [40]")
    p.add_argument("--rate", type=float, default=2.0, help="messages per second per stream [2]")
    timing_arguments(p, shutdown=True)
    p.add_argument("--warmup", type=float, default=None, help="seconds between the last session opening and the first fault [until every session is watched]")
    p.add_argument("--slack", type=float, default=0.0, help="seconds added to every recovery bound [0]")
    p.add_argument("--run-dir", default=".chaos", help="where each run's logs and report go [.chaos]")
    p.add_argument("--sink", default=os.environ.get(settings_spec.SINK) or "dynamodb",
                   help="SINK: dynamodb, kinesis or dynamodb,kinesis [$SINK, else dynamodb]")
    p.add_argument("--hostile", action="store_true",
                   help="also one connection of each hostile upstream kind (ping flood, amplification, firehose, "
                        "slow handshake), judged apart (sim/chaos/hostile_check.py)")
    p.add_argument("--kinds", default=None, help=f"comma-separated fault kinds to deal [all: {','.join(KINDS)}]")
    a = p.parse_args(argv)
    if a.workers < 2 or a.connections < 1 or a.minutes <= 0:
        p.error("--workers must be at least 2 (a crash needs a survivor), --connections at least 1, --minutes positive")
    timing = timing_from(p, a)
    kinds = tuple(k.strip() for k in a.kinds.split(",") if k.strip()) if a.kinds is not None else None
    try:
        sink = ",".join(cfg.sinks({settings_spec.SINK: a.sink}))
    except ValueError as exc:
        p.error(f"--sink: {exc}")
    try:
        dealt_kinds(kinds, a.workers, sink)
    except ValueError as exc:
        p.error(f"--kinds: {exc}")
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 10**6)
    return Settings(seed=seed, minutes=a.minutes, workers=a.workers, connections=a.connections, rate=a.rate,
                    timing=timing, warmup_s=a.warmup, slack_s=a.slack, run_dir=a.run_dir, kinds=kinds,
                    sink=sink, hostile=a.hostile)


def main(argv: Sequence[str] | None = None) -> int:
    # stdout is the progress and the report; library records go to stderr as JSON lines.
    route_stdlib_logging(stream=sys.stderr, component="chaos")
    settings = parse_args(argv)
    try:
        return Run(settings).run()
    except KeyboardInterrupt:
        print(f"\ninterrupted: every process stopped (seed {settings.seed})", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
