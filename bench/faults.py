"""Faults: a fleet under DynamoDB throttling, injected in the emulator.

The nemesis is the emulator's fault switch (``POST /_wsfleet/faults``, see
:class:`sim.emulator.Faults`): for 30 s it answers a share of ALL DynamoDB
requests, picked at random with a printed seed, with DynamoDB's own
``ThrottlingException``; the workers are separate processes and know nothing of it.
The workload is a small fleet (3 workers, so that every session has watchers) holding
12 connections that receive frames. The audit trusts only independent evidence: the
upstream's socket books (a socket reopened is a connection that was dropped), the
connection items (a new fence is a new owner), and the messages table (every stored
seq gap-free from 1), plus what the workers' logs say went wrong.

Per setting (lease / heartbeat) and per throttled share, it reports: connections lost,
sockets reopened, gaps, sessions lost, renewal retries and how close a renewal came to
its deadline. Beside the measurements, :func:`session_loss` computes from the renewal
retry cadence (``SessionTiming.renew_retry_s``) how likely a session is to be lost:
after its last successful renewal a worker has ``lease - skew`` seconds, of which the
first heartbeat passes before it tries again; it then tries every 80-160 ms, and
each try fails independently with the throttled share p. The session is lost only if
every try until the deadline fails. It is computed twice: as specified (one request
per try), and as the worker's DynamoDB client is configured today: botocore's
``retries={"max_attempts": 1}`` means one *retry*, so each try is up to two requests,
the second after botocore's own 0-1 s jittered backoff (until botocore's retry quota,
500 tokens at 5 per throttled retry, runs out, after which tries are single again).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from wsfleet import settings_spec
from wsfleet import schema
from wsfleet.leases import SessionTiming
from sim.emulator import faults, set_faults
from sim.processes import eventually
from wsfleet.sinks import MessagesStore

from .common import Result, Rig, UpstreamProcess, Window, WorkerProcess, fmt, md_table

TRY_LATENCY_S = 0.005  # a throttled answer's round trip, on top of the retry pause (assumed)
SAMPLES = 20_000  # Monte Carlo draws of the number of tries that fit before the deadline


@dataclass(frozen=True)
class Setting:
    lease_s: float
    heartbeat_s: float
    skew_ms: int = 1000

    @property
    def label(self) -> str:
        return f"lease {self.lease_s:g} / hb {self.heartbeat_s:g} s"

    def timing(self) -> SessionTiming:
        return SessionTiming(round(self.lease_s * 1000), round(self.heartbeat_s * 1000), self.skew_ms)


SETTINGS = [Setting(6, 1.5), Setting(10, 2.5)]
QUICK_SETTINGS = [Setting(3, 0.75, 200)]


def settings_for(quick: bool) -> dict[str, Any]:
    return {
        "settings": [vars(s) for s in (QUICK_SETTINGS if quick else SETTINGS)],
        "workers": 3,
        "connections": 4 if quick else 12,
        "rate_per_connection": 2.0,
        "phases": [(0.5, 2.0), (0.9, 2.0)] if quick else [(0.5, 30.0), (0.9, 30.0)],  # (throttled share, seconds)
        "settle_s": 1.0 if quick else 5.0,
        "recover_s": 1.0 if quick else 5.0,  # after the fault, beyond one lease, before the audit
        "seed": random.SystemRandom().getrandbits(32),
    }


# --- the model ---------------------------------------------------------------------------------


def session_loss(
    p: float, timing: SessionTiming, *, rng: random.Random, samples: int = SAMPLES, client_retry: bool = False
) -> dict[str, float]:
    """How likely a session is to be lost when each DynamoDB request fails independently
    with probability ``p``: per renewal cycle, per hour, and per 30 s. ``client_retry``:
    each try is two requests, 0-1 s apart (botocore's one retry)."""
    window = (timing.lease_ms - timing.max_clock_skew_ms - timing.heartbeat_ms) / 1000
    total = 0.0
    tries_seen = []
    for _ in range(samples):
        # On the path where every request fails: count the requests sent before the deadline.
        tries, t = 0, 0.0
        while t < window:
            tries += 1
            if client_retry:
                t += TRY_LATENCY_S + rng.random()
                if t >= window:
                    break
                tries += 1
            t += TRY_LATENCY_S + timing.renew_retry_s(rng)
        tries_seen.append(tries)
        total += p ** tries
    per_cycle = total / samples
    cycles_per_hour = 3600 / (timing.heartbeat_ms / 1000)

    def within(cycles: float) -> float:
        return -math.expm1(cycles * math.log1p(-per_cycle)) if per_cycle < 1 else 1.0

    return {
        "p": p,
        "window_s": window,
        "tries_min": min(tries_seen),
        "tries_median": sorted(tries_seen)[len(tries_seen) // 2],
        "per_cycle": per_cycle,
        "per_hour": within(cycles_per_hour),
        "per_30s": within(cycles_per_hour / 120),
    }


# --- the audit ---------------------------------------------------------------------------------


def stored_ends(
    rig: Rig, messages: MessagesStore, ids: Sequence[str], since: Mapping[str, int] | None = None
) -> dict[str, tuple[int, int]]:
    """Per connection, read back from the messages table: (the highest seq stored, the
    end of what is stored gap-free from 1). ``end < highest`` is a gap. The highest is
    read first, so frames a live worker stores meanwhile may only raise the end: a gap
    is never reported for a write that merely landed between the two reads. ``since``:
    ends already read gap-free from 1 (by an earlier call or ``stored_end``), so only
    what lies past them is read again."""
    out = {}
    for cid in ids:
        newest = rig.ddb.query(
            TableName=rig.aws_env["MESSAGES_TABLE_NAME"], KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": {"S": schema.connection_pk(cid)}}, ScanIndexForward=False, Limit=1,
            ProjectionExpression="sk",
        )["Items"]
        highest = int(newest[0]["sk"]["N"]) if newest else 0
        out[cid] = (highest, messages.stored_end(cid, (since or {}).get(cid, 0)))
    return out


# --- the run -----------------------------------------------------------------------------------


class Scenario:
    def __init__(self, rig: Rig, st: Setting, p: dict[str, Any], rng: random.Random) -> None:
        self.rig, self.st, self.p, self.rng = rig, st, p, rng
        self.upstream: UpstreamProcess | None = None
        self.workers: list[WorkerProcess] = []
        self.ids = [f"flt{i:03d}" for i in range(p["connections"])]
        self.messages = MessagesStore(rig.ddb, rig.aws_env["MESSAGES_TABLE_NAME"])

    def say(self, line: str) -> None:
        print(f"    [{self.st.label}] {line}", flush=True)

    def run(self) -> list[dict[str, Any]]:
        rig, st = self.rig, self.st
        env = {settings_spec.LEASE_SECONDS: st.lease_s, settings_spec.HEARTBEAT_SECONDS: st.heartbeat_s, settings_spec.MAX_CLOCK_SKEW_MS: st.skew_ms,
               settings_spec.METRICS_SECONDS: 1}
        self.upstream = rig.upstream(self.p["rate_per_connection"])
        self.workers = [rig.worker(f"w{i + 1}", env) for i in range(self.p["workers"])]
        rig.start_connections(self.ids, self.upstream, hint=True)
        eventually(lambda: self.upstream.open_sockets() == len(self.ids), 60, "every socket open", interval=0.2)
        time.sleep(self.p["settle_s"] + 2 * st.heartbeat_s)
        return [self.phase(share, seconds) for share, seconds in self.p["phases"]]

    def _books(self) -> dict[str, dict]:
        return self.upstream.stats()["streams"]

    def phase(self, share: float, seconds: float) -> dict[str, Any]:
        rig, url = self.rig, self.rig.emulator.endpoint_url
        items_before = {cid: rig.connections.get(cid) for cid in self.ids}
        books_before = self._books()
        stats_before = [w.stats()[-1] for w in self.workers]
        seed = self.rng.getrandbits(32)
        set_faults(url, throttle=share, seed=seed)
        on = time.time()
        time.sleep(seconds)
        counts = faults(url)
        set_faults(url, throttle=0)
        off = time.time()
        time.sleep(self.st.lease_s + self.p["recover_s"])  # a session lost at the very end is taken over by now
        stats_after = [w.next_stats() for w in self.workers]
        books_after = self._books()
        items_after = {cid: rig.connections.get(cid) for cid in self.ids}
        windows = [Window.between(a, b) for a, b in zip(stats_before, stats_after, strict=True)]
        events = [e for w in self.workers for e in w.events() if e.get("ts", 0) >= on]
        throttled, passed = sum(counts["throttled"].values()), sum(counts["passed"].values())
        stored = stored_ends(rig, self.messages, self.ids)
        gaps = [cid for cid, (highest, end) in stored.items() if end < highest]
        behind = [books_after.get(cid, {}).get("produced", 0) - end for cid, (_, end) in stored.items()]
        retries = [e for e in events if e["event"] == "renew_retry"]
        out = {
            "share": share, "seconds": seconds, "seed": seed, "on": on, "off": off,
            "throttled": throttled, "passed": passed, "throttled_by_op": counts["throttled"],
            "connections_lost": sum(w.counters["LeasesLost"] for w in windows),
            "new_owners": sorted(c for c in self.ids if (items_after[c] or {}).get(schema.FENCE_TOKEN)
                                 != (items_before[c] or {}).get(schema.FENCE_TOKEN)),
            "sockets_reopened": sum(books_after[c]["sockets_opened"] - books_before[c]["sockets_opened"] for c in self.ids),
            "overlaps": sum(books_after[c]["overlaps"] for c in self.ids),
            "gaps": gaps,
            "max_behind_after": max(behind),
            "sessions_lost": sum(1 for e in events if e["event"] == "session_lost"),
            "renew_retries": len(retries),
            "closest_to_deadline_s": min((e["left_s"] for e in retries), default=None),
            "write_retries": sum(1 for e in events if e["event"] == "transient_error"),
            "dropped": [(e.get("connection_id"), e.get("why")) for e in events if e["event"] == "connection_dropped"],
            "deadline_passed_while_writing": sum(1 for e in events if e["event"] == "deadline_passed_while_writing"),
            "messages_stored": sum(w.counters["MessagesStored"] for w in windows),
        }
        self.say(f"throttle {share:.0%} for {seconds:g} s (seed {seed}): {throttled}/{throttled + passed} throttled; "
                 f"lost {out['connections_lost']}, reopened {out['sockets_reopened']}, gaps {len(gaps)}, sessions lost "
                 f"{out['sessions_lost']}, closest renewal {fmt(out['closest_to_deadline_s'])} s before its deadline")
        return out


def run(*, quick: bool, run_dir: Path, command: str) -> Result:
    p = settings_for(quick)
    rng = random.Random(p["seed"])
    print(f"    seed {p['seed']}", flush=True)
    results = []
    for i, raw in enumerate(p["settings"]):
        st = Setting(**raw)
        with Rig(run_dir / f"faults-{i}") as rig:
            phases = Scenario(rig, st, p, rng).run()
        model = {
            share: {kind: session_loss(share, st.timing(), rng=random.Random(p["seed"] + i), client_retry=kind == "configured")
                    for kind in ("specified", "configured")}
            for share in (0.5, 0.9)
        }
        results.append({"setting": raw, "phases": phases, "model": model})
    return _result(p, results, command, quick)


def _result(p: dict[str, Any], results: list[dict], command: str, quick: bool) -> Result:
    header = ["setting, throttled share for 30 s", "throttled (measured)", "connections lost", "sockets reopened", "gaps",
              "sessions lost", "renewal retries; closest to deadline", "target: 0 lost, 0 reopened, 0 gaps",
              "P(a session lost) in 30 s, computed: specified / configured"]
    rows = []
    for r in results:
        st = Setting(**r["setting"])
        for ph in r["phases"]:
            m = r["model"][ph["share"]]
            chance = [1 - (1 - m[kind]["per_30s"]) ** p["workers"] for kind in ("specified", "configured")]
            clean = ph["connections_lost"] == 0 and ph["sockets_reopened"] == 0 and not ph["gaps"]
            verdict = ("met" if clean else "MISSED") if ph["share"] == 0.5 else ("clean" if clean else "not clean (no target)")
            total = ph["throttled"] + ph["passed"]
            rows.append([
                f"{st.label}, {ph['share']:.0%} for {ph['seconds']:g} s",
                f"{ph['throttled'] / total * 100:.0f} % of {total}" if total else "-",
                f"{ph['connections_lost']} (new owners {len(ph['new_owners'])})",
                str(ph["sockets_reopened"]),
                str(len(ph["gaps"])),
                str(ph["sessions_lost"]),
                f"{ph['renew_retries']}; {fmt(ph['closest_to_deadline_s'])} s",
                verdict,
                f"{chance[0]:.2g} / {chance[1]:.2g} (any of {p['workers']} workers)",
            ])
    model_rows = []
    for r in results:
        st = Setting(**r["setting"])
        for share, kinds in r["model"].items():
            for kind, m in kinds.items():
                model_rows.append([st.label, f"{share:.0%}", kind, f"{m['window_s']:g} s", f"{m['tries_min']} / {m['tries_median']}",
                                   f"{m['per_cycle']:.3g}", f"{m['per_hour']:.3g}", f"{m['per_30s']:.3g}"])
    markdown = "\n".join([
        md_table(header, rows),
        "",
        "Session loss computed from the renewal retry cadence:",
        "",
        md_table(["setting", "throttled share p", "tries", "window (lease - skew - heartbeat)",
                  "requests in it (min / median)", "P(lost) per renewal cycle = E[p^requests]", "per hour", "per 30 s"],
                 model_rows),
    ])
    notes = [
        f"{p['workers']} workers, {p['connections']} connections at {p['rate_per_connection']:g} msg/s each (FLUSH_INTERVAL_MS "
        f"100, RECONCILE 10 s, CHECKPOINT 120 s: the defaults), MAX_CLOCK_SKEW_MS {Setting(**p['settings'][0]).skew_ms}; each share for its time, then off "
        f"for lease + {p['recover_s']:g} s before the audit. Seed " + str(p["seed"]) + " (each phase's own seed is in the raw JSON).",
        "Throttled: the emulator answers that share of every DynamoDB request (every operation, every worker) with "
        "ThrottlingException (HTTP 400) without passing it on. Sockets reopened are counted on the upstream's books; gaps "
        "by reading back each stream's messages (stored gap-free from 1 up to the highest seq).",
        f"The model: tries {TRY_LATENCY_S * 1000:g} ms + renew_retry_s (80-160 ms) apart, from the first heartbeat after the "
        "last success until lease - skew after it; a renewal cycle fails only if every request does; "
        f"{SAMPLES:,} draws; per hour = 1 - (1 - per cycle)^(3600 / heartbeat). 'specified': one request per try, as "
        "session.py intends; 'configured': each try is two requests 0-1 s apart, as the worker's boto3 client "
        "(retries max_attempts 1 = one retry) sends them until botocore's retry quota runs out: the measured runs sit "
        "between the two.",
    ]
    for r in results:
        st = Setting(**r["setting"])
        for ph in r["phases"]:
            if ph["dropped"] or ph["deadline_passed_while_writing"] or ph["gaps"]:
                whys = sorted({str(why) for _, why in ph["dropped"]})
                notes.append(
                    f"{st.label}, {ph['share']:.0%}: {ph['deadline_passed_while_writing']} message batches given up "
                    f"(deadline_passed_while_writing), {len(ph['dropped'])} connections dropped by their workers "
                    f"({', '.join(whys) or '-'}), gaps in {', '.join(ph['gaps']) or 'none'}; {ph['write_retries']} "
                    "transient_error retries; throttled by operation: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(ph["throttled_by_op"].items())))
    if quick:
        notes.append("--quick: tiny sizes and fast timings; the figures show that the code runs, not the design.")
    return Result("Faults", command, p, markdown, {"params": p, "results": results}, notes)
