"""The whole fleet on one machine, as real processes: what ``make demo`` runs and what
the fleet tests drive.

A :class:`Fleet` owns everything it starts:

* the local AWS backend, ``python -m wsfleet.local.emulator`` in a process of its own
  (or a shared :class:`EmulatorProcess`), with tables and a queue of its own;
* K workers, each ``python -m wsfleet.worker`` in a process of its own, with its JSON
  log in ``<run_dir>/<name>.log``;
* the upstream (:class:`~wsfleet.local.upstream.ThreadedUpstream`) and the API
  (:class:`~wsfleet.local.api.LocalApi` in front of the event router) as threads of
  this process: their books are then read directly, and the API is still real HTTP;
* an observer thread that samples ownership (one Scan of the connections table, then
  one of the sessions table) and the upstream's books every ``sample_interval`` seconds
  (None: no observer, no samples; for tests that judge by the books and the tables alone).

The fleet's own reads (the observer, the audit) are marked as the harness's, so the
emulator's fault injection never reaches them; the API's router is part of the system
and is faulted like the workers.

Nothing is mocked in-process for the workers: they reach the backend, the upstream and
each other only over loopback, as they would in ECS.

No process outlives the fleet. Children run in sessions of their own (so a Ctrl-C in the
terminal reaches only us, and we tear down in order), :meth:`Fleet.close` runs on the
way out of the ``with`` block, on SIGTERM (turned into :class:`SystemExit`) and at exit,
and on Linux each child is also asked to be SIGKILLed by the kernel if this process dies
without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

from botocore.config import Config

from .. import config as cfg
from .. import schema
from ..leases import unreachable
from ..logs import JsonLogger
from ..store import MessagesStore, ObjectsStore, unmarshal
from .api import LocalApi
from .emulator import DEFAULT_REGION, HARNESS_MARK, create_resources, emulator_session
from .upstream import DEFAULT as DEFAULT_SHAPE
from .upstream import ThreadedUpstream

RUNTIME_DIR = Path(__file__).resolve().parents[2]  # what PYTHONPATH must hold for children
LOOPBACK = "127.0.0.1"
T = TypeVar("T")

log = logging.getLogger(__name__)


# --- timing ------------------------------------------------------------------------------


# What a takeover costs past the dead session's expiry + skew: the watcher's jitter (at
# most 0.3 s), its end, drain query and acquires, the stored-end query and the connect
# (about 0.5 s on an idle machine), and a second and a half of room for a busy 2-core one.
TAKEOVER_SLACK_S = 2.5


@dataclass(frozen=True)
class Timing:
    """The worker settings a fleet run is judged by, and the bounds that follow from them.

    The defaults are the worker's own for the session (lease 10 s, heartbeat 2.5 s, skew
    1 s); reconcile (the scan for lost hints), flush and checkpoint are shorter than in
    production so that a short local run shows them and its checkpoints move visibly."""

    lease_s: float = 10.0
    heartbeat_s: float = 2.5
    reconcile_s: float = 3.0
    skew_ms: int = 1000
    flush_ms: int = 1000
    shutdown_s: float = 10.0
    checkpoint_s: float = 5.0  # CHECKPOINT_SECONDS: how stale the observer's last_seq may be

    def env(self) -> dict[str, str]:
        return {
            cfg.LEASE_SECONDS: f"{self.lease_s:g}",
            cfg.HEARTBEAT_SECONDS: f"{self.heartbeat_s:g}",
            cfg.RECONCILE_SECONDS: f"{self.reconcile_s:g}",
            cfg.MAX_CLOCK_SKEW_MS: str(self.skew_ms),
            cfg.FLUSH_INTERVAL_MS: str(self.flush_ms),
            cfg.SHUTDOWN_SECONDS: f"{self.shutdown_s:g}",
            cfg.CHECKPOINT_SECONDS: f"{self.checkpoint_s:g}",
        }

    @property
    def crash_bound_s(self) -> float:
        """A crashed (or frozen) worker's connections, from the kill:
        ``lease + skew + TAKEOVER_SLACK_S``. Its session was last renewed at most a
        heartbeat before the kill, so it expires at most a lease after it; a watcher,
        which saw the missed renewal well before, ends it once the skew margin has also
        passed, and takes its connections (acquire, find the stored end, connect) within
        the slack."""
        return self.lease_s + self.skew_ms / 1000 + TAKEOVER_SLACK_S

    @property
    def graceful_bound_s(self) -> float:
        """A leaving worker releases and hints its peers through SQS: well inside a lease."""
        return min(2.0, self.lease_s / 2)

    @property
    def start_bound_s(self) -> float:
        """A START reaches a worker through the queue hint, not the reconcile."""
        return 2.0

    @property
    def stop_bound_s(self) -> float:
        """The owner sees STOP at its next renewal, then closes the socket."""
        return self.heartbeat_s + 1.0


# --- processes -----------------------------------------------------------------------------


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when we die, or None elsewhere.

    Resolved here, in the parent, so that the forked child only makes one libc call.
    The signal fires when the *thread* that started the child exits, so start children
    from a thread that lives as long as the fleet (the main thread does).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return preexec


def pin_runtime(run_dir: Path) -> Path:
    """Copy the ``wsfleet`` package into ``run_dir/runtime`` and return that directory,
    for a long run's children to import: code edited while the run goes on must not
    reach the workers it starts later (the API, in this process, keeps what it imported)."""
    pinned = run_dir / "runtime"
    shutil.copytree(RUNTIME_DIR / "wsfleet", pinned / "wsfleet", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return pinned


def pinned(env: dict[str, str], runtime_dir: Path | None) -> dict[str, str]:
    """``env`` with ``runtime_dir`` first on PYTHONPATH (None: unchanged)."""
    if runtime_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(runtime_dir), env.get("PYTHONPATH", "")])
    return env


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that could reach real AWS, plus
    what a ``python -m wsfleet...`` child needs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(RUNTIME_DIR), os.environ.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["AWS_XRAY_SDK_ENABLED"] = "false"
    # The local upstream is on loopback: the router and the worker must both allow it.
    env[cfg.ALLOWED_WS_HOSTS] = LOOPBACK
    env.update(extra)
    return env


@dataclass
class Process:
    """A child process with its output in a log file."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    started_at: float  # epoch seconds
    state: str = "running"  # running | paused | killed | terminated

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []


