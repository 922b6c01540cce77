"""One chaos run, start to end: the fleet up, the schedule played, everything healed and
STOPped, the evidence gathered and checked, the report written.

The phases, as the progress lines name them: ``setup`` (workers, STARTs, every session
watched), ``#n kind`` while fault n plays and until the next one, ``recover`` (every
fault healed; until the fleet is whole), ``stop`` (STOP everything, until every socket
is closed and every lease released), then the audit.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from wsfleet import settings_spec
from .. import pictures
from ..emulator import record_journal, request_ledger
from ..children import RUNTIME_DIR, pin_runtime
from ..fleet import Fleet, new_run_dir
from ..observed import Sample
from ..timing import Timing
from ..report import progress_line
from . import checker, hostile_check, machine, report
from .evidence import Snapshot, gather
from .hostile import HostilePeers
from .nemesis import Nemesis
from .schedule import MAX_FRAME_BYTES, Bounds, Schedule, generate

# Each messages partition's items a second in the run's emulator (sim.emulator_partitions):
# DynamoDB gives a partition 1,000 of a table's 40,000 default write units, 2.5 %; the
# emulator stores ~300-400 items a second in all, so 2.5 % would be ~10: 25 leaves every
# ordinary connection (2 a second, a takeover's replay in a burst) untouched and holds
# the hostile peer that is faster than the store to what DynamoDB would give it, in
# proportion, instead of half the emulator (30-minute soak: 93 rows/s of ~200, every
# renewal of the fleet slow behind its batches).
PARTITION_WRITES_PER_S = 25

PROGRESS_EVERY_S = 10.0
CPU_EVERY_S = 1.0  # how often the machine's CPU is read (machine.sample)


@dataclass(frozen=True)
class Settings:
    seed: int
    minutes: float = 10.0
    workers: int = 4
    connections: int = 40
    rate: float = 2.0
    timing: Timing = Timing()
    warmup_s: float | None = None  # default: until every session is watched
    slack_s: float = 0.0  # added to every recovery bound (a loaded machine)
    run_dir: str = ".chaos"
    kinds: tuple[str, ...] | None = None  # the kinds the deck deals (default: every one)
    sink: str = "dynamodb"  # SINK: with kinesis, the stream is audited and Kinesis faults are dealt
    hostile: bool = False  # one connection of each hostile kind beside the soak's (.hostile)

    def replay(self) -> str:
        """The command that replays this run's schedule."""
        if self.timing == Timing() and self.rate == 2.0 and self.warmup_s is None and not self.slack_s and self.kinds is None:
            sink = f" SINK={self.sink}" if self.sink != "dynamodb" else ""
            hostile = " CHAOS_ARGS=--hostile" if self.hostile else ""
            return (f"make chaos SEED={self.seed} MINUTES={self.minutes:g} WORKERS={self.workers} "
                    f"CONNECTIONS={self.connections}{sink}{hostile}")
        t = self.timing
        args = [
            "--seed", self.seed, "--minutes", f"{self.minutes:g}", "--workers", self.workers, "--connections", self.connections,
            "--rate", f"{self.rate:g}", "--lease", f"{t.lease_s:g}", "--heartbeat", f"{t.heartbeat_s:g}",
            "--reconcile", f"{t.reconcile_s:g}", "--skew-ms", t.skew_ms, "--flush-ms", t.flush_ms,
            "--checkpoint", f"{t.checkpoint_s:g}", "--shutdown", f"{t.shutdown_s:g}",
        ]
        if self.warmup_s is not None:
            args += ["--warmup", f"{self.warmup_s:g}"]
        if self.slack_s:
            args += ["--slack", f"{self.slack_s:g}"]
        if self.kinds is not None:
            args += ["--kinds", ",".join(self.kinds)]
        if self.sink != "dynamodb":
            args += ["--sink", self.sink]
        if self.hostile:
            args += ["--hostile"]
        return "PYTHONPATH=runtime:. python -m sim.chaos " + " ".join(shlex.quote(str(a)) for a in args)

    def describe(self) -> str:
        t = self.timing
        return (
            f"{self.minutes:g} min, {self.workers} workers, {self.connections} connections at {self.rate:g}/s; "
            f"lease {t.lease_s:g} s, heartbeat {t.heartbeat_s:g} s, skew {t.skew_ms} ms, reconcile {t.reconcile_s:g} s, "
            f"checkpoint {t.checkpoint_s:g} s, flush {t.flush_ms} ms"
            + (f"; kinds {', '.join(self.kinds)}" if self.kinds is not None else "")
            + (f"; SINK={self.sink}" if self.sink != "dynamodb" else "")
            + ("; hostile peers" if self.hostile else "")
        )


