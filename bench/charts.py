"""BENCHMARKS.md's charts, as SVG files in ``bench/charts/``: the failover gaps'
distribution and peak RSS against frame size from a benchmark's raw results (what
``make bench`` writes as ``.bench/<name>-<stamp>.json``), and the cost per connection of
each sink from ``wsfleet plan``'s own prices (computed, nothing run).

``make bench`` redraws those of the benchmarks it ran (never on ``--quick``); ``python -m
bench.charts`` redraws them all from the newest raw results under ``--from`` (``.bench``),
and one whose benchmark has no raw result there from the figures BENCHMARKS.md recorded
(``RECORDED``), saying so under its title.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from wsfleet.cli import svg

from . import sinks_plan

CHARTS = Path(__file__).resolve().parent / "charts"
W, H = 1000, 420
L, R, T, B = 80, W - 300, 56, H - 56  # the plot area; the legend sits right of it
FAILOVER, MEMORY, SINKS = "failover-gaps.svg", "rss-by-frame-size.svg", "sink-costs.svg"
NAMES = (FAILOVER, MEMORY, SINKS)
TASK_MIB = 512  # the worker task the large-frames benchmark sizes its budget for

# "Large frames" as BENCHMARKS.md recorded it (`python -m bench largeframes` at 2a2bf9d,
# 2026-12-06): peak RSS (VmHWM, MB) by frame size at 2 connections, and at 32 MiB frames
# with 8 and 16 connections, budget on and off (off: stopped at the 3,072 MB cap).
RECORDED = {
    "largeframes": {
        "source": "recorded figures: python -m bench largeframes at 2a2bf9d, 2026-12-06 (BENCHMARKS.md)",
        "by_size": {str(size): {"connections": 2, "vm_hwm_mb": mb}
                    for size, mb in ((300_000, 214), (1 << 20, 137), (8 << 20, 142), (32 << 20, 324))},
        "runs": {
            "8 bounded": {"connections": 8, "vm_hwm_mb": 351, "frame_bytes": 33554432, "budget_bytes": 1},
            "8 off": {"connections": 8, "vm_hwm_mb": 3086, "frame_bytes": 33554432, "budget_bytes": None,
                      "stopped_at_rss_cap": True},
            "16 bounded": {"connections": 16, "vm_hwm_mb": 352, "frame_bytes": 33554432, "budget_bytes": 1},
            "16 off": {"connections": 16, "vm_hwm_mb": 3112, "frame_bytes": 33554432, "budget_bytes": None,
                       "stopped_at_rss_cap": True},
        },
    },
}


def _frame(title: str, source: str, x: svg.Scale, y: svg.Scale, x_label: str, y_label: str, **fmt: Any) -> list[str]:
    return [svg.text(L, 20, title, size=13, bold=True), svg.text(L, 38, source, size=10, fill="#555"),
            svg.axes(x, y, x_label=x_label, y_label=y_label, **fmt)]


def _round_log(v: float, *, down: bool) -> float:
    """The nearest 1, 2 or 5 times a power of ten below (``down``) or above ``v``."""
    e = math.floor(math.log10(v))
    steps = [m * 10.0**k for k in (e - 1, e, e + 1) for m in (1, 2, 5)]
    return max(s for s in steps if s <= v) if down else min(s for s in steps if s >= v)


def failover_gaps(data: Mapping[str, Any], source: str) -> str:
    """The share of connections back within t seconds (log t): a crash's kill -9 -> new
    socket, and a graceful handoff's time without a socket, per upstream kind."""
    lines: list[tuple[str, list[float]]] = []
    for r in data["results"]:
        kind = "" if r.get("kind", "default") == "default" else ", auth + subscribe"
        lines.append((f"crash: kill -9 -> new socket{kind}",
                      sorted(v for c in r["crashes"] for v in c["socket_s"].values() if v is not None)))
        lines.append((f"handoff: no socket{kind}",
                      sorted(v for h in r["handoffs"] for v in h["no_socket_s"].values() if v is not None)))
    lines = [(name, values) for name, values in lines if values]
    lo = _round_log(max(min(v for _, vs in lines for v in vs), 0.01), down=True)
    hi = _round_log(max(v for _, vs in lines for v in vs), down=False)
    x, y = svg.Scale(lo, hi, L, R, log=True), svg.Scale(0, 1, B, T)
    body = _frame("Failover: how long connections were without a socket", source, x, y,
                  "seconds (log scale)", "share of connections", y_format=lambda v: f"{v:.0%}")
    for target, what in ((1.0, "handoff target p99 1 s"), (12.0, "crash target p99 12 s")):
        if lo <= target <= hi:
            body += [svg.line(x(target), T, x(target), B, "#c0392b", dash="4,3"),
                     svg.text(x(target) + 3, B - 6, what, size=10, fill="#c0392b")]
    for i, (name, values) in enumerate(lines):
        n = len(values)
        steps = [(x(values[0]), y(0))]
        for k, v in enumerate(values):
            steps += [(x(v), y(k / n)), (x(v), y((k + 1) / n))]
        body.append(svg.polyline(steps, svg.colour(i), width=2, title=f"{name}: n={n}, max {values[-1]:.2f} s"))
    body.append(svg.legend(R + 16, T + 10, [(f"{name} (n={len(v)})", svg.colour(i)) for i, (name, v) in enumerate(lines)]))
    return svg.document(W, H, body, title="failover gaps")