def spawn(name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> Process:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop them in order
            preexec_fn=_die_with_parent(),
        )
    return Process(name, popen, log_path, time.time())


def stop_process(proc: Process, *, grace_s: float = 0.0) -> int:
    """SIGTERM and wait up to ``grace_s``, then SIGKILL; returns the exit status."""
    if proc.alive():
        if proc.state == "paused":
            os.kill(proc.pid, signal.SIGCONT)
        if grace_s > 0:
            proc.popen.send_signal(signal.SIGTERM)
            try:
                return proc.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        proc.popen.kill()
    return proc.popen.wait()


def eventually(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class EmulatorProcess:
    """``python -m wsfleet.local.emulator`` in a process of its own: moto's DynamoDB is
    serialised, so a fleet must not share its interpreter (and GIL) with the workers'
    backend. Several fleets may share one (each creates its own tables and queue)."""

    def __init__(self, log_path: Path, *, runtime_dir: Path | None = None) -> None:
        self._log_path = log_path
        self._runtime_dir = runtime_dir
        self.proc: Process | None = None
        self.endpoint_url = ""

    def start(self, timeout: float = 30.0) -> "EmulatorProcess":
        self.proc = spawn(
            "emulator",
            [sys.executable, "-m", "wsfleet.local.emulator", "--host", LOOPBACK],
            pinned(child_env(), self._runtime_dir),
            self._log_path,
        )

        def ready() -> str | None:
            if not self.proc.alive():
                raise RuntimeError(f"the emulator exited at start-up; see {self._log_path}")
            return next((line.split()[1] for line in self.proc.lines() if line.startswith("READY ")), None)

        self.endpoint_url = eventually(ready, timeout, "the emulator to be READY", interval=0.05)
        return self

    def create_resources(self) -> dict[str, str]:
        """Tables and a queue with names of their own; returns the env the worker needs."""
        suffix = uuid.uuid4().hex[:8]
        return create_resources(
            self.endpoint_url,
            table_name=f"wsfleet-connections-{suffix}",
            sessions_table_name=f"wsfleet-sessions-{suffix}",
            messages_table_name=f"wsfleet-messages-{suffix}",
            messages_bucket_name=f"wsfleet-messages-{suffix}",
            queue_name=f"wsfleet-start-{suffix}",
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace_s=3.0)

    def __enter__(self) -> "EmulatorProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- what the observer sees ---------------------------------------------------------------------


@dataclass(frozen=True)
class SessionState:
    """One worker session, as the observer read it."""

    worker_id: str
    state: str  # LIVE | ENDED
    expires_at_ms: int  # by its worker's wall clock, as are heartbeat_at_ms and started_at_ms
    heartbeat_at_ms: int = 0
    started_at_ms: int = 0
    ended_by: str = ""  # the session (of a watcher) or the worker id (its own) that ended it
    in_ring: bool = False  # in the watch ring: LIVE, or ENDED and not yet drained

    def live_at(self, now_ms: int) -> bool:
        return self.state == schema.LIVE and self.expires_at_ms > now_ms


@dataclass(frozen=True)
class ConnState:
    """One connection item, with its session as the observer read it."""

    desired_state: str
    owner: str  # lease_owner: the worker id of the session it is attached to, "" when free
    session: str  # lease_session, "" when free
    expires_at_ms: int  # that session's expiry while it is LIVE, else 0 (as GET /connections says)
    fence_token: int
    last_seq: int
    owner_key: str = ""  # the by_owner partition: S#<session>, FREE#<shard>, or "" (none)

    def owned_at(self, now_ms: int) -> str:
        """The owner if it is attached to a session that is LIVE and unexpired at
        ``now_ms``, else ""."""
        return self.owner if self.session and self.expires_at_ms > now_ms else ""


@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds, when the scan returned
    connections: dict[str, ConnState]
    open_sockets: dict[str, int]  # per stream
    produced: int  # sum of the streams' heads
    frames_sent: int  # sum over every socket ever opened (replays included)
    sessions: dict[str, SessionState] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)  # per stream: the seq produced last
    sent_heads: dict[str, int] = field(default_factory=dict)  # per stream: the highest seq sent on an open socket

    def owners(self) -> dict[str, str]:
        """Live owner per STARTED connection ("" if none)."""
        now = int(self.t * 1000)
        return {cid: c.owned_at(now) for cid, c in self.connections.items() if c.desired_state == schema.STARTED}

    def owned_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for owner in self.owners().values():
            if owner:
                counts[owner] = counts.get(owner, 0) + 1
        return counts

    def orphans(self) -> list[str]:
        """STARTED connections not attached to a live session."""
        return sorted(cid for cid, owner in self.owners().items() if not owner)

    @property
    def stored(self) -> int:
        """Sum of checkpoints: messages durably stored (as of each connection's last
        checkpoint, at most CHECKPOINT_SECONDS old while frames arrive)."""
        return sum(c.last_seq for c in self.connections.values())


