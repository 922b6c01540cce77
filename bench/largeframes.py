"""Large frames: a worker's memory when every connection sends frames at the limit.

One worker process against the emulator and an upstream (bench.large_upstream) that
sends every stream frames of ``MAX_FRAME_BYTES`` back to back, as fast as the worker
reads them. Twice, each with a fresh emulator, upstream and worker:

* bounded: the worker's budget (``MAX_BUFFERED_BYTES``, set to what a 512 MiB task gets
  by default: half of it) with its receive gate and the writer's byte cap;
* off: ``MAX_BUFFERED_BYTES=off``, the behaviour before the budget (websockets' queue of
  16 frames per socket, no gate, the writer's count caps only). A run whose worker
  passes ``RSS_STOP_MB`` is stopped there, and says so.

Per run: the worker's resident memory sampled from ``/proc/<pid>/status`` (VmRSS every
``sample_s``, and VmHWM, the kernel's peak, at the end) against the budget and the task
memory; large frames handled per second and MB/s (the writer's MessagesStored over a
window between two stats lines); received -> stored p50 / p99 / max (from the hand-over
to the writer to the stored batch: the writer's histogram); the gate's high-water mark
of slots held and how often a socket waited for one.

Each of these frames goes through the writer's upload to S3 (the emulator's), then its
item; the writer's byte cap (``pending_bytes_max``) is in the raw results.

Then, by size: two connections sending frames of 300 KB (stored inline), 1, 8 and 32 MiB
(stored as S3 objects), each back to back, bounded: frames/s, MB/s and received ->
stored, so that inline and S3 compare in one run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from wsfleet import config as cfg
from wsfleet import settings_spec
from sim.processes import eventually
from wsfleet.stream import MAX_MESSAGE_BYTES

from .common import ReadyUpstream, Result, Rig, Window, fmt, latency_between, latency_cell, md_table

TASK_MEMORY_MIB = 512  # the dev worker task's memory (app.py, stacks.settings default)
RSS_STOP_MB = 3072  # an unbounded run is stopped here: the figure is then "at least"


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "quick": quick,
        "connections": [2] if quick else [8, 16],
        "frame_bytes": (1 << 20) if quick else cfg.DEFAULT_MAX_FRAME_BYTES,
        # quick: a budget of 4 MiB gives one receive slot for 1 MiB frames (two frames a slot).
        "budget_bytes": (4 << 20) if quick else TASK_MEMORY_MIB * (1 << 20) // 2,
        "warmup_s": 1.0 if quick else 5.0,
        "window_s": 2.0 if quick else 30.0,
        "sample_s": 0.05 if quick else 0.1,
        "worker": {settings_spec.METRICS_SECONDS: 0.5 if quick else 2},
        # Throughput and store latency by size, two connections each, bounded: data that
        # fits an item (inline) against data stored through S3.
        "sweep_connections": 2,
        # (--quick: none; the memory runs above already go through the same code.)
        "sweep_sizes": [] if quick else [300_000, 1 << 20, 8 << 20, 32 << 20],
        "sweep_window_s": 2.0 if quick else 20.0,
    }


class LargeUpstream(ReadyUpstream):
    """``python -m bench.large_upstream``: frames of ``frame_bytes`` back to back."""

    grace_s = 2.0

    def __init__(self, run_dir: Path, frame_bytes: int) -> None:
        argv = [sys.executable, "-m", "bench.large_upstream", "--frame-bytes", str(frame_bytes)]
        super().__init__(run_dir, "large-upstream", argv, "the large-frame upstream")


def vm(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (MB) of a live process, from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) / 1024
    return out


def run_one(run_dir: Path, s: dict[str, Any], n: int, budget: int | None, size: int | None = None) -> dict[str, Any]:
    size = size or s["frame_bytes"]
    with Rig(run_dir) as rig:
        upstream = LargeUpstream(run_dir, size)
        try:
            worker = rig.worker("w1", {
                **s["worker"],
                settings_spec.MAX_FRAME_BYTES: max(size, s["frame_bytes"]),
                settings_spec.MAX_BUFFERED_BYTES: budget if budget is not None else "off",
                settings_spec.MAX_CONNECTIONS: max(n, 10),
            })
            ids = [f"big{i:02d}" for i in range(n)]
            rig.start_connections(ids, upstream, hint=True)  # type: ignore[arg-type]
            eventually(lambda: (st := worker.stats()) and st[-1].active == n, 120, f"{n} connections held", interval=0.2)
            time.sleep(s["warmup_s"])
            a = worker.next_stats()
            samples, stopped, end = [], False, time.monotonic() + s["window_s"]
            while time.monotonic() < end:
                rss = vm(worker.pid)["VmRSS"]
                samples.append(rss)
                if rss > RSS_STOP_MB:
                    stopped = True
                    break
                time.sleep(s["sample_s"])
            b = worker.next_stats() if not stopped else None
            peak = vm(worker.pid)["VmHWM"]
            last = worker.events("stats")[-1]
        finally:
            upstream.stop()
    result: dict[str, Any] = {
        "budget_bytes": budget,
        "connections": n,
        "frame_bytes": size,
        "rss_mb_max_sampled": max(samples) if samples else None,
        "rss_mb_samples": samples,
        "vm_hwm_mb": peak,
        "stopped_at_rss_cap": stopped,
        "gate": last.get("gate"),
        "budget": last.get("budget"),
        "writer_pending_bytes_max": (last.get("writer") or {}).get("pending_bytes_max"),
    }
    if b is not None:
        win = Window.between(a, b)
        frames = win.counters["MessagesStored"]
        result.update({
            "window_s": win.seconds,
            "frames": frames,
            "frames_per_s": frames / win.seconds,
            "mb_per_s": frames * size / win.seconds / 1e6,
            "latency_ms": latency_between(a, b),
            "backpressure_waits": win.counters["BackpressureWaits"],
            "malformed_frames": win.counters["MalformedFrames"],
            "reconnects": win.counters["Reconnects"],
        })
    return result


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    runs = {}
    for n in s["connections"]:
        # (--quick: the bounded run only; "off" is the same code with no budget.)
        for label, budget in (("bounded", s["budget_bytes"]),) + ((("off", None),) if not s["quick"] else ()):
            print(f"    {label}: {n} x {s['frame_bytes'] >> 20} MiB frames", flush=True)
            runs[f"{n} {label}"] = run_one(run_dir / f"largeframes-{n}-{label}", s, n, budget)
    rows = []
    for key, r in runs.items():
        label = f"{r['connections']} connections, " + key.split()[1]
        lat = r.get("latency_ms") or {"n": 0}
        gate = r["gate"] or {}
        peak = f"{r['vm_hwm_mb']:.0f}" + (f" (stopped at {RSS_STOP_MB} MB)" if r["stopped_at_rss_cap"] else "")
        rows.append([
            label,
            "off" if r["budget_bytes"] is None else f"{r['budget_bytes'] >> 20} MiB",
            f"{gate['slots']} (max held {gate['high_water']}, {gate['waits']} waits)" if gate else "-",
            peak,
            fmt(r["rss_mb_max_sampled"], 0),
            f"{r['vm_hwm_mb'] / TASK_MEMORY_MIB * 100:.0f} %",
            fmt(r.get("frames_per_s"), 2),
            fmt(r.get("mb_per_s"), 0),
            latency_cell(lat),
            fmt(r.get("reconnects"), 0),
        ])
    header = ["run (frames at the limit, back to back)", "MAX_BUFFERED_BYTES", "receive slots (high-water, waits)", "peak RSS MB (VmHWM)",
              "max sampled VmRSS MB", "of a 512 MiB task", "frames/s", "MB/s", "received -> stored p50 / p99 / max ms",
              "reconnects"]
    ratios = []
    for n in s["connections"]:
        if f"{n} off" not in runs:
            continue
        b, o = runs[f"{n} bounded"], runs[f"{n} off"]
        ratios.append(f"{n} connections {fmt(o['vm_hwm_mb'] / b['vm_hwm_mb'], 1)}x"
                      + (" (at least: the unbounded run was stopped at the cap)" if o["stopped_at_rss_cap"] else ""))
    notes = [
        f"{' and '.join(map(str, s['connections']))} connections, each sent frames of {s['frame_bytes']:,} bytes back to back by "
        f"bench.large_upstream; one worker (MAX_FRAME_BYTES = the frame size), fresh emulator per run; window "
        f"{s['window_s']:g} s after {s['warmup_s']:g} s warm-up; VmRSS sampled every {s['sample_s']:g} s.",
        "Peak RSS unbounded / bounded: " + ", ".join(ratios) + ".",
        "Every frame goes through the writer's S3 upload, then its item; the writer held (large data counted twice: "
        "the frame and its upload's body) "
        + ", ".join(f"{fmt(r['writer_pending_bytes_max'], 0)}" for k, r in runs.items() if k.endswith("bounded"))
        + " bytes at most in the bounded runs.",
        "Received -> stored: from the hand-over to the writer to the stored batch (the time a frame waits for a "
        "receive slot is before it, in the frames/s).",
    ]
    sweep, sweep_rows = {}, []
    for size in s["sweep_sizes"]:
        print(f"    by size: {s['sweep_connections']} x {size:,} B frames", flush=True)
        r = run_one(run_dir / f"largeframes-size-{size}", {**s, "window_s": s["sweep_window_s"]},
                    s["sweep_connections"], s["budget_bytes"], size)
        sweep[size] = r
        lat = r.get("latency_ms") or {"n": 0}
        sweep_rows.append([
            f"{size:,}", "inline (item)" if size <= MAX_MESSAGE_BYTES else "S3 object + item",
            fmt(r.get("frames_per_s"), 2), fmt(r.get("mb_per_s"), 0),
            latency_cell(lat),
            f"{r['vm_hwm_mb']:.0f}",
        ])
    sweep_header = ["frame bytes", "stored as", "frames/s", "MB/s", "received -> stored p50 / p99 / max ms", "peak RSS MB"]
    notes.append(
        f"By size: {s['sweep_connections']} connections, frames of each size back to back, bounded, window "
        f"{s['sweep_window_s']:g} s each; inline data is one item of a BatchWriteItem, larger data one S3 PUT "
        "(the emulator's) and then its item."
    )
    if quick:
        notes.append("--quick: tiny sizes; the figures show that the code runs, not the design.")
    table = md_table(header, rows) + "\n\nThroughput and store latency by frame size:\n\n" + md_table(sweep_header, sweep_rows)
    return Result("Large frames: worker memory", command, s, table, {"runs": runs, "by_size": sweep}, notes)