def rss_by_frame_size(data: Mapping[str, Any], source: str) -> str:
    """Peak RSS (VmHWM) against frame size with the receive budget on, and at the
    largest frame with the budget off, against a 512 MiB task."""
    by_size = sorted((int(size), r["vm_hwm_mb"]) for size, r in data["by_size"].items())
    runs = list(data["runs"].values())
    sizes = [s for s, _ in by_size] + [r["frame_bytes"] for r in runs if "frame_bytes" in r]
    most = max([TASK_MIB * 1.048576, *(mb for _, mb in by_size), *(r["vm_hwm_mb"] for r in runs)])
    x = svg.Scale(10 ** math.floor(math.log10(min(sizes))), 10 ** math.ceil(math.log10(max(sizes))), L, R, log=True)
    y = svg.Scale(0, math.ceil(most / 500) * 500, B, T)
    body = _frame("Large frames: the worker's peak memory", source, x, y, "frame bytes (log scale)", "peak RSS, MB")
    task = TASK_MIB * 1.048576
    body += [svg.line(L, y(task), R, y(task), "#c0392b", dash="4,3"),
             svg.text(L + 4, y(task) - 4, f"a {TASK_MIB} MiB task", size=10, fill="#c0392b")]
    connections = next(iter(data["by_size"].values()), {}).get("connections", 2)
    body.append(svg.polyline([(x(s), y(mb)) for s, mb in by_size], svg.colour(0), width=2,
                             title=f"{connections} connections, MAX_BUFFERED_BYTES on"))
    body += [svg.dot(x(s), y(mb), svg.colour(0), title=f"{s:,} B frames: {mb:.0f} MB") for s, mb in by_size]
    entries = [(f"by size, {connections} connections, budget on", svg.colour(0))]
    for i, (label, budget) in enumerate((("budget on", True), ("budget off", False))):
        hue = svg.colour(1 + i * 2)
        these = [r for r in runs if (r.get("budget_bytes") is not None) == budget and "frame_bytes" in r]
        middle = sum(r["connections"] for r in these) / max(len(these), 1)
        for r in these:
            capped = " (stopped at the RSS cap)" if r.get("stopped_at_rss_cap") else ""
            left = r["connections"] < middle  # the runs side by side, fewest connections on the left
            px = x(r["frame_bytes"]) + (-5 if left else 5)
            body.append(svg.dot(px, y(r["vm_hwm_mb"]), hue, r=5,
                                title=f"{r['connections']} connections, {label}: {r['vm_hwm_mb']:.0f} MB{capped}"))
            body.append(svg.text(px + (-7 if left else 7), y(r["vm_hwm_mb"]) + 4, f"{r['connections']}", size=9,
                                 anchor="end" if left else "start"))
        if these:
            entries.append((f"{' and '.join(str(r['connections']) for r in these)} connections, {label}", hue))
    body.append(svg.legend(R + 16, T + 10, entries))
    if any(r.get("stopped_at_rss_cap") for r in runs):
        body.append(svg.text(R + 16, T + 10 + len(entries) * 15, "budget off: stopped at the RSS cap, so at least", size=10,
                             fill="#555"))
    return svg.document(W, H, body, title="peak RSS by frame size")