def session_from_item(item: Mapping[str, Any]) -> SessionState:
    return SessionState(
        worker_id=item.get(schema.SESSION_WORKER_ID, ""),
        state=item.get(schema.SESSION_STATE, ""),
        expires_at_ms=int(item.get(schema.EXPIRES_AT_MS, 0)),
        heartbeat_at_ms=int(item.get(schema.HEARTBEAT_AT_MS, 0)),
        started_at_ms=int(item.get(schema.STARTED_AT_MS, 0)),
        ended_by=item.get(schema.ENDED_BY, ""),
        in_ring=item.get(schema.RING) == schema.RING_VALUE,
    )


def state_from_item(item: Mapping[str, Any], sessions: Mapping[str, SessionState]) -> ConnState:
    session_id = item.get(schema.LEASE_SESSION, "")
    session = sessions.get(session_id) if session_id else None
    return ConnState(
        desired_state=item.get(schema.DESIRED_STATE, ""),
        owner=item.get(schema.LEASE_OWNER, ""),
        session=session_id,
        expires_at_ms=session.expires_at_ms if session is not None and session.state == schema.LIVE else 0,
        fence_token=int(item.get(schema.FENCE_TOKEN, 0)),
        last_seq=int(item.get(schema.LAST_SEQ, 0)),
        owner_key=item.get(schema.OWNER_KEY, ""),
    )


