"""What every benchmark shares: the processes it drives (emulator, upstream, workers),
the worker's ``stats`` lines as windows of deltas, process CPU and memory read from
``/proc``, summaries (median and spread), and the machine description.

The fleet runner (``sim.fleet``) provides the emulator process, process
spawning and polling; this module adds what the single-worker benchmarks need on top:
an upstream in a process of its own (so its CPU is not the worker's), a worker whose
stats are read from its JSON log, and the event router in this process (the path a
START or STOP takes in production: a STOP reaches its owner through its session's inbox).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from botocore.config import Config

from wsfleet import config as cfg
from wsfleet import settings_spec
from wsfleet import schema
from sim.api import build_event
from sim.emulator import create_resources
from sim.emulator_client import DEFAULT_REGION, emulator_session
from sim.children import EmulatorProcess, child_env
from sim.processes import LOOPBACK, Process, eventually, spawn, stop_process
from sim.upstream import stream_path
from wsfleet.logs import JsonLogger
from wsfleet.router import Router
from wsfleet.store import ConnectionsStore

from .kinds import DEFAULT, DEFAULT_KIND, UpstreamKind

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / (1 << 20)


# --- numbers -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (q in 0..100); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def distribution(values: Iterable[float]) -> dict[str, Any]:
    """n, min, p50, p90, p99, max of a sample (seconds, bytes, ...)."""
    xs = sorted(values)
    if not xs:
        return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "n": len(xs),
        "min": xs[0],
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "max": xs[-1],
    }


def median_spread(values: Iterable[float]) -> dict[str, Any]:
    """Median and spread (min, max, and the relative half-range) of repeated measurements."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "spread_pct": None}
    med = statistics.median(xs)
    spread = (xs[-1] - xs[0]) / 2 / med * 100 if med else None
    return {"n": len(xs), "median": med, "min": xs[0], "max": xs[-1], "spread_pct": spread}


