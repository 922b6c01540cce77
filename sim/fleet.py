"""The whole fleet on one machine, as real processes: what ``make demo`` runs and what
the fleet tests drive.

A :class:`Fleet` owns everything it starts:

* the local AWS backend, ``python -m sim.emulator`` in a process of its own
  (or a shared :class:`~sim.children.EmulatorProcess`), with tables and a queue of its own;
* K workers, each ``python -m wsfleet.worker`` in a process of its own, with its JSON
  log in ``<run_dir>/<name>.log``;
* the upstream (:class:`~sim.upstream.ThreadedUpstream`) and the API
  (:class:`~sim.api.LocalApi` in front of the event router) as threads of
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
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

from botocore.config import Config

from wsfleet import config as cfg
from wsfleet import settings_spec
from wsfleet import schema, tracing
from wsfleet.logs import JsonLogger
from wsfleet.sinks import MessagesStore, ObjectsStore
from wsfleet.store import unmarshal
from .api import LocalApi
from .children import EmulatorProcess, child_env, pinned
from .emulator import dead_letters, record_journal
from .emulator_client import DEFAULT_REGION, emulator_session
from .emulator_faults import HARNESS_MARK
from .fleet_audit import FleetAudit
from .observed import ConnState, Sample, SessionState, session_from_item, state_from_item
from .processes import LOOPBACK, Process, eventually, spawn, stop_process
from .timing import Timing
from .upstream import DEFAULT as DEFAULT_SHAPE
from .upstream import ThreadedUpstream

log = logging.getLogger(__name__)


# --- the fleet ------------------------------------------------------------------------------------


class Fleet(FleetAudit):
    """Everything one local run needs, owned by one object. Use it as a context manager.
    What it stored is read back by the methods of :class:`FleetAudit`."""

    def __init__(
        self,
        *,
        run_dir: Path | str,
        timing: Timing = Timing(),  # noqa: B008 - frozen: one shared default is safe
        rate: float = 2.0,
        worker_env: Mapping[str, str] | None = None,
        emulator: EmulatorProcess | None = None,
        sample_interval: float | None = 0.5,
        on_sample: Callable[[Sample], None] | None = None,
        keep_samples: bool = True,
        runtime_dir: Path | None = None,
        sink: str = schema.SINK_DYNAMODB,
        partition_writes_per_s: float = 0,  # its own emulator's limit per partition (sim.emulator_partitions)
        traces: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        # TRACING=otel, every process's spans as OTLP JSON lines in traces-<name>.jsonl.
        self.traces = traces
        self.sinks = cfg.sinks({settings_spec.SINK: sink})  # a bad value fails here, naming SINK
        self.timing = timing
        self.rate = rate
        self._extra_env = dict(worker_env or {})
        self._own_emulator = emulator is None
        self._runtime_dir = runtime_dir  # see pin_runtime
        self.emulator = emulator or EmulatorProcess(
            self.run_dir / "emulator.log", runtime_dir=runtime_dir, partition_writes_per_s=partition_writes_per_s
        )
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
        self._journaling = False  # we switched the emulator's journal on (off again at close)
        self._delivery_bodies: dict[str, bytes] = {}

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> "Fleet":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            if self._own_emulator:
                self.emulator.start()
            self.aws_env = self.emulator.create_resources(",".join(self.sinks))
            if schema.SINK_KINESIS in self.sinks or schema.SINK_FIREHOSE in self.sinks:
                # What a takeover resumed from (the stream audit's evidence): from before any START.
                record_journal(self.emulator.endpoint_url)
                self._journaling = True
            if schema.SINK_KINESIS in self.sinks:
                self._kinesis = self._client("kinesis", harness=True)
            if schema.SINK_FIREHOSE in self.sinks:
                self._firehose = self._client("firehose", harness=True)
            self._ddb = self._client("dynamodb", harness=True)
            self.messages_store = MessagesStore(self._ddb, self.aws_env["MESSAGES_TABLE_NAME"])
            self._s3 = self._client("s3", harness=True)
            self.objects_store = ObjectsStore(self._s3, self.aws_env["MESSAGES_BUCKET_NAME"])
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
                # The harness's audits page through partitions of a quarter of a million
                # rows, which moto filters in Python page after page: on a loaded machine a
                # page took longer than 10 s and a 30-minute soak's audit died of it.
                retries={"mode": "standard", "max_attempts": 5}, connect_timeout=2, read_timeout=60 if harness else 10,
                user_agent_extra=HARNESS_MARK if harness else None,
            ),
        )

    def _start_api(self) -> None:
        from wsfleet.router import Router, make_presigner

        env = {**self.aws_env, settings_spec.ALLOWED_WS_HOSTS: LOOPBACK}
        if self.traces:  # the API's router runs in this process
            tracing.configure(tracing.Settings(tracing.OTEL, file=str(self.trace_file("api"))), "wsfleet-router")
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
            if self.traces:
                tracing.reset()  # flushed and closed
            if self.upstream is not None:
                self.upstream.stop(timeout=10)
            if self._own_emulator:
                self.emulator.stop()
            elif self._journaling:
                record_journal(self.emulator.endpoint_url, False)  # a shared emulator: leave it as it was
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
            **{settings_spec.WORKER_ID: name, settings_spec.METRICS_SECONDS: "5"},
            **self._extra_env,
            **(self._traced(name) if self.traces else {}),
            **overrides,
        )
        return pinned(env, self._runtime_dir)

    def _traced(self, name: str) -> dict[str, str]:
        # A short batch delay: a worker killed at the end loses at most a second of spans.
        return {settings_spec.TRACING: "otel", settings_spec.TRACING_FILE: str(self.trace_file(name)), "OTEL_BSP_SCHEDULE_DELAY": "1000"}

    def trace_file(self, name: str) -> Path:
        return self.run_dir / f"traces-{name}.jsonl"

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

    def dead_letters(self) -> int:
        """Hints the START queue has moved to its dead-letter queue so far (received
        ``MAX_HINT_RECEIVES`` times without a delete): none, in joins, crashes and deploys."""
        return dead_letters(self._client("sqs", harness=True), self.aws_env["QUEUE_URL"])

    def sessions_of(self, name: str) -> dict[str, SessionState]:
        """Every session worker ``name`` opened so far, by session id."""
        return {sid: s for sid, s in self.sessions().items() if s.worker_id == name}

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
