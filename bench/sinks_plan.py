"""BENCHMARKS.md's "Sinks: what each costs (plan)" table, written from ``wsfleet plan
--json``'s own sink prices so that the two cannot disagree (a test compares them):
``python -m bench.sinks_plan`` rewrites it, ``--check`` only says whether it is current.
The table sits between ``<!-- sinks-plan -->`` and ``<!-- /sinks-plan -->``; the prose
around it is written by hand.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Sequence

from wsfleet.cli import main as wsfleet

from .common import md_table
from .generated import BENCHMARKS_MD, Generated

BEGIN, END = "<!-- sinks-plan -->\n", "<!-- /sinks-plan -->\n"
CASES = ((1_000, 0.5), (1_000, 5.0), (100_000, 0.5), (100_000, 5.0))
FRAME_BYTES = 256
# (heading, the sink priced, plan's extra arguments)
COLUMNS = (
    ("dynamodb", "dynamodb", ()),
    ("kinesis", "kinesis", ()),
    ("kinesis without the reference consumer", "kinesis", ("--no-consumer",)),
    ("kinesis, FLUSH_INTERVAL_MS 5,000 (more frames in each aggregate)", "kinesis", ("--flush-ms", "5000")),
    ("dynamodb,kinesis", "dynamodb,kinesis", ()),
    (
        "kinesis with the consumer at the event source mapping's defaults (100 records, 1 s)",
        "kinesis",
        ("--consumer-batch", "100", "--consumer-window", "1"),
    ),
)


def price(connections: int, rate: float, sink: str, extra: Sequence[str] = ()) -> float:
    """$ per 1,000 connections per month under ``sink``, as ``wsfleet plan --json``
    prints it (dev, ``--frame-bytes 256``), holding and checkpoints included."""
    argv = ["plan", "--json", "--connections", str(connections), "--rate", f"{rate:g}"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = wsfleet([*argv, "--frame-bytes", str(FRAME_BYTES), *extra], env={"AWS_REGION": "us-east-1"})
    if code != 0:
        raise RuntimeError(f"wsfleet {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue())["sinks"]["sinks"][sink]["per_1000_connections"]


def table() -> str:
    rows = [
        [f"{connections:,} x {rate:g}/s", *(f"{price(connections, rate, sink, extra):,.0f}" for _, sink, extra in COLUMNS)]
        for connections, rate in CASES
    ]
    return md_table(["connections x rate", *(heading for heading, _, _ in COLUMNS)], rows) + "\n"


def _bounds(text: str) -> tuple[int, int]:
    start = text.index(BEGIN) + len(BEGIN)
    return start, text.index(END, start)


def current_table(text: str) -> str:
    start, end = _bounds(text)
    return text[start:end]


def replace_table(text: str, new: str) -> str:
    start, end = _bounds(text)
    return text[:start] + new + text[end:]


GENERATED = Generated("sinks plan table", "bench.sinks_plan", table, current_table, replace_table)


def write(path: Path = BENCHMARKS_MD) -> bool:
    """Rewrite the table; True when it changed."""
    return GENERATED.write(path)


def main(argv: Sequence[str] | None = None) -> int:
    return GENERATED.main(argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
