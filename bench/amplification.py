"""Amplification: one frame built to be costly to parse, beside a healthy connection.

One worker against the emulator and the local upstream (a process), holding two
connections: ``healthy`` (the upstream's ordinary frames) and ``hostile``, whose every
``every``-th seq the upstream sends as one frame of ``frame_bytes`` made of tiny values
(the ``amplify=`` kind: ``[{},{},...]``, or ``[0,0,...]``), between ordinary frames.
Each case runs twice, each with a fresh emulator, upstream and worker:

* before: the worker of commit ``BEFORE_COMMIT`` (every frame parsed on the event loop),
  taken from git into the run's directory;
* after: this worker (a frame over ``OFF_LOOP_BYTES`` parsed in the decoder's child,
  within its memory budget).

Per run, from the first amplification frame: the worker's peak resident memory
(``VmHWM`` at the end) less its resident memory just before that frame; the longest
event-loop stall (the worker's lag probe: ``loop_lag_max_ms`` of its ``stats`` line); the
healthy neighbour's longest gap between frames received (``received_at_ms`` of its
stored items); what was stored at the amplified seq; and the decoder child's peak
resident memory.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from sim import children
from sim.processes import eventually
from wsfleet import schema, settings_spec
from wsfleet.sinks import MessagesStore
from wsfleet.budget import DECODE_FACTOR
from wsfleet.worker.decoder import OFF_LOOP_BYTES

from .common import Result, Rig, fmt, md_table
from .largeframes import vm

# The last commit before the decoder: its worker parses every frame on the event loop.
BEFORE_COMMIT = "733bae2"
HEALTHY, HOSTILE = "healthy", "hostile"
CASES = (("objects", "[{},{},...]"), ("zeros", "[0,0,...]"))


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "quick": quick,
        "frame_bytes": (2 << 20) if quick else (30 << 20),
        "rate": 2.0,  # frames a second, each stream: the neighbour's ordinary gap is 500 ms
        "every": 10,  # the hostile stream's seq 10 (5 s in) is the amplification frame
        "timeout_s": 120.0,
        "worker": {settings_spec.METRICS_SECONDS: 1, settings_spec.MAX_CONNECTIONS: 10},
    }


def before_runtime(run_dir: Path) -> Path:
    """The ``wsfleet`` package of ``BEFORE_COMMIT``, from git, in ``run_dir/before``: a
    directory for the front of a worker's PYTHONPATH."""
    dest = run_dir / "before"
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(children.SIM_ROOT), "archive", BEFORE_COMMIT, "runtime/wsfleet"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest), "--strip-components=1"], input=archive, check=True)
    return dest


def received_gaps_ms(messages: MessagesStore, cid: str) -> int | None:
    received = [int(r["received_at_ms"]) for r in messages.read_all(cid)]
    return max((b - a for a, b in itertools.pairwise(received)), default=None)


def run_one(run_dir: Path, s: dict[str, Any], amplify_with: str, runtime: Path | None) -> dict[str, Any]:
    every = s["every"]
    with Rig(run_dir) as rig:
        upstream = rig.upstream(rate=s["rate"])
        settings = dict(s["worker"])
        if runtime is not None:
            settings["PYTHONPATH"] = os.pathsep.join([str(runtime), children.child_env()["PYTHONPATH"]])
        worker = rig.worker("w1", settings)
        messages = MessagesStore(rig.ddb, rig.aws_env[settings_spec.MESSAGES_TABLE_NAME])
        rig.connections.start(HEALTHY, upstream.url_for(HEALTHY))
        rig.connections.start(HOSTILE, upstream.url_for(HOSTILE)
                              + f"?amplify={s['frame_bytes']}&amplify_every={every}&amplify_with={amplify_with}")

        def stored(cid: str) -> int:
            return len(messages.read_all(cid))

        # Both held and storing, well before the amplification frame: the baseline.
        eventually(lambda: stored(HEALTHY) >= 3 and stored(HOSTILE) >= 3, s["timeout_s"], "both storing", interval=0.1)
        base = vm(worker.pid)["VmRSS"]
        began = time.monotonic()
        eventually(lambda: stored(HOSTILE) > every + 1, s["timeout_s"], "past the amplification frame", interval=0.25)
        took = time.monotonic() - began
        last = worker.next_stats()
        peak = vm(worker.pid)["VmHWM"]
        line = worker.events("stats")[-1]
        child_pid = (line.get("decoder") or {}).get("child_pid")
        row = next(r for r in messages.read_all(HOSTILE) if r["sk"] == every)
        return {
            "amplify_with": amplify_with,
            "frame_bytes": s["frame_bytes"],
            "runtime": "before" if runtime is not None else "after",
            "rss_base_mb": base,
            "vm_hwm_mb": peak,
            "rss_growth_mb": peak - base,
            "loop_lag_max_ms": last.lag_max_ms,
            "neighbour_max_gap_ms": received_gaps_ms(messages, HEALTHY),
            "stored_at_amplified_seq": row.get(schema.SKIPPED) or ("data_ref" if schema.DATA_REF in row else "inline"),
            "decoder": line.get("decoder"),
            "decoder_child_vm_hwm_mb": vm(child_pid)["VmHWM"] if child_pid else None,
            "seconds_to_pass_it": took,
        }


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    # --quick (the test suite's smoke run): this worker on one shape; the comparison with
    # the worker before the decoder is the full run's.
    workers = (("after", None),) if quick else (("before", before_runtime(run_dir)), ("after", None))
    runs, rows = {}, []
    for amplify_with, shape in CASES[:1] if quick else CASES:
        for label, runtime in workers:
            print(f"    {label}: one {s['frame_bytes'] >> 20} MiB frame of {shape}", flush=True)
            r = runs[f"{amplify_with} {label}"] = run_one(run_dir / f"amplification-{amplify_with}-{label}", s,
                                                         amplify_with, runtime)
            rows.append([
                f"{s['frame_bytes'] >> 20} MiB of {shape}",
                f"before ({BEFORE_COMMIT}: on the loop)" if label == "before" else "after (decoder's child)",
                fmt(r["rss_growth_mb"], 0),
                fmt(r["loop_lag_max_ms"], 0),
                fmt(r["neighbour_max_gap_ms"], 0),
                r["stored_at_amplified_seq"],
                fmt(r["decoder_child_vm_hwm_mb"], 0),
            ])
    header = ["frame", "worker", "worker peak RSS growth MB", "longest loop stall ms", "neighbour's longest gap ms",
              "stored at that seq", "decoder child peak RSS MB"]
    notes = [
        f"One worker, two connections at {s['rate']:g} frames/s each (the neighbour's ordinary gap is "
        f"{1000 / s['rate']:.0f} ms); the hostile one's seq {s['every']} is one frame of {s['frame_bytes']:,} bytes "
        "(sim.upstream's amplify= kind); fresh emulator, upstream and worker per run.",
        "Worker peak RSS growth: VmHWM at the end less VmRSS before the frame. Longest loop stall: the lag probe's "
        "maximum (loop_lag_max_ms, every 0.25 s). Neighbour's gap: between its stored items' received_at_ms.",
        f"After: frames over {OFF_LOOP_BYTES >> 10} KiB are parsed in the decoder's child, whose address space may "
        f"grow by {DECODE_FACTOR} x MAX_FRAME_BYTES beyond the frame; a frame past that is an over_frame_limit marker.",
    ]
    if quick:
        notes.append("--quick: a small frame, one shape, this worker only; the figures show that the code runs, not the design.")
    return Result("Amplification: one frame of tiny values", command, s, md_table(header, rows), {"runs": runs}, notes)