def unreachable_in(sessions: Mapping[str, SessionState], connections: Mapping[str, ConnState]) -> dict[str, str]:
    """Connections no worker would ever take (:func:`wsfleet.leases.unreachable`), by
    why, from ``sessions`` read BEFORE ``connections``: a session out of the ring never
    comes back into it, so a connection read attached to one after it was seen out is
    unreachable then. (Read the other way round, a drain that frees a connection and
    then takes its session out of the ring would look like a violation.) A session
    missing from ``sessions`` is newer than that read, not gone: it is left out."""
    found = {}
    for cid, c in connections.items():
        session = sessions.get(c.session) if c.session else None
        if c.session and session is None:
            continue
        item = {schema.DESIRED_STATE: c.desired_state, schema.LEASE_SESSION: c.session, schema.OWNER_KEY: c.owner_key}
        raw = None if session is None else {schema.SESSION_STATE: session.state, **({schema.RING: schema.RING_VALUE} if session.in_ring else {})}
        why = unreachable(item, raw)
        if why is not None:
            found[cid] = why.value
    return found


class Observed(Protocol):
    """What the reachability check reads of an observer sample (a :class:`Sample`, or a
    chaos run's snapshot of one)."""

    @property
    def t(self) -> float: ...
    @property
    def connections(self) -> Mapping[str, ConnState]: ...
    @property
    def sessions(self) -> Mapping[str, SessionState]: ...


def reachability_violations(samples: Sequence[Observed]) -> list[tuple[float, str, str]]:
    """(time, connection, why) for every connection found unreachable between two
    consecutive samples: the first one's sessions (each sample reads its connections,
    then its sessions) against the next one's connections."""
    return [
        (cur.t, cid, why)
        for prev, cur in itertools.pairwise(samples)
        for cid, why in unreachable_in(prev.sessions, cur.connections).items()
    ]


@dataclass
class Audit:
    """One connection's messages after the run, against the upstream's books."""

    connection_id: str
    rows: int
    first: int | None
    last: int | None
    checkpoint: int
    produced: int  # the stream's head
    delivered: int  # distinct seqs the upstream sent to any socket
    missing: list[int] = field(default_factory=list)  # seqs absent below the last stored one

    @property
    def ok(self) -> bool:
        """Exactly 1..checkpoint stored (seq is the key, so a count equal to the range
        means no gap; duplicates cannot exist as rows)."""
        return not self.missing and self.rows == self.checkpoint and (self.last or 0) == self.checkpoint


@dataclass
class LargeFrame:
    """One frame of large data: what the upstream sent (its books) against what the
    fleet stored and reads back (the item, then its S3 object)."""

    connection_id: str
    seq: int
    sent_bytes: int  # the data's compact JSON, UTF-8
    sent_sha256: str
    stored: str  # "object", "inline", "marker" or "absent"
    data_ref: str | None = None
    item_bytes: int | None = None  # what the item says
    item_sha256: str | None = None
    read_bytes: int | None = None  # what the object read back holds
    read_sha256: str | None = None

    @property
    def ok(self) -> bool:
        """Stored as an object that holds exactly what was sent, as its item says."""
        sent = (self.sent_bytes, self.sent_sha256)
        return self.stored == "object" and (self.item_bytes, self.item_sha256) == sent == (self.read_bytes, self.read_sha256)


# --- the fleet ------------------------------------------------------------------------------------