RATES = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
SINK_CONNECTIONS = 100_000


def sink_costs() -> str:
    """$ per 1,000 connections per month under each SINK against the rate per
    connection, at 100,000 connections in dev (``wsfleet plan --json``'s figures)."""
    lines = [(heading, [(rate, sinks_plan.price(SINK_CONNECTIONS, rate, sink, extra)) for rate in RATES])
             for heading, sink, extra in sinks_plan.COLUMNS[:4]]
    values = [v for _, points in lines for _, v in points]
    x = svg.Scale(RATES[0], RATES[-1], L, R, log=True)
    y = svg.Scale(10 ** math.floor(math.log10(min(values))), 10 ** math.ceil(math.log10(max(values))), B, T, log=True)
    body = _frame("Cost per 1,000 connections by sink", f"wsfleet plan --env dev --connections {SINK_CONNECTIONS:,} "
                  f"--frame-bytes {sinks_plan.FRAME_BYTES} --rate R (computed; us-east-1 list prices)", x, y,
                  "messages per second per connection (log scale)", "$ per month", y_format=lambda v: "$" + svg.number(v))
    for i, (name, points) in enumerate(lines):
        body.append(svg.polyline([(x(r), y(v)) for r, v in points], svg.colour(i), width=2, title=name))
        body += [svg.dot(x(r), y(v), svg.colour(i), r=3, title=f"{name} at {r:g}/s: ${v:,.0f}") for r, v in points]
    body.append(svg.legend(R + 16, T + 10, [(name, svg.colour(i)) for i, (name, _) in enumerate(lines)]))
    return svg.document(W, H, body, title="cost per connection by sink")


def source_of(raw: Mapping[str, Any]) -> str:
    machine = raw.get("machine") or {}
    return f"{raw.get('command', 'python -m bench')} at {machine.get('commit', '?')}, {machine.get('date', '?')}"


def write(results: Mapping[str, Mapping[str, Any]], out: Path = CHARTS) -> list[Path]:
    """The charts of ``results`` (benchmark name -> its raw result, as written to
    ``.bench``), and the sinks chart; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = {SINKS: sink_costs()}
    if "failover" in results:
        drawn[FAILOVER] = failover_gaps(results["failover"], source_of(results["failover"]))
    if "largeframes" in results:
        raw = results["largeframes"]
        drawn[MEMORY] = rss_by_frame_size(raw, raw.get("source") or source_of(raw))
    for name, text in drawn.items():
        (out / name).write_text(text + "\n")
    return [out / name for name in drawn]


def newest(directory: Path, name: str) -> dict | None:
    """The newest raw result of benchmark ``name`` that was not a --quick run."""
    for path in sorted(directory.glob(f"{name}-*.json"), reverse=True):
        raw = json.loads(path.read_text())
        if not raw.get("quick"):
            return raw
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.charts", description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", default=".bench", help="where make bench wrote its raw results [.bench]")
    args = p.parse_args(argv)
    results: dict[str, Mapping[str, Any]] = {}
    for name in ("failover", "largeframes"):
        raw = newest(Path(args.source), name)
        if raw is None and name in RECORDED:
            print(f"{name}: no raw result under {args.source}: drawn from BENCHMARKS.md's recorded figures")
            raw = RECORDED[name]
        if raw is None:
            print(f"{name}: no raw result under {args.source} and none recorded: chart left as it is")
            continue
        results[name] = raw
    for path in write(results):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
