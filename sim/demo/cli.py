"""``make demo``: the whole fleet on this machine, through a failover scenario, with a report.

    python -m sim.demo                      # 4 workers, 32 connections, about 3 minutes
    python -m sim.demo --scenario crash --workers 3 --connections 12 --duration 40

It starts the local AWS backend, an upstream, the API and K worker processes, STARTs M
connections through the API, then plays the scenario:

* ``start``  START every connection (every scenario begins with it);
* ``crash``  SIGKILL the busiest worker (the owner of ``k-none`` when the upstream kinds
  run, below): its session expires, a peer watching it ends
  it once the skew margin has passed too, and its connections are taken over;
* ``deploy`` start a replacement worker, then SIGTERM another (a rolling deploy step):
  the leaving worker closes, flushes, releases and hints its peers;
* ``pause``  SIGSTOP a worker past its lease, then SIGCONT it: peers take over, and the
  resumed worker must write nothing more, close its sockets and open a new session;
* ``stop``   STOP a quarter of the connections;
* ``burst``  START new connections and restart half of the stopped ones;
* ``scale_out`` start one more worker and START nothing: workers above their fair share
  hand the excess over to it (only connections held a minute or more move), and the
  report shows connections per worker before and after. Its step is four times as long
  as the others: a worker reads the fleet summary and runs a balance pass each about
  every 15 s, so the first moves come 15-50 s after the join.

``--scenario chaos`` is another kind of run: seeded random faults for ``--duration``
seconds, then an invariant audit (what ``make chaos`` runs; see
:mod:`sim.chaos`), with ``--seed`` to replay one.

Beside them, one connection of each upstream kind (:mod:`sim.kind_streams`;
``--no-kinds`` leaves them out): an authenticated one whose secret is rotated (old
credential revoked) halfway through the first step, subprotocol + subscribe with nested
frames and flat frames (whose sockets the upstream cuts at the same moment: they resume
from what is stored), and one that cannot replay, whose owner is the one ``crash``
kills. Stop and burst leave them alone; the report audits each against the upstream's
books (nothing lost or doubled, or for the one without replay, exactly which range was
missed and that it is stored as one upstream_gap marker), and looks for the secret's
values in every log, item and GET body.

Right after the first START, the first connection's upstream sends one frame of
LARGE_FRAME_BYTES of data, too large for a DynamoDB item: it is stored as an S3 object,
and the report reads it back and compares its size and SHA-256 with what was sent.

``--sink kinesis`` (or ``SINK=kinesis`` in the environment; ``dynamodb,kinesis`` for
both) sends the frames to a Kinesis stream instead of (or beside) the messages table:
the report then audits the stream (:mod:`sim.stream_audit`: every seq
delivered at least once and in order, frames delivered again only after a takeover and
within the bound), and the table audit and the kinds' read what a consumer keeps of it.
``--sink firehose`` sends them through the emulator's Firehose delivery stream into S3
instead: the report audits its objects by the same rules, in the order a reader sorts
them (:mod:`sim.delivery_audit`).

A progress line every two seconds; at the end it STOPs everything, checks every stored
message against the upstream and prints a report (also written to the run directory).
Exit status 1 if the report shows data loss, a gap, two sockets on one stream (other than
a frozen one's, see ``pause``), a connection that never came back, or a large frame not
read back as sent.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from typing import Sequence

from wsfleet import config as cfg
from wsfleet import settings_spec
from wsfleet import schema, tracing
from wsfleet.logs import route_stdlib_logging
from ..chaos.run import Run as ChaosRun
from ..chaos.run import Settings as ChaosSettings
from ..fleet import Fleet, new_run_dir
from ..observed import Sample
from ..timing import Timing
from ..timing import add_arguments as timing_arguments
from ..timing import from_arguments as timing_from
from ..timing import of_arguments as timing_of
from .scenarios import SCENARIOS, Demo

CHAOS = "chaos"  # not a list of steps: the chaos soak, seeded


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sim.demo", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=4, help="worker processes at the start [4]")
    p.add_argument("--connections", type=int, default=32, help="connections STARTed at the start [32]")
    p.add_argument("--scenario", choices=sorted([*SCENARIOS, CHAOS]), default="full", help="what happens after the START [full]")
    p.add_argument("--seed", type=int, default=None, help="chaos only: the fault schedule's seed [random, printed]")
    p.add_argument("--duration", type=float, default=150.0, help="seconds from the first START to the final STOP [150]")
    p.add_argument("--rate", type=float, default=2.0, help="messages per second per upstream stream [2]")
    timing_arguments(p)
    p.add_argument("--no-kinds", dest="kinds", action="store_false",
                   help="leave out the connections of each upstream kind (authenticated, subscribe, flat, no replay)")
    p.add_argument("--run-dir", default=".demo", help="where each run's logs and report go [.demo]")
    p.add_argument("--sink", default=os.environ.get(settings_spec.SINK) or schema.SINK_DYNAMODB,
                   help="SINK: where frames go, one or more of dynamodb, kinesis, firehose, comma-separated [$SINK, else dynamodb]")
    p.add_argument("--tracing", choices=["off", tracing.OTEL], default=os.environ.get(settings_spec.TRACING) or "off",
                   help="TRACING: otel writes every process's spans to traces-<name>.jsonl in the run directory [$TRACING, else off]")
    p.add_argument("--strict", action="store_true", help="also fail when an event took longer than its bound, or a scale-out left a worker above its fair share")
    args = p.parse_args(argv)
    if args.workers < 1 or args.connections < 1:
        p.error("--workers and --connections must be at least 1")
    if args.scenario in ("crash", "deploy", "pause", "full", "scale-out", CHAOS) and args.workers < 2:
        p.error(f"the {args.scenario} scenario needs at least 2 workers")
    timing_from(p, args)  # refuses timings the worker would refuse
    try:
        args.sink = ",".join(cfg.sinks({settings_spec.SINK: args.sink}))
    except ValueError as exc:
        p.error(f"--sink: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    # stdout is the progress and the report, for people; library records, warnings and
    # a crash go to stderr as JSON lines (the workers' own logs are in the run directory).
    route_stdlib_logging(stream=sys.stderr, component="demo")
    args = parse_args(argv)
    timing = timing_of(args)
    if args.scenario == CHAOS:
        return _chaos(args, timing)
    run_dir = new_run_dir(Path(args.run_dir))
    demo: Demo | None = None

    def on_sample(sample: Sample) -> None:
        if demo is not None:
            demo.on_sample(sample)

    try:
        with Fleet(
            run_dir=run_dir, timing=timing, rate=args.rate, on_sample=on_sample, sink=args.sink,
            traces=args.tracing == tracing.OTEL,
        ) as fleet:
            demo = Demo(fleet, args)
            return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: every process stopped; logs in", run_dir, file=sys.stderr)
        return 130


def _chaos(args: argparse.Namespace, timing: Timing) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    settings = ChaosSettings(
        seed=seed, minutes=args.duration / 60, workers=args.workers, connections=args.connections, rate=args.rate,
        timing=timing, run_dir=args.run_dir, sink=args.sink,
    )
    try:
        return ChaosRun(settings).run()
    except KeyboardInterrupt:
        print(f"\ninterrupted: every process stopped (seed {seed})", file=sys.stderr)
        return 130