class Fleet:
    """Everything one local run needs, owned by one object. Use it as a context manager."""

    def __init__(
        self,
        *,
        run_dir: Path | str,
        timing: Timing = Timing(),
        rate: float = 2.0,
        worker_env: Mapping[str, str] | None = None,
        emulator: EmulatorProcess | None = None,
        sample_interval: float | None = 0.5,
        on_sample: Callable[[Sample], None] | None = None,
        keep_samples: bool = True,
        runtime_dir: Path | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.timing = timing
        self.rate = rate
        self._extra_env = dict(worker_env or {})
        self._own_emulator = emulator is None
        self._runtime_dir = runtime_dir  # see pin_runtime
        self.emulator = emulator or EmulatorProcess(self.run_dir / "emulator.log", runtime_dir=runtime_dir)
        self.sample_interval = sample_interval
        self._on_sample = on_sample
        self._keep_samples = keep_samples  # off: only on_sample sees them (long runs)
        self.workers: dict[str, Process] = {}
        self.aws_env: dict[str, str] = {}
        self.upstream: ThreadedUpstream | None = None
        self.api: LocalApi | None = None
        self.samples: list[Sample] = []
        self._observer: threading.Thread | None = None
        self._observing = threading.Event()
        self._closed = False
        self._close_lock = threading.Lock()
        self._old_sigterm: Any = None
        self._api_log: Any = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> "Fleet":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            if self._own_emulator:
                self.emulator.start()
            self.aws_env = self.emulator.create_resources()
            self._ddb = self._client("dynamodb", harness=True)
            self.messages_store = MessagesStore(self._ddb, self.aws_env["MESSAGES_TABLE_NAME"])
            self.objects_store = ObjectsStore(self._client("s3", harness=True), self.aws_env["MESSAGES_BUCKET_NAME"])
            self.upstream = ThreadedUpstream(host=LOOPBACK, rate=self.rate).start()
            self._start_api()
            if self.sample_interval is not None:
                self._observing.set()
                self._observer = threading.Thread(target=self._observe, name="fleet-observer", daemon=True)
                self._observer.start()
        except BaseException:
            self.close()
            raise
        return self

    def _client(self, service: str, *, harness: bool = False) -> Any:
        return emulator_session(self.aws_env.get("AWS_REGION", DEFAULT_REGION)).client(
            service,
            endpoint_url=self.emulator.endpoint_url,
            config=Config(
                retries={"mode": "standard", "max_attempts": 5}, connect_timeout=2, read_timeout=10,
                user_agent_extra=HARNESS_MARK if harness else None,
            ),
        )

    def _start_api(self) -> None:
        from ..router import Router, make_presigner

        env = {**self.aws_env, cfg.ALLOWED_WS_HOSTS: LOOPBACK}
        self._api_log = open(self.run_dir / "api.log", "a", buffering=1)
        # The data URLs it presigns are signed with the emulator's credentials, which
        # this process has in aws_env, not in its own environment.
        signing = emulator_session(self.aws_env.get("AWS_REGION", DEFAULT_REGION))
        router = Router.from_env(
            env, ddb=self._client("dynamodb"), sqs=self._client("sqs"),
            s3=make_presigner(cfg.RouterConfig.from_env(env), session=signing),
            logger=JsonLogger(self._api_log, component="router"),
        )
        self.api = LocalApi(router.handle, LOOPBACK, 0).start()

    def close(self) -> None:
        """Stop everything this fleet started: workers (SIGKILL), observer, API, upstream,
        emulator. Safe to call twice and from atexit."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        main = threading.current_thread() is threading.main_thread()
        old_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # a second Ctrl-C must not cut this short
        try:
            for proc in self.workers.values():
                stop_process(proc)
                if proc.state in ("running", "paused"):
                    proc.state = "killed"
            self._observing.clear()
            if self._observer is not None:
                self._observer.join(timeout=15)
            if self.api is not None:
                self.api.stop()
            if self.upstream is not None:
                self.upstream.stop(timeout=10)
            if self._own_emulator:
                self.emulator.stop()
            if self._api_log is not None:
                self._api_log.close()
        finally:
            if main:
                signal.signal(signal.SIGINT, old_sigint)
                if self._old_sigterm is not None:
                    signal.signal(signal.SIGTERM, self._old_sigterm)
            atexit.unregister(self.close)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workers -------------------------------------------------------------------------

    def worker_environment(self, name: str, **overrides: str) -> dict[str, str]:
        env = child_env(
            **self.aws_env,
            **self.timing.env(),
            **{cfg.WORKER_ID: name, cfg.METRICS_SECONDS: "5"},
            **self._extra_env,
            **overrides,
        )
        return pinned(env, self._runtime_dir)

    def start_worker(self, name: str, *, wait: bool = True, timeout: float = 30.0, **env_overrides: str) -> Process:
        """Start ``python -m wsfleet.worker`` as WORKER_ID ``name``; with ``wait``, return
        once it logged ``worker_started`` (it is then polling and reconciling)."""
        if name in self.workers and self.workers[name].alive():
            raise ValueError(f"worker {name!r} is already running")
        proc = spawn(
            name,
            [sys.executable, "-m", "wsfleet.worker"],
            self.worker_environment(name, **env_overrides),
            self.run_dir / f"{name}.log",
        )
        self.workers[name] = proc
        if wait:
            self.wait_started(name, timeout=timeout)
        return proc

    def wait_started(self, name: str, *, timeout: float = 30.0) -> None:
        proc = self.workers[name]

        def started() -> bool:
            if not proc.alive():
                raise RuntimeError(f"worker {name} exited at start-up; see {proc.log_path}")
            return any(e["event"] == "worker_started" for e in self.events(name))

        eventually(started, timeout, f"worker {name} to start")

    def kill(self, name: str) -> float:
        """SIGKILL, as a crash or an OOM kill would; returns when it was sent (epoch s)."""
        proc = self.workers[name]
        at = time.time()
        proc.popen.kill()
        proc.popen.wait()
        proc.state = "killed"
        return at

    def terminate(self, name: str, *, timeout: float = 30.0) -> tuple[float, int]:
        """SIGTERM (what ECS sends at a deploy) and wait for the exit; returns when it was
        sent (epoch s) and the exit status."""
        proc = self.workers[name]
        at = time.time()
        proc.popen.send_signal(signal.SIGTERM)
        status = proc.popen.wait(timeout)
        proc.state = "terminated"
        return at, status

    def pause(self, name: str) -> float:
        """SIGSTOP: a process frozen mid-flight (a long GC, a stalled VM); returns when (epoch s)."""
        proc = self.workers[name]
        at = time.time()
        os.kill(proc.pid, signal.SIGSTOP)
        proc.state = "paused"
        return at

    def resume(self, name: str) -> float:
        proc = self.workers[name]
        at = time.time()
        os.kill(proc.pid, signal.SIGCONT)
        proc.state = "running"
        return at

    def live_workers(self) -> list[str]:
        return [name for name, p in self.workers.items() if p.state == "running" and p.alive()]

    def events(self, name: str) -> list[dict]:
        """The worker's JSON log events so far."""
        out = []
        for line in self.workers[name].lines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short by a kill
        return out

    # -- the API (real HTTP) --------------------------------------------------------------

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, dict]:
        assert self.api is not None
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.api.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def ws_url(self, connection_id: str) -> str:
        assert self.upstream is not None
        return self.upstream.url_for(connection_id)

    def start_connection(
        self, connection_id: str, ws_url: str | None = None, *, upstream: Mapping[str, Any] | None = None,
        shape: str = DEFAULT_SHAPE,
    ) -> int:
        """POST a START (with its ``upstream`` object if given); the upstream stream exists
        (and produces, its frames in ``shape``) from now on. Returns the status."""
        assert self.upstream is not None
        self.upstream.create_stream(connection_id, shape=shape)
        event: dict[str, Any] = {"event_type": "START", "connection_id": connection_id, "ws_url": ws_url or self.ws_url(connection_id)}
        if upstream is not None:
            event["upstream"] = dict(upstream)
        status, body = self.request("POST", "/events", event)
        if status >= 400:
            raise RuntimeError(f"START {connection_id} answered {status}: {body}")
        return status

    def stop_connection(self, connection_id: str) -> int:
        status, body = self.request("POST", "/events", {"event_type": "STOP", "connection_id": connection_id})
        if status >= 400:
            raise RuntimeError(f"STOP {connection_id} answered {status}: {body}")
        return status

    def get_connection(self, connection_id: str) -> tuple[int, dict]:
        return self.request("GET", f"/connections/{connection_id}")

    # -- reading the backend and the books -------------------------------------------------

    def _scan_items(self, table: str) -> list[dict]:
        out: list[dict] = []
        kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
        while True:
            resp = self._ddb.scan(**kwargs)
            out.extend(unmarshal(raw) for raw in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def sessions(self) -> dict[str, SessionState]:
        """Every worker session, read now (a consistent Scan)."""
        items = self._scan_items(self.aws_env["SESSIONS_TABLE_NAME"])
        return {item[schema.SESSION_ID]: session_from_item(item) for item in items}

    def read_ownership(self) -> tuple[float, dict[str, ConnState], dict[str, SessionState]]:
        """(when, connections, sessions): the connections table, then the sessions table,
        each with one consistent Scan. In that order, every session a connection names
        was written before it was read, so it is in the second scan, and its state there
        is at least as new as the connection's; the time is taken after both."""
        conn_items = self._scan_items(self.aws_env["TABLE_NAME"])
        sessions = self.sessions()
        t = time.time()
        connections = {
            schema.connection_id_from_pk(item[schema.PK]): state_from_item(item, sessions) for item in conn_items
        }
        return t, connections, sessions

    def scan(self) -> dict[str, ConnState]:
        """Every connection with its session's state, read now."""
        return self.read_ownership()[1]

    def owned_by(self, name: str) -> set[str]:
        """STARTED connections attached to a live session of worker ``name``, read now."""
        t, connections, _ = self.read_ownership()
        now = int(t * 1000)
        return {cid for cid, c in connections.items() if c.desired_state == schema.STARTED and c.owned_at(now) == name}

    def sessions_of(self, name: str) -> dict[str, SessionState]:
        """Every session worker ``name`` opened so far, by session id."""
        return {sid: s for sid, s in self.sessions().items() if s.worker_id == name}

    def messages(self, connection_id: str) -> list[dict]:
        return self.messages_store.read_all(connection_id)

    def large_frame(self, connection_id: str, seq: int) -> LargeFrame:
        """Read one seq back as a user does, through the read API (GET
        /connections/{id}/messages, then the entry's presigned data_url), against the
        upstream's book of what it sent and what the item says."""
        assert self.upstream is not None
        sent = json.dumps(json.loads(self.upstream.frames(connection_id)[seq])["data"], separators=(",", ":"), ensure_ascii=False)
        sent_bytes = sent.encode("utf-8")
        out = LargeFrame(connection_id, seq, len(sent_bytes), hashlib.sha256(sent_bytes).hexdigest(), stored="absent")
        status, page = self.request("GET", f"/connections/{connection_id}/messages?after_seq={seq - 1}&limit=1")
        entry = next((e for e in page.get("messages", []) if e.get("seq") == seq), None) if status == 200 else None
        if entry is None:
            return out
        if "data_url" not in entry:
            out.stored = "marker" if "skipped" in entry else "inline"
            return out
        with urllib.request.urlopen(entry["data_url"], timeout=30) as resp:
            body = resp.read()
        # Its item: the first after seq - 1 (one Query of one item, not the whole partition).
        item = next(self.messages_store.read_after(connection_id, seq - 1, batch=1), {})
        if item.get(schema.MSG_SK) != seq:
            item = {}
        out.stored, out.data_ref = "object", item.get(schema.DATA_REF)
        out.item_bytes, out.item_sha256 = entry.get("data_bytes"), entry.get("data_sha256")
        out.read_bytes, out.read_sha256 = len(body), hashlib.sha256(body).hexdigest()
        return out

    def sample(self) -> Sample:
        assert self.upstream is not None
        t, connections, sessions = self.read_ownership()
        stats = self.upstream.stats()["streams"]
        return Sample(
            t=t,
            connections=connections,
            open_sockets={name: s["open_sockets"] for name, s in stats.items()},
            produced=sum(s["produced"] for s in stats.values()),
            frames_sent=sum(s["frames_sent"] for s in stats.values()),
            sessions=sessions,
            heads={name: s["produced"] for name, s in stats.items()},
            sent_heads={name: s["sent_head"] for name, s in stats.items()},
        )

    def _observe(self) -> None:
        next_at = time.monotonic()
        while self._observing.is_set():
            try:
                sample = self.sample()
            except Exception as exc:  # noqa: BLE001 - a missed sample must not end the run
                log.warning("observer: sample failed: %s: %s", type(exc).__name__, exc, extra={"event": "observer_sample_failed"})
            else:
                if self._keep_samples:
                    self.samples.append(sample)
                if self._on_sample is not None:
                    self._on_sample(sample)
            next_at += self.sample_interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def wait_connected(self, connection_ids: list[str] | set[str], *, timeout: float) -> None:
        """Until every one has an open upstream socket and a live owner."""

        def done() -> bool:
            t, states, _ = self.read_ownership()
            now = int(t * 1000)
            return all(
                self.upstream.open_sockets(c) and c in states and states[c].owned_at(now) for c in connection_ids
            )

        eventually(done, timeout, f"{len(connection_ids)} connections to be owned and connected", interval=0.2)

    def wait_quiet(
        self, connection_ids: list[str] | set[str], *, timeout: float, streams: Mapping[str, list[str]] | None = None
    ) -> None:
        """Until none has an open socket or a session (after STOPs, before the audit).
        ``streams``: per connection, every stream it may have a socket on (default: the
        one named after it)."""

        def done() -> bool:
            states = self.scan()
            return all(
                not any(self.upstream.open_sockets(s) for s in (streams or {}).get(c, [c])) and not states[c].session
                for c in connection_ids
            )

        eventually(done, timeout, f"{len(connection_ids)} connections to be closed and released", interval=0.2)

    def _stored_seqs(self, connection_id: str) -> list[int]:
        """Every seq stored for a connection, ascending (seq is the sort key): one
        keys-only query, paginated. moto answers a query in time that grows with the
        whole table, so one query per connection rather than three (count, lowest,
        highest) keeps the final audit of a long run short."""
        kwargs: dict[str, Any] = {
            "TableName": self.aws_env["MESSAGES_TABLE_NAME"],
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": schema.MSG_PK, "#s": schema.MSG_SK},
            "ExpressionAttributeValues": {":p": {"S": schema.connection_pk(connection_id)}},
            "ProjectionExpression": "#s",
            "ConsistentRead": True,
        }
        seqs: list[int] = []
        while True:
            resp = self._ddb.query(**kwargs)
            seqs.extend(int(item[schema.MSG_SK]["N"]) for item in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return seqs
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def audit(self, connection_ids: list[str] | set[str] | None = None) -> list[Audit]:
        """Each connection's stored seqs against its checkpoint and the upstream's books."""
        assert self.upstream is not None
        states = self.scan()
        out = []
        for cid in sorted(connection_ids if connection_ids is not None else states):
            seqs = self._stored_seqs(cid)
            first, last = (seqs[0], seqs[-1]) if seqs else (None, None)
            present = set(seqs)
            missing = [s for s in range(1, (last or 0) + 1) if s not in present]
            delivered: set[int] = set()
            for record in self.upstream.sockets(cid):
                if record.first_seq_sent is not None:
                    delivered.update(range(record.first_seq_sent, record.last_seq_sent + 1))
            out.append(
                Audit(
                    connection_id=cid,
                    rows=len(seqs),
                    first=first,
                    last=last,
                    checkpoint=states[cid].last_seq if cid in states else 0,
                    produced=self.upstream.produced(cid),
                    delivered=len(delivered),
                    missing=missing,
                )
            )
        return out


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


_names = itertools.count(1)


def new_run_dir(root: Path | str = ".demo") -> Path:
    """``<root>/<timestamp>``, unique within this process."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / stamp
    while path.exists():
        path = Path(root) / f"{stamp}-{next(_names)}"
    return path