class Run:
    def __init__(self, settings: Settings, out: TextIO = sys.stdout) -> None:
        self.s = settings
        self.out = out
        self.bounds = Bounds(settings.timing)
        self.schedule: Schedule = generate(
            seed=settings.seed, minutes=settings.minutes, workers=settings.workers,
            connections=settings.connections, timing=settings.timing, warmup_s=settings.warmup_s, kinds=settings.kinds,
            sink=settings.sink,
        )
        self.snapshots: list[Snapshot] = []
        self.cpu: list[machine.CpuSample] = []
        self.phase = "setup"
        self.t_origin = time.time()
        self._printed: Sample | None = None
        self._lock = threading.Lock()
        self.errors: list[str] = []  # the harness's own failures: the run proves nothing then
        self.nemesis: Nemesis | None = None
        self.hostile: HostilePeers | None = None

    def say(self, line: str) -> None:
        with self._lock:
            print(line, file=self.out, flush=True)

    def stamp(self) -> str:
        return f"[{time.time() - self.t_origin:7.1f}s]"

    def on_sample(self, sample: Sample) -> None:
        """The observer's callback: keep a snapshot; a progress line every so often."""
        streams = self.nemesis.stream_map() if self.nemesis is not None else None
        self.snapshots.append(Snapshot.of(sample, streams, self.snapshots[-1] if self.snapshots else None))
        if not self.cpu or sample.t - self.cpu[-1].t >= CPU_EVERY_S:
            reading = machine.sample(sample.t)
            if reading is not None:
                self.cpu.append(reading)
        if self.phase == "setup" or (self._printed and sample.t - self._printed.t < PROGRESS_EVERY_S):
            return
        states = {name: p.state for name, p in self.fleet.workers.items() if p.state in ("running", "paused")}
        line = progress_line(sample.t - self.t_origin, self.phase, sample, self._printed, states)
        w = machine.window(self.cpu, self._printed.t, sample.t) if self._printed else None
        if w is not None:
            line += f" | cpu {w.ours:.1f} + others {w.others:.1f}"
        self.say(line)
        self._printed = sample

    def run(self) -> int:
        s = self.s
        run_dir = new_run_dir(Path(s.run_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        runtime = pin_runtime(run_dir)
        (run_dir / "schedule.json").write_text(self.schedule.to_json())
        self.say(f"wsfleet chaos, seed {s.seed}: {s.describe()}; logs in {run_dir}")
        self.say(f"code: {_version()}, copied to {runtime} for every process this run starts")
        self.say(f"replay: {s.replay()}")
        self.say(f"schedule ({len(self.schedule.faults)} faults, from the start of the chaos phase):")
        for line in self.schedule.lines():
            self.say("  " + line)
        with Fleet(
            run_dir=run_dir,
            timing=s.timing,
            rate=s.rate,
            on_sample=self.on_sample,
            keep_samples=False,
            runtime_dir=runtime,
            sink=s.sink,
            worker_env={settings_spec.MAX_FRAME_BYTES: str(MAX_FRAME_BYTES)},  # the limit the oversize faults exceed
            partition_writes_per_s=PARTITION_WRITES_PER_S,
        ) as fleet:
            self.fleet = fleet
            return self._play(fleet, run_dir)

    def _play(self, fleet: Fleet, run_dir: Path) -> int:
        s = self.s
        record_journal(fleet.emulator.endpoint_url)
        ids = [f"c{i:03d}" for i in range(1, s.connections + 1)]
        nemesis = self.nemesis = Nemesis(fleet, ids, workers=s.workers, seed=s.seed, say=self.say)
        nemesis.start_workers()
        nemesis.start_connections(ids)
        if s.hostile:
            self.hostile = HostilePeers(fleet, self.say)
            self.hostile.start()
        fleet.wait_connected(ids, timeout=60)
        opened = max(e["ts"] for name in fleet.live_workers() for e in fleet.events(name) if e["event"] == "session_opened")
        self._sleep_until_epoch(opened + self.schedule.warmup_s, nemesis)
        self.say(f"{self.stamp()} every worker is up and every connection owned: the chaos phase begins")
        began = time.monotonic()
        before = request_ledger(fleet.emulator.endpoint_url)
        for fault in self.schedule.faults:
            self._sleep_until(began + fault.at_s, nemesis)
            self.phase = f"#{fault.n} {fault.kind}"
            late = time.monotonic() - began - fault.at_s
            self.say(f"{self.stamp()} FAULT {fault.describe().split(maxsplit=2)[2]}" + (f" ({late:.1f}s late)" if late > 1 else ""))
            try:
                applied = nemesis.play(fault)
            except Exception as exc:  # noqa: BLE001 - the harness failed, not the fleet: say so, go on
                self.errors.append(f"#{fault.n} {fault.kind}: {type(exc).__name__}: {exc}")
                self.say(f"{'':11}HARNESS ERROR {self.errors[-1]}")
                nemesis.heal_all()
                continue
            if applied.victim:
                self.say(f"{'':11}victim {applied.victim} held {len(applied.affected)}"
                         + (f"; {applied.replacement} replaces it" if applied.replacement else "")
                         + (f"; {applied.drainer}, draining it, got SIGTERM" if applied.drainer else "")
                         + (f"; {applied.note}" if applied.note else ""))
        self._sleep_until(began + s.minutes * 60, nemesis)
        self.phase = "recover"
        nemesis.heal_all()
        chaos_ended = time.time()
        recover_s = self.bounds.takeover_s + self.bounds.settle_s + 10
        self.say(f"{self.stamp()} the chaos phase is over; every fault healed; waiting for the fleet to be whole (up to {recover_s:.0f}s)")
        if not nemesis.wait_whole(recover_s):
            self.say(f"{'':11}not whole after {recover_s:.0f}s: auditing anyway")
        nemesis.check_exits()
        self.phase = "stop"
        self.say(f"{self.stamp()} STOP every connection, then audit")
        for cid in nemesis.started():
            nemesis.api("STOP", cid)
        hostile_ids = self.hostile.ids if self.hostile is not None else []
        if self.hostile is not None:
            self.hostile.stop()
        try:
            fleet.wait_quiet(ids + hostile_ids, timeout=self.bounds.stop_s * 2 + s.timing.lease_s + 10,
                             streams={cid: nemesis.streams_of(cid) for cid in ids})
        except TimeoutError as exc:
            self.say(f"{'':11}{exc}; auditing anyway")
        time.sleep(2 * fleet.sample_interval)
        self.phase = "audit"
        evidence = gather(fleet, ids, list(self.snapshots), nemesis.exits, time.time(),
                          streams={cid: nemesis.streams_of(cid) for cid in ids})
        verdict = checker.check(evidence, nemesis.applied, nemesis.ops, s.timing, slack_s=s.slack_s)
        if self.hostile is not None:
            found, totals, notes = hostile_check.check(
                # Judged from the hostile STARTs (the warm-up has no fault) to the last heal.
                self.hostile.evidence((self.hostile.started_at, chaos_ended)), evidence.rows, nemesis.applied,
                self.bounds, s.slack_s)
            verdict.violations += [checker.Violation(kind, what, detail) for kind, what, detail in found]
            verdict.totals.update(totals)
            verdict.notes += notes
        verdict.totals.update(_load(before, request_ledger(fleet.emulator.endpoint_url), time.monotonic() - began))
        lines = report.render(self.schedule, verdict, settings=s.describe(), replay=s.replay(), cpu=self.cpu)
        (run_dir / "report.txt").write_text("\n".join(lines) + "\n")
        (run_dir / "report.json").write_text(report.as_json(
            self.schedule, verdict, nemesis.applied, nemesis.ops, self.bounds,
            settings={**dataclasses.asdict(s), "timing": dataclasses.asdict(s.timing)}, replay=s.replay(), cpu=self.cpu,
        ))
        self.say("")
        for line in lines:
            self.say(line)
        self.say(f"report: {run_dir / 'report.txt'} and report.json; worker logs: {run_dir}/w*.log")
        self.say(pictures.write(run_dir))
        if self.errors:
            self.say(f"the harness failed {len(self.errors)} times (exit status 2): " + "; ".join(self.errors))
            return 2
        return 0 if verdict.passed else 1

    def _sleep_until(self, mono: float, nemesis: Nemesis) -> None:
        while (left := mono - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
            nemesis.check_exits()
            if self.hostile is not None:
                self.hostile.watch()

    def _sleep_until_epoch(self, epoch: float, nemesis: Nemesis) -> None:
        self._sleep_until(time.monotonic() + max(0.0, epoch - time.time()), nemesis)


WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem")


def _version() -> str:
    """The commit the code is at, "+edits" if the working tree differs ("unknown" outside git)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty=+edits"], cwd=RUNTIME_DIR, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _load(before: list[dict], after: list[dict], seconds: float) -> dict[str, float]:
    """What the run asked of the emulator between two ledger reads (every client, the
    harness's reads included), against its budget of roughly 80 DynamoDB writes a second."""

    def count(ledger: list[dict], ops: tuple[str, ...] | None = None) -> int:
        return sum(row["n"] for row in ledger if ops is None or row["op"] in ops)

    requests = count(after) - count(before)
    writes = count(after, WRITES) - count(before, WRITES)
    return {"dynamodb_requests_per_s": round(requests / seconds, 1), "dynamodb_writes_per_s": round(writes / seconds, 1)}