def fmt_spread(ms: Mapping[str, Any], digits: int = 2) -> str:
    """``median (min-max)`` of a :func:`median_spread`."""
    if ms["median"] is None:
        return "-"
    if ms["n"] < 2:
        return fmt(ms["median"], digits)
    return f"{fmt(ms['median'], digits)} ({fmt(ms['min'], digits)}-{fmt(ms['max'], digits)})"


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- processes --------------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mb(pid: int) -> float:
    """Resident memory of a live process now (not the peak), from /proc."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE_MB


class ReadyUpstream:
    """An upstream in a process of its own (its CPU is then not the worker's), started
    from ``argv``: it prints ``READY <ws url>`` once it listens."""

    grace_s = 5.0  # what stop() gives it before a kill

    def __init__(self, run_dir: Path, name: str, argv: list[str], what: str = "the upstream") -> None:
        self.proc = spawn(name, argv, child_env(), run_dir / f"{name}.log")

        def ready() -> str | None:
            if not self.proc.alive():
                raise RuntimeError(f"the upstream exited at start-up; see {self.proc.log_path}")
            return next((line.split()[1] for line in self.proc.lines() if line.startswith("READY ")), None)

        self.url = eventually(ready, 30, f"{what} to be READY", interval=0.05)

    def url_for(self, stream: str) -> str:
        return self.url + stream_path(stream)

    def stop(self) -> None:
        stop_process(self.proc, grace_s=self.grace_s)


class UpstreamProcess(ReadyUpstream):
    """``python -m sim.upstream``; its books come over HTTP (``GET /_stats``).
    ``credentials``: what its ``auth_header=`` streams accept."""

    def __init__(self, run_dir: Path, *, rate: float | None, name: str = "upstream", credentials: Sequence[str] = ()) -> None:
        argv = [sys.executable, "-m", "sim.upstream", "--port", "0", "--rate", f"{rate or 0:g}"]
        argv += [arg for value in credentials for arg in ("--credential", value)]
        super().__init__(run_dir, name, argv)

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url.replace("ws://", "http://") + "/_stats", timeout=30) as resp:
            return json.load(resp)

    def open_sockets(self) -> int:
        return sum(s["open_sockets"] for s in self.stats()["streams"].values())


@dataclass(frozen=True)
class Stats:
    """One ``stats`` line of a worker."""

    ts: float
    active: int
    counters: dict[str, int]
    requests: dict[str, int]
    lag_p99_ms: float | None
    lag_max_ms: float | None
    max_rss_mb: float
    cpu_s: float
    session_id: str = ""
    renewals: int = 0  # successful session renewals since the worker started
    sessions_ended: int = 0  # dead sessions this worker ended
    writer: dict[str, Any] = field(default_factory=dict)  # the writer's own figures (pending, latency)
    checkpoints: dict[str, Any] = field(default_factory=dict)  # checkpoint transactions and checkpoints written

    @classmethod
    def from_event(cls, e: Mapping[str, Any]) -> "Stats":
        from wsfleet.metrics_names import COUNTERS

        return cls(
            ts=e["ts"],
            active=e["active"],
            counters={name: e.get(name, 0) for name in COUNTERS},
            requests=dict(e.get("requests", {})),
            lag_p99_ms=e.get("loop_lag_p99_ms"),
            lag_max_ms=e.get("loop_lag_max_ms"),
            max_rss_mb=e.get("max_rss_mb", 0.0),
            cpu_s=e.get("cpu_s", 0.0),
            session_id=e.get("session_id", ""),
            renewals=e.get("renewals", 0),
            sessions_ended=e.get("sessions_ended", 0),
            writer=dict(e.get("writer") or {}),
            checkpoints=dict(e.get("checkpoints") or {}),
        )


@dataclass
class Window:
    """What a worker did between two of its stats lines."""

    seconds: float
    active: int  # at the end (the benchmarks hold it steady)
    counters: dict[str, int]
    requests: dict[str, int]
    cpu_s: float
    lag_p99_ms: float | None  # as reported at the end (the worker's last two minutes)
    lag_max_ms: float | None
    renewals: int = 0
    same_session: bool = True  # no session was lost (and a new one opened) in between

    @classmethod
    def between(cls, a: Stats, b: Stats) -> "Window":
        ops = set(a.requests) | set(b.requests)
        return cls(
            seconds=b.ts - a.ts,
            active=b.active,
            counters={k: b.counters[k] - a.counters.get(k, 0) for k in b.counters},
            requests={k: b.requests.get(k, 0) - a.requests.get(k, 0) for k in sorted(ops)},
            cpu_s=b.cpu_s - a.cpu_s,
            lag_p99_ms=b.lag_p99_ms,
            lag_max_ms=b.lag_max_ms,
            renewals=b.renewals - a.renewals,
            same_session=a.session_id == b.session_id,
        )

    @classmethod
    def combined(cls, windows: Sequence["Window"]) -> "Window":
        """Several workers' windows as one: sums, with ``seconds`` in worker-seconds."""
        ops = {op for w in windows for op in w.requests}
        return cls(
            seconds=sum(w.seconds for w in windows),
            active=sum(w.active for w in windows),
            counters={k: sum(w.counters.get(k, 0) for w in windows) for k in windows[0].counters},
            requests={k: sum(w.requests.get(k, 0) for w in windows) for k in sorted(ops)},
            cpu_s=sum(w.cpu_s for w in windows),
            lag_p99_ms=max((w.lag_p99_ms for w in windows if w.lag_p99_ms is not None), default=None),
            lag_max_ms=max((w.lag_max_ms for w in windows if w.lag_max_ms is not None), default=None),
            renewals=sum(w.renewals for w in windows),
            same_session=all(w.same_session for w in windows),
        )

    @classmethod
    def series(cls, lines: Sequence[Stats], step: int = 1) -> list["Window"]:
        """Consecutive windows, each ``step`` stats intervals long: the repeated
        measurements a median and a spread are taken over."""
        return [cls.between(lines[i], lines[i + step]) for i in range(0, len(lines) - step, step)]

    def ddb(self, op: str) -> int:
        return self.requests.get(f"dynamodb.{op}", 0)

    @property
    def ddb_total(self) -> int:
        return sum(v for k, v in self.requests.items() if k.startswith("dynamodb."))

    @property
    def kinesis_total(self) -> int:
        return sum(v for k, v in self.requests.items() if k.startswith("kinesis."))

    @property
    def firehose_total(self) -> int:
        return sum(v for k, v in self.requests.items() if k.startswith("firehose."))


def latency_between(a: Stats, b: Stats) -> dict[str, Any]:
    """Frame received (handed to the writer) -> stored, for the frames stored between two
    stats lines: the difference of the writer's cumulative histograms (buckets 9 % wide).
    p50 and p99 are interpolated inside their bucket; max is the upper bound of the
    highest non-empty bucket (so at most 9 % above the true maximum)."""
    from wsfleet.worker.latency import histogram_of, histogram_quantile

    key = "received_to_stored_hist"
    before, after = histogram_of(a.writer.get(key, {})), histogram_of(b.writer.get(key, {}))
    counts = [y - x for x, y in zip(before, after, strict=True)]
    return {
        "n": sum(counts),
        "p50": histogram_quantile(counts, 50),
        "p99": histogram_quantile(counts, 99),
        "max": histogram_quantile(counts, 100),
    }


def latency_cell(lat: dict[str, Any]) -> str:
    """A table cell of :func:`latency_between`'s p50 / p99 / max in ms, or "-" for no frames."""
    return f"{fmt(lat['p50'], 0)} / {fmt(lat['p99'], 0)} / {fmt(lat['max'], 0)}" if lat["n"] else "-"


class WorkerProcess:
    """``python -m wsfleet.worker`` with its JSON log in a file; stats read from the log."""

    def __init__(self, run_dir: Path, name: str, env: Mapping[str, str]) -> None:
        self.name = name
        self.proc: Process = spawn(name, [sys.executable, "-m", "wsfleet.worker"], env, run_dir / f"{name}.log")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self, kind: str | None = None) -> list[dict]:
        out = []
        for line in self.proc.lines():
            if line.startswith("{"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut short
                if kind is None or e.get("event") == kind:
                    out.append(e)
        return out

    def stats(self) -> list[Stats]:
        return [Stats.from_event(e) for e in self.events("stats")]

    def wait_started(self, timeout: float = 30) -> None:
        def started() -> bool:
            if not self.proc.alive():
                raise RuntimeError(f"worker {self.name} exited at start-up; see {self.proc.log_path}")
            return bool(self.events("worker_started"))

        eventually(started, timeout, f"worker {self.name} to start", interval=0.1)

    def stats_between(self, a: Stats, b: Stats) -> list[Stats]:
        """The stats lines from ``a`` to ``b``, both included."""
        return [s for s in self.stats() if a.ts <= s.ts <= b.ts]

    def next_stats(self, timeout: float = 120) -> Stats:
        """The first stats line written after now."""
        seen = len(self.stats())
        return eventually(lambda: (s := self.stats())[seen:] and s[seen], timeout, f"a stats line from {self.name}", interval=0.2)

    def stop(self, grace_s: float = 15) -> None:
        stop_process(self.proc, grace_s=grace_s)


class Rig:
    """An emulator process with tables of its own, plus the upstreams and workers a
    benchmark starts, and the event router in this process; everything is stopped on
    exit."""

    def __init__(self, run_dir: Path, *, sink: str = schema.SINK_DYNAMODB) -> None:
        self.run_dir = run_dir
        self.sink = sink  # a SINK value: where the workers store frames
        self.emulator = EmulatorProcess(run_dir / "emulator.log")
        self.upstreams: list[UpstreamProcess] = []
        self.workers: list[WorkerProcess] = []
        self.aws_env: dict[str, str] = {}
        self._router: Router | None = None
        self._router_log: Any = None

    def __enter__(self) -> "Rig":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.emulator.start()
            suffix = uuid.uuid4().hex[:8]
            self.aws_env = create_resources(
                self.emulator.endpoint_url, table_name=f"wsfleet-connections-{suffix}",
                sessions_table_name=f"wsfleet-sessions-{suffix}", messages_table_name=f"wsfleet-messages-{suffix}",
                messages_bucket_name=f"wsfleet-messages-{suffix}", queue_name=f"wsfleet-start-{suffix}",
                sink=self.sink, messages_stream_name=f"wsfleet-messages-{suffix}",
                delivery_stream_name=f"wsfleet-messages-{suffix}", delivery_bucket_name=f"wsfleet-delivery-{suffix}",
            )
            # The emulator's credentials and region, for the clients this process makes.
            self.session = emulator_session(self.aws_env.get("AWS_REGION", DEFAULT_REGION))
            self.ddb = self.session.client(
                "dynamodb",
                endpoint_url=self.emulator.endpoint_url,
                config=Config(retries={"mode": "standard", "max_attempts": 8}, read_timeout=30),
            )
            self.sqs = self.session.client("sqs", endpoint_url=self.emulator.endpoint_url)
            self.kinesis = self.session.client("kinesis", endpoint_url=self.emulator.endpoint_url)
            self.firehose = self.session.client("firehose", endpoint_url=self.emulator.endpoint_url)
            self.s3 = self.session.client("s3", endpoint_url=self.emulator.endpoint_url)
            self.connections = ConnectionsStore(
                self.ddb, self.aws_env["TABLE_NAME"], state_shards=cfg.state_shards(self.aws_env)
            )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for w in self.workers:
            w.stop(grace_s=10)
        for u in self.upstreams:
            u.stop()
        self.emulator.stop()
        if self._router_log is not None:
            self._router_log.close()

    @property
    def emulator_pid(self) -> int:
        assert self.emulator.proc is not None
        return self.emulator.proc.pid

    def upstream(self, rate: float | None, name: str = "upstream", credentials: Sequence[str] = ()) -> UpstreamProcess:
        u = UpstreamProcess(self.run_dir, rate=rate, name=name, credentials=credentials)
        self.upstreams.append(u)
        return u

    def worker(self, name: str, settings: Mapping[str, Any]) -> WorkerProcess:
        env = child_env(**self.aws_env, **{settings_spec.WORKER_ID: name}, **{k: str(v) for k, v in settings.items()})
        w = WorkerProcess(self.run_dir, name, env)
        self.workers.append(w)
        w.wait_started()
        return w

    def start_connections(
        self, ids: Iterable[str], upstream: UpstreamProcess, *, hint: bool = False, kind: UpstreamKind = DEFAULT
    ) -> None:
        """The router's START write for each; with ``hint``, also its SQS hint (without,
        the worker's reconcile finds them). Another kind than the default goes through
        the event router itself (which validates and stores its upstream object, and hints)."""
        if kind.name != DEFAULT_KIND:
            for cid in ids:
                self.post_event({"event_type": "START", "connection_id": cid, "ws_url": kind.ws_url(upstream.url_for(cid)),
                                 "upstream": kind.upstream()})
            return
        for cid in ids:
            self.connections.start(cid, upstream.url_for(cid))
            if hint:
                self.sqs.send_message(
                    QueueUrl=self.aws_env["QUEUE_URL"], MessageBody=json.dumps({schema.HINT_CONNECTION_ID: cid})
                )

    def post_event(self, body: Mapping[str, Any]) -> int:
        """``POST /events`` through the event router, as API Gateway would hand it over
        (a START writes and hints; a STOP writes and posts to the owner's session
        inbox); returns the status, raising on a 4xx or 5xx."""
        if self._router is None:
            self._router_log = open(self.run_dir / "router.log", "a", buffering=1)
            self._router = Router.from_env(
                {**self.aws_env, settings_spec.ALLOWED_WS_HOSTS: LOOPBACK}, ddb=self.ddb, sqs=self.sqs,
                logger=JsonLogger(self._router_log, component="router"),
            )
        event = build_event("POST", "/events", [("Content-Type", "application/json")], json.dumps(body).encode())
        result = self._router.handle(event)
        if result["statusCode"] >= 400:
            raise RuntimeError(f"{body.get('event_type')} {body.get('connection_id')} answered "
                               f"{result['statusCode']}: {result['body']}")
        return result["statusCode"]


# --- the run's description ---------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), ""
        )
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "runtime", "bench"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        if commit and dirty:
            commit += " + uncommitted changes under runtime/ or bench/"
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": commit,
    }


@dataclass
class Result:
    """One benchmark's figures: the markdown it prints and the raw data it writes."""

    name: str
    command: str
    settings: dict[str, Any]
    markdown: str
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        parts = [f"### {self.name}", "", f"`{self.command}`", "", self.markdown]
        if self.notes:
            parts += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(parts) + "\n"
