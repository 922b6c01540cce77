"""Hostile peers: each attack on one worker, beside healthy neighbours.

One worker against the emulator and the local upstream (a process), holding
``neighbours`` healthy connections (the upstream's ordinary frames, ``rate`` a second
each) and, once they store, one hostile connection whose URL asks the upstream for an
attack (:mod:`sim.upstream.kinds`):

* ping flood: ``ping_flood=<n>``: PINGs, 125-byte payloads, and nothing read of ours;
* amplification: ``amplify=<bytes>&amplify_with=zeros``: every tenth seq one frame of
  that many bytes of ``[0,0,...]``;
* firehose: ``firehose=<n>``: frames as fast as the worker reads them (a peer faster than
  the store: the worker must stop reading it, not buffer it, nor starve the others);
* slow handshake: ``slow_handshake=3600``: the upgrade never answered within the worker's
  open timeout;
* none (the full run only): no hostile connection, the baseline.

Each case on a fresh emulator, upstream and worker; measured over ``window_s`` from the
hostile START: the worker's peak resident memory (``VmHWM`` at the end) less its resident
memory just before; the longest event-loop stall (the lag probe's ``loop_lag_max_ms``);
the neighbours' longest gap between stored frames (their ``received_at_ms``); the first
``last_error`` the hostile connection's item carries and when (read from the table every
``poll_s``); the worker's CPU per stored message (its CPU time over the window, from
/proc, over every message it stored in the window, the hostile one's included).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

from sim.processes import eventually
from wsfleet import schema, settings_spec
from wsfleet.sinks import MessagesStore

from .common import Result, Rig, fmt, md_table, proc_cpu_s
from .largeframes import vm

HOSTILE = "hostile"
# Bounds of issue 34 (CONTRACT.md section 3): what a line is judged against.
NEIGHBOUR_GAP_MS = 1000
LAST_ERROR_S = 30.0
RSS_BOUND_MB = {"ping flood": 100, "amplification": 300}
CPU_MS_PER_MESSAGE = 0.5


def attacks(quick: bool) -> dict[str, str | None]:
    """Attack -> the hostile URL's query (None: no hostile connection)."""
    frame = (2 << 20) if quick else (30 << 20)
    return {
        "ping flood": "ping_flood=2000",
        "amplification": f"amplify={frame}&amplify_every=10&amplify_with=zeros",
        "firehose": "firehose=5000",
        "slow handshake": "slow_handshake=3600",
        **({} if quick else {"none": None}),
    }


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "quick": quick,
        # 100 x 2/s: the load the ingestion benchmark's CPU per message is measured at.
        "neighbours": 2 if quick else 100,
        "rate": 2.0,  # frames a second, each healthy stream: their ordinary gap is 500 ms
        "window_s": 2.0 if quick else 40.0,
        "poll_s": 0.5,
        "timeout_s": 60.0,
        "worker": {settings_spec.METRICS_SECONDS: 1, settings_spec.MAX_CONNECTIONS: 110},
    }


def longest_gap_ms(received: list[int]) -> int | None:
    return max((b - a for a, b in itertools.pairwise(sorted(received))), default=None)


def start(rig: Rig, cid: str, url: str) -> None:
    """The router's START write and its SQS hint (the worker takes it at once)."""
    rig.connections.start(cid, url)
    rig.sqs.send_message(QueueUrl=rig.aws_env["QUEUE_URL"], MessageBody=json.dumps({schema.HINT_CONNECTION_ID: cid}))


def run_one(run_dir: Path, s: dict[str, Any], query: str | None) -> dict[str, Any]:
    """One attack (``query``: the hostile URL's, or None for the baseline) on a fresh rig."""
    with Rig(run_dir) as rig:
        upstream = rig.upstream(rate=s["rate"])
        worker = rig.worker("w1", dict(s["worker"]))
        messages = MessagesStore(rig.ddb, rig.aws_env[settings_spec.MESSAGES_TABLE_NAME])
        healthy = [f"n{i}" for i in range(1, s["neighbours"] + 1)]
        for cid in healthy:
            start(rig, cid, upstream.url_for(cid))
        eventually(lambda: all(len(messages.read_all(c)) >= 2 for c in healthy), s["timeout_s"], "the neighbours storing",
                   interval=0.2)
        base = vm(worker.pid)["VmRSS"]
        cpu0, t0 = proc_cpu_s(worker.pid), time.time()
        if query is not None:
            start(rig, HOSTILE, upstream.url_for(HOSTILE) + "?" + query)
        error, error_s = None, None
        end = t0 + s["window_s"]
        while (now := time.time()) < end:
            if error is None and query is not None:
                error = (rig.connections.get(HOSTILE) or {}).get(schema.LAST_ERROR)
                error_s = now - t0 if error else None
            time.sleep(min(s["poll_s"], max(0.0, end - now)))
        alive = worker.proc.alive()
        cpu_s = proc_cpu_s(worker.pid) - cpu0 if alive else None
        peak = vm(worker.pid)["VmHWM"] if alive else None
        lags = [x.lag_max_ms for x in worker.stats() if t0 <= x.ts <= end and x.lag_max_ms is not None]
        t0_ms, end_ms = int(t0 * 1000), int(end * 1000)

        def received(cid: str) -> list[int]:
            rows = messages.read_all(cid)
            return [int(r[schema.RECEIVED_AT_MS]) for r in rows if t0_ms <= int(r[schema.RECEIVED_AT_MS]) <= end_ms]

        per_neighbour = {cid: received(cid) for cid in healthy}
        hostile = received(HOSTILE) if query is not None else []
        stored = sum(map(len, per_neighbour.values())) + len(hostile)
        return {
            "query": query,
            "worker_alive": alive,
            "rss_base_mb": base,
            "vm_hwm_mb": peak,
            "rss_growth_mb": None if peak is None else peak - base,
            "loop_lag_max_ms": max(lags, default=None),
            "neighbour_max_gap_ms": max((g for r in per_neighbour.values() if (g := longest_gap_ms(r)) is not None),
                                        default=None),
            "neighbour_messages": stored - len(hostile),
            "hostile_messages": len(hostile),
            "last_error": error,
            "last_error_s": error_s,
            "cpu_s": cpu_s,
            "cpu_ms_per_message": cpu_s * 1000 / stored if cpu_s is not None and stored else None,
            "window_s": end - t0,
        }


