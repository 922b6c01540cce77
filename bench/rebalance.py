"""Rebalancing on the embedded fleet: workers join a fleet that holds connections, at the
worker's default timings (lease 10 s, heartbeat 2.5 s, reconcile 10 s, flush 100 ms,
checkpoint 120 s) and rebalancing defaults (REBALANCE on, REBALANCE_TOLERANCE 0.1,
MAX_CONNECTIONS 100: at most 20 moves per balance pass).

Per join size (1 and 4 workers), a fresh :class:`~sim.fleet.Fleet` of 4 workers
holding 100 connections STARTed through the API; the join waits ``MIN_HOLD_S`` (60 s)
after the connections are placed, since a connection held for less is never moved. Then
the new workers start (no STARTs) and, from the upstream's socket books (exact, in this
process) and the observer's ownership samples:

* time to balance: from starting the new workers until each holds its fair share ± 1;
* moves: connections that got a new socket after the join, against the excess (what the
  workers held above their new fair share just before it), and how many moved twice;
* per moved connection, socket to socket: how long its stream had no socket (old socket
  closed -> new one open), and no two sockets on one stream at any moment;
* after STOPping everything, every stream's stored messages gap-free up to its checkpoint.

After the join of 1, the balanced fleet is watched for a steady window, and every move in
it counted (new sockets on the books, ``rebalance_shed`` in the workers' logs).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from wsfleet import schema
from sim import report
from sim.children import EmulatorProcess
from sim.fleet import Fleet
from sim.processes import eventually
from sim.timing import Timing
from wsfleet.store import marshal, unmarshal
from wsfleet.balance import max_moves
from wsfleet.worker.balancer import MIN_HOLD_S

from .common import Result, distribution, fmt, md_table

TARGET_BALANCE_S = 30.0  # the issue's: a worker joining 4 holding 100 reaches fair share ± 1 within 30 s
TARGET_GAP_P99_S = 1.0


def settings_for(quick: bool, join4_only: bool = False) -> dict[str, Any]:
    """``join4_only``: only the join of 4 into 4 (the gap figure's hardest case), no crash."""
    return {
        "workers": 2 if quick else 4,
        "connections": 6 if quick else 100,
        "joins": [4] if join4_only else [1] if quick else [1, 4],
        "crash": not join4_only,
        "rate_per_connection": 1.0,
        "hold_s": 0.0 if quick else MIN_HOLD_S,  # after placement, before the join
        "balance_timeout_s": 8.0 if quick else 120.0,
        "settle_s": 2.0 if quick else 20.0,  # watched after balance, for late moves
        # before the join: no shed for quiet_s (about three balance passes), at most quiet_timeout_s
        "quiet_s": 0.0 if quick else 45.0,
        "quiet_timeout_s": 0.0 if quick else 150.0,
        "steady_s": 0.0 if quick else 240.0,  # the balanced fleet, after the join of 1
        "sample_interval_s": 0.5 if quick else 1.0,
        # the crash spread: a fleet of crash_workers, the busiest killed; watched crash_watch_s
        # after its dead session left the ring (no rebalance may move anything then)
        "crash_workers": 3 if quick else 5,
        "crash_timeout_s": 20.0 if quick else 60.0,
        "crash_watch_s": 2.0 if quick else 45.0,
        "timing": (
            dict(lease_s=2, heartbeat_s=0.5, reconcile_s=0.5, skew_ms=100, flush_ms=100, shutdown_s=5, checkpoint_s=1)
            if quick
            else dict(lease_s=10, heartbeat_s=2.5, reconcile_s=10, skew_ms=1000, flush_ms=100, shutdown_s=25, checkpoint_s=120)
        ),
    }


def within_share(counts: dict[str, int], names: list[str], total: int, workers: int) -> bool:
    share = total / workers
    return all(abs(counts.get(n, 0) - share) <= 1 for n in names)


def off_share(counts: dict[str, int], names: list[str]) -> float:
    """The largest distance of any of ``names`` from its fair share of what they hold."""
    total = sum(counts.get(n, 0) for n in names)
    return max((abs(counts.get(n, 0) - total / len(names)) for n in names), default=0.0)


class Join:
    """One fleet: place the connections, hold, join ``n`` workers, watch, audit."""

    def __init__(self, fleet: Fleet, p: dict[str, Any], n: int) -> None:
        self.fleet = fleet
        self.p = p
        self.n = n

    def say(self, line: str) -> None:
        print(f"    [join {self.n}] {line}", flush=True)

    def start_workers(self, names: list[str]) -> float:
        at = time.time()
        for name in names:
            self.fleet.start_worker(name, wait=False)
        for name in names:
            self.fleet.wait_started(name)
        return at

    def new_sockets(self, ids: list[str], since: float, until: float = math.inf) -> dict[str, int]:
        """Sockets opened per connection in [since, until]."""
        out = {}
        for cid in ids:
            k = sum(1 for r in self.fleet.upstream.sockets(cid) if since <= r.opened_at <= until)
            if k:
                out[cid] = k
        return out

    def summary(self) -> dict[str, Any]:
        """The fleet summary item as the workers read it (the harness's own read)."""
        resp = self.fleet._ddb.get_item(
            TableName=self.fleet.aws_env["SESSIONS_TABLE_NAME"],
            Key=marshal({schema.SESSION_ID: schema.FLEET_SUMMARY_ID}),
            ConsistentRead=True,
        )
        item = unmarshal(resp.get("Item", {}))
        keys = (schema.FLEET_WORKERS, schema.FLEET_ACTIVE, schema.FLEET_BELOW_SHARE, schema.FLEET_SUSPECTS, schema.FLEET_AT_MS)
        return {k: int(item.get(k, 0)) for k in keys}

    def sheds(self, since: float, until: float) -> int:
        return sum(
            e.get("count", 0)
            for name in self.fleet.workers
            for e in self.fleet.events(name)
            if e["event"] == "rebalance_shed" and since <= e["ts"] <= until
        )

    def place(self, workers: list[str], ids: list[str]) -> float:
        """Start the workers and the connections, hold them MIN_HOLD_S, then wait until
        the fleet has evened out the START burst's uneven placement (no shed for a few
        balance passes), so that what moves next is the next event's. Returns when the
        connections were all connected (epoch s)."""
        p, fleet = self.p, self.fleet
        self.start_workers(workers)
        for cid in ids:
            fleet.start_connection(cid)
        fleet.wait_connected(ids, timeout=60 + p["connections"] * 0.5)
        placed = time.time()
        self.say(f"{len(ids)} connections placed: {report._fmt_counts(fleet.sample().owned_counts(), workers)}; "
                 f"waiting MIN_HOLD_S ({p['hold_s']:g} s)")
        time.sleep(p["hold_s"])
        quiet_since, deadline = time.time(), time.time() + p["quiet_timeout_s"]
        while time.time() < deadline and time.time() - quiet_since < p["quiet_s"]:
            time.sleep(1)
            if self.sheds(quiet_since, time.time()):
                quiet_since = time.time()
        return placed

    def stop_and_audit(self, ids: list[str]) -> list:
        for cid in ids:
            self.fleet.stop_connection(cid)
        self.fleet.wait_quiet(ids, timeout=60)
        return self.fleet.audit(ids)

    def run(self) -> dict[str, Any]:
        p, fleet = self.p, self.fleet
        old = [f"w{i}" for i in range(1, p["workers"] + 1)]
        new = [f"w{i}" for i in range(p["workers"] + 1, p["workers"] + self.n + 1)]
        ids = [f"rb{i:03d}" for i in range(p["connections"])]
        placed = self.place(old, ids)
        evened = time.time() - placed - p["hold_s"]
        before = fleet.sample().owned_counts()
        total = sum(before.values())
        share = total / (p["workers"] + self.n)
        # Targets are floor(share) or one more (largest remainder): a shedder stops at its
        # target, so the moves are at most what the workers held above floor(share).
        excess = sum(max(0, c - math.floor(share)) for c in before.values())
        at = self.start_workers(new)
        self.say(f"before: {report._fmt_counts(before, old)}; {len(new)} joined ({', '.join(new)}), fair share {share:.1f}")

        summaries: list[dict[str, Any]] = []

        def balanced_at() -> float | None:
            now, seen = time.time(), self.summary()
            if not summaries or {k: v for k, v in seen.items() if k != schema.FLEET_AT_MS} != {
                k: v for k, v in summaries[-1].items() if k not in (schema.FLEET_AT_MS, "t_s")
            }:
                summaries.append({**seen, "t_s": round(now - at, 2)})  # what the summary said, as it changed
            for s in list(fleet.samples):
                if s.t >= at and within_share(s.owned_counts(), old + new, total, p["workers"] + self.n):
                    return s.t
            return None

        try:
            reached = eventually(balanced_at, p["balance_timeout_s"], "the new workers to reach their fair share", interval=1.0)
        except TimeoutError:
            reached = None
        time.sleep(p["settle_s"])
        watched = time.time()
        after = fleet.sample().owned_counts()
        moved = self.new_sockets(ids, at, watched)
        handoffs = [report.socket_handoff(fleet.upstream.sockets(cid), at, watched) for cid in moved]
        gaps = [opened - closed for closed, opened in filter(None, handoffs)]
        last_move = max((r.opened_at for cid in moved for r in fleet.upstream.sockets(cid) if r.opened_at >= at), default=None)
        self.say(f"after: {report._fmt_counts(after, old + new)} (furthest from fair share: {off_share(after, old + new):.1f}); "
                 "every worker at fair share ± 1 "
                 f"{'after ' + fmt(reached - at) + ' s' if reached else 'NOT reached'}; {len(moved)} moved (excess {excess})")
        steady: dict[str, Any] = {}
        if self.n == 1 and p["steady_s"]:
            self.say(f"steady window: {p['steady_s']:g} s")
            began = time.time()
            time.sleep(p["steady_s"])
            ended = time.time()
            steady = {
                "seconds": ended - began,
                "new_sockets": sum(self.new_sockets(ids, began, ended).values()),
                "sheds": self.sheds(began, ended),
                "counts": fleet.sample().owned_counts(),
            }
        audits = self.stop_and_audit(ids)
        return {
            "joined": new,
            "off_share": off_share(after, old + new),
            "before": before,
            "after": after,
            "share": share,
            "excess": excess,
            "balance_s": reached - at if reached else None,
            "last_move_s": last_move - at if last_move else None,
            "moves": sum(moved.values()),
            "moved_connections": len(moved),
            "moved_twice": sum(1 for k in moved.values() if k > 1),
            "gap_s": gaps,
            "overlaps": len(fleet.upstream.overlaps()),
            "data_gaps": sum(len(a.missing) for a in audits),
            "not_exact": [a.connection_id for a in audits if not a.ok],
            "steady": steady,
            "placed_to_join_s": at - placed,
            "evened_s": evened,
            "summaries": summaries,
            "sheds_s": [
                {"worker": e["worker_id"], "t_s": round(e["ts"] - at, 2), "count": e["count"]}
                for name in fleet.workers for e in fleet.events(name) if e["event"] == "rebalance_shed" and e["ts"] >= at
            ],
        }


class Crash(Join):
    """One fleet: place the connections, hold, kill -9 the busiest worker; where its
    connections end against the survivors' fair share, and what moves afterwards."""

    def say(self, line: str) -> None:
        print(f"    [crash] {line}", flush=True)

    def run(self) -> dict[str, Any]:
        p, fleet = self.p, self.fleet
        names = [f"w{i}" for i in range(1, p["crash_workers"] + 1)]
        ids = [f"cr{i:03d}" for i in range(p["connections"])]
        self.place(names, ids)  # held MIN_HOLD_S: what a rebalance would move is movable
        before = fleet.sample().owned_counts()
        victim = max(names, key=lambda n: (before.get(n, 0), n))
        survivors = [n for n in names if n != victim]
        at = fleet.kill(victim)
        total = sum(before.values())
        self.say(f"before: {report._fmt_counts(before, names)}; kill -9 {victim} ({before.get(victim, 0)})")

        def taken() -> float | None:
            counts = fleet.sample().owned_counts()
            return time.time() if sum(counts.get(n, 0) for n in survivors) >= total else None

        try:
            settled = eventually(taken, p["crash_timeout_s"], "the crash's connections to be taken over", interval=0.5)
        except TimeoutError:
            settled = None
        spread = fleet.sample().owned_counts()
        # The dead session leaves the ring once drained (two watch passes); from then on a
        # rebalance could move things, and the window shows whether one does.
        try:
            eventually(lambda: self.summary()[schema.FLEET_SUSPECTS] == 0 or None, p["crash_timeout_s"], "the recovery to end")
        except TimeoutError:
            pass
        began = time.time()
        time.sleep(p["crash_watch_s"])
        ended = time.time()
        end = fleet.sample().owned_counts()
        moves = {"new_sockets": sum(self.new_sockets(ids, began, ended).values()), "sheds": self.sheds(at, ended)}
        self.say(f"taken over {'+' + fmt(settled - at) + ' s' if settled else 'NOT all'}: {report._fmt_counts(spread, survivors)}; "
                 f"after {ended - began:.0f} s more: {report._fmt_counts(end, survivors)}, fair share {total / len(survivors):.1f}; "
                 f"rebalance moves {moves['sheds']} (new sockets in the window {moves['new_sockets']})")
        audits = self.stop_and_audit(ids)
        return {
            "victim": victim,
            "before": before,
            "spread": spread,
            "after": end,
            "share": total / len(survivors),
            "off_share": off_share(spread, survivors),
            "off_share_after": off_share(end, survivors),
            "taken_s": settled - at if settled else None,
            "window_s": ended - began,
            "moves": moves,
            "drains": [
                {k: e.get(k) for k in ("worker_id", "found", "acquired", "hinted", "named")}
                for n in fleet.workers for e in fleet.events(n) if e["event"] == "session_drain" and e["ts"] >= at
            ],
            "data_gaps": sum(len(a.missing) for a in audits),
            "overlaps": len(fleet.upstream.overlaps()),
        }


def run(*, quick: bool, run_dir: Path, command: str, join4_only: bool = False) -> Result:
    p = settings_for(quick, join4_only)
    timing = Timing(**p["timing"])
    results = []
    with EmulatorProcess(run_dir / "rebalance-emulator.log") as emulator:
        for n in p["joins"]:
            with Fleet(
                run_dir=run_dir / f"rebalance-join{n}", timing=timing, rate=p["rate_per_connection"], emulator=emulator,
                sample_interval=p["sample_interval_s"],
            ) as fleet:
                results.append(Join(fleet, p, n).run())
        crash = None
        if p["crash"]:
            with Fleet(
                run_dir=run_dir / "rebalance-crash", timing=timing, rate=p["rate_per_connection"], emulator=emulator,
                sample_interval=p["sample_interval_s"],
            ) as fleet:
                crash = Crash(fleet, p, 0).run()
    return _result(p, results, command, quick, crash)


def _counts(counts: dict[str, int]) -> str:
    return " / ".join(str(counts[k]) for k in sorted(counts, key=lambda w: int(w[1:]))) or "-"


def _result(p: dict[str, Any], results: list[dict], command: str, quick: bool, crash: dict | None = None) -> Result:
    header = ["join", "connections per worker before -> after", "fair share", "time to fair share ± 1 (s)", "last move (s)",
              "moves (excess)", "moved twice", "socket-to-socket gap p50 / p99 / max (s)", "two sockets", "gaps in stored data",
              "target"]
    rows = []
    for r in results:
        n = len(r["joined"])
        d = distribution(r["gap_s"])
        verdicts = []
        if n == 1:
            verdicts.append(f"≤ {TARGET_BALANCE_S:g} s: " + ("met" if r["balance_s"] is not None and r["balance_s"] <= TARGET_BALANCE_S else "MISSED"))
        verdicts.append("every worker ± 1: " + ("met" if r["off_share"] <= 1 else "MISSED"))
        verdicts.append("moves ≤ excess: " + ("met" if r["moves"] <= r["excess"] and not r["moved_twice"] else "MISSED"))
        verdicts.append(f"gap p99 ≤ {TARGET_GAP_P99_S:g} s: " + ("met" if d["p99"] is not None and d["p99"] <= TARGET_GAP_P99_S
                                                                 else "MISSED" if d["p99"] is not None else "-"))
        verdicts.append("no gap, one socket: " + ("met" if not r["data_gaps"] and not r["overlaps"] else "MISSED"))
        rows.append([
            f"{n} worker{'s' if n > 1 else ''} join {p['workers']}",
            f"{_counts(r['before'])} -> {_counts(r['after'])}",
            fmt(r["share"], 1),
            fmt(r["balance_s"]) if r["balance_s"] is not None else "not reached",
            fmt(r["last_move_s"]),
            f"{r['moves']} ({r['excess']})",
            str(r["moved_twice"]),
            f"{fmt(d['p50'])} / {fmt(d['p99'])} / {fmt(d['max'])}",
            str(r["overlaps"]),
            f"{r['data_gaps']} ({len(r['not_exact'])} not exactly 1..checkpoint)",
            "; ".join(verdicts),
        ])
    table = md_table(header, rows)
    steady = next((r["steady"] for r in results if r["steady"]), None)
    if steady:
        moves = max(steady["new_sockets"], steady["sheds"])
        per_hour = moves * 3600 / steady["seconds"]
        table += "\n\n" + md_table(
            ["steady fleet", "window", "moves (new sockets / sheds)", "moves per hour", "target"],
            [[f"{len(steady['counts'])} workers, {sum(steady['counts'].values())} connections ({_counts(steady['counts'])})",
              f"{steady['seconds']:.0f} s", f"{steady['new_sockets']} / {steady['sheds']}",
              f"{per_hour:g}" + (f" (one move would read {3600 / steady['seconds']:.0f})" if not moves else ""),
              "0: " + ("met" if not moves else "MISSED")]],
        )
    if crash:
        sheds = crash["moves"]["sheds"]
        table += "\n\n" + md_table(
            ["crash spread", "connections per worker before -> taken over -> after the window", "fair share",
             "furthest from it (taken over / after)", "rebalance moves after the takeover", "target"],
            [[f"kill -9 {crash['victim']} of {p['crash_workers']} (took {fmt(crash['taken_s'])} s)",
              f"{_counts(crash['before'])} -> {_counts(crash['spread'])} -> {_counts(crash['after'])}",
              fmt(crash["share"], 1),
              f"{fmt(crash['off_share'], 1)} / {fmt(crash['off_share_after'], 1)}",
              f"{sheds} in {crash['window_s']:.0f} s ({crash['moves']['new_sockets']} new sockets)",
              "± 2: " + ("met" if crash["taken_s"] is not None and crash["off_share"] <= 2 else "MISSED")
              + "; no moves: " + ("met" if not sheds else "MISSED")
              + "; no gap, one socket: " + ("met" if not crash["data_gaps"] and not crash["overlaps"] else "MISSED")]],
        )
    t = p["timing"]
    notes = [
        f"Per join, a fresh fleet: {p['workers']} workers, {p['connections']} connections STARTed through the API at "
        f"{p['rate_per_connection']:g} msg/s each; the join waits MIN_HOLD_S ({p['hold_s']:g} s) after they are placed (a "
        "connection held for less is never moved), then until the old workers have evened out the START burst's uneven "
        f"placement (no shed for {p['quiet_s']:g} s, at most {p['quiet_timeout_s']:g} s: "
        + ", ".join(f"{r['evened_s']:.0f} s" for r in results if "evened_s" in r)
        + "), then starts the new workers and STARTs nothing.",
        f"Worker timings: lease {t['lease_s']:g} s, heartbeat {t['heartbeat_s']:g} s, reconcile {t['reconcile_s']:g} s, skew "
        f"{t['skew_ms']} ms, flush {t['flush_ms']} ms, checkpoint {t['checkpoint_s']:g} s; REBALANCE on, REBALANCE_TOLERANCE 0.1, "
        f"MAX_CONNECTIONS 100 ({max_moves(100)} moves per balance pass at most; a pass after each fleet summary read, "
        "every 3 watch pauses, 13-19 s).",
        "Time to fair share ± 1: from starting the new workers (process start included) to the first ownership sample "
        f"({p['sample_interval_s']:g} s apart) in which every worker, old and new, holds its share ± 1; last move: to the last new socket. "
        f"Watched until then and {p['settle_s']:g} s more.",
        "Moves: connections with a new socket after the join (upstream books); excess: what the workers held above "
        "floor(fair share) just before it, the most a move to exact targets (floor or one more) needs. Socket to socket: old socket closed -> "
        "new one open, per moved connection. Two sockets: moments the upstream saw two open sockets on one stream, whole run. "
        "Gaps: after STOPping everything, stored seqs missing below each stream's last one.",
    ]
    if crash:
        notes.append(
            f"Crash spread: a fresh fleet of {p['crash_workers']} workers holding {p['connections']}, held MIN_HOLD_S and evened "
            "out as for a join, then the busiest killed (SIGKILL): its connections' places once every survivor's counts add up "
            "to the total again, against the survivors' fair share; then, once the fleet summary shows no session being "
            f"recovered, a {p['crash_watch_s']:g} s window in which rebalance_shed is counted (from the kill on) and new sockets. "
            "Drains: " + "; ".join(f"{d['worker_id']} found {d['found']}, acquired {d['acquired']}, hinted {d['hinted']} "
                                   f"({d['named']} named)" for d in crash["drains"] if d.get("found")))
    if steady:
        notes.append("Steady: the balanced fleet after the join of 1, no event at all; moves counted as new sockets on the "
                     "books and as connections shed in the workers' rebalance_shed log lines.")
    for r in results:
        n = len(r["joined"])
        counted = next((x["t_s"] for x in r["summaries"] if x[schema.FLEET_WORKERS] == p["workers"] + n), None)
        suspects = max((x[schema.FLEET_SUSPECTS] for x in r["summaries"]), default=0)
        sheds = ", ".join(f"{x['worker']} {x['count']} at +{x['t_s']:.1f} s" for x in sorted(r["sheds_s"], key=lambda x: x["t_s"]))
        notes.append(f"join {n}: the fleet summary counted the new workers {'+' + fmt(counted, 1) + ' s' if counted is not None else 'never'} "
                     f"after the join (suspects at most {suspects}); rebalance_shed: {sheds or 'none'}")
        if r["not_exact"]:
            notes.append(f"join {len(r['joined'])}: not exactly 1..checkpoint: {', '.join(r['not_exact'][:10])}")
    if quick:
        notes.append("--quick: tiny sizes, fast timings and no MIN_HOLD_S wait, so nothing may move: the figures show that "
                     "the code runs, not the design.")
    return Result("Rebalance", command, p, table, {"params": p, "results": results}, notes)