def verdict(attack: str, r: dict[str, Any]) -> str:
    """What the line misses of the issue's bounds ("ok" if nothing)."""
    missed = [] if r["worker_alive"] else ["worker died"]
    bound = RSS_BOUND_MB.get(attack)
    if bound is not None and r["rss_growth_mb"] is not None and r["rss_growth_mb"] >= bound:
        missed.append(f"RSS +{r['rss_growth_mb']:.0f} MB >= {bound}")
    if r["neighbour_max_gap_ms"] is None or r["neighbour_max_gap_ms"] > NEIGHBOUR_GAP_MS:
        missed.append(f"neighbour gap > {NEIGHBOUR_GAP_MS} ms")
    if r["query"] is not None and (r["last_error_s"] is None or r["last_error_s"] > LAST_ERROR_S):
        missed.append(f"no last_error within {min(LAST_ERROR_S, r['window_s']):.0f} s")
    if r["cpu_ms_per_message"] is not None and r["cpu_ms_per_message"] > CPU_MS_PER_MESSAGE:
        missed.append(f"CPU > {CPU_MS_PER_MESSAGE} ms/message")
    return "; ".join(missed) or "ok"


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    s = settings_for(quick)
    # --quick (the test suite's smoke run): the firehose alone (the other attacks have
    # smoke runs of their own: amplification's, and the tests'), a short window.
    chosen = {"firehose": attacks(quick)["firehose"]} if quick else attacks(quick)
    runs, rows = {}, []
    for attack, query in chosen.items():
        print(f"    {attack}: {query or 'no hostile connection'}", flush=True)
        r = runs[attack] = run_one(run_dir / f"hostile-{attack.replace(' ', '-')}", s, query)
        error = r["last_error"]
        rows.append([
            attack,
            query or "-",
            "yes" if r["worker_alive"] else "NO",
            fmt(r["rss_growth_mb"], 0),
            fmt(r["loop_lag_max_ms"], 0),
            fmt(r["neighbour_max_gap_ms"], 0),
            "-" if query is None else (f"{r['last_error_s']:.1f} s: {error.split(':')[0]}" if error else "none"),
            f"{r['neighbour_messages']} + {r['hostile_messages']}",
            fmt(r["cpu_ms_per_message"], 3),
            verdict(attack, r),
        ])
    header = ["attack", "hostile URL query", "worker lives", "worker peak RSS growth MB", "longest loop stall ms",
              "neighbours' longest gap ms", "hostile last_error (after, budget)", "stored: neighbours + hostile",
              "worker CPU ms per stored message", "bounds missed"]
    notes = [
        f"One worker: {s['neighbours']} healthy connections at {s['rate']:g} frames/s each (ordinary gap "
        f"{1000 / s['rate']:.0f} ms) and, once they store, one hostile connection; measured over {s['window_s']:g} s "
        "from its START; a fresh emulator, upstream and worker per attack.",
        "RSS growth: VmHWM at the end less VmRSS before the hostile START. Loop stall: the lag probe's maximum "
        "(loop_lag_max_ms). Neighbours' gap: between their stored items' received_at_ms. last_error: the hostile "
        f"item's, read every {s['poll_s']:g} s. CPU: the worker's (/proc) over the window, over every message stored "
        "in it, the hostile one's included.",
        f"Bounds (hostile peers): the worker lives; RSS growth < {RSS_BOUND_MB['ping flood']} MB (ping flood), "
        f"< {RSS_BOUND_MB['amplification']} MB (a 30 MiB amplification frame); neighbours' gap <= {NEIGHBOUR_GAP_MS} ms; "
        f"a last_error within {LAST_ERROR_S:g} s; CPU <= {CPU_MS_PER_MESSAGE} ms a message.",
    ]
    if quick:
        notes.append("--quick: the firehose only, a short window; the figures show that the code runs, not the design.")
    return Result("Hostile peers: each attack beside healthy neighbours", command, s, md_table(header, rows),
                  {"runs": runs}, notes)
