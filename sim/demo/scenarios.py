"""The demo's scenarios: a :class:`Demo` plays one on a running fleet, step after step,
keeps the event books and prints the report (see :mod:`.cli` for what each step does)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Sequence

from wsfleet import settings_spec
from wsfleet import schema
from .. import kind_streams, pictures, report, traces
from ..stream_audit import StreamAudit
from ..children import RUNTIME_DIR
from ..fleet import Fleet
from ..observed import Sample
from ..processes import eventually

SCENARIOS = {
    "full": ("crash", "deploy", "stop", "burst", "scale_out"),
    "crash": ("crash",),
    "deploy": ("deploy",),
    "pause": ("pause",),
    "scale-out": ("scale_out",),
    "steady": (),
}
STEP_LENGTH = {"scale_out": 4}  # in step lengths: a join's first moves come 15-50 s after it
PROGRESS_EVERY_S = 2.0
LARGE_FRAME_BYTES = 3 * 1024 * 1024  # the demo's one large frame: an S3 object, not an item
LARGE_FRAME_WAIT_S = 30.0  # at most, for it to be checkpointed before the closing STOPs


class Demo:
    """Plays a scenario on a fleet and keeps the event books the report is built from."""

    def __init__(self, fleet: Fleet, args: argparse.Namespace, out=sys.stdout) -> None:
        self.fleet = fleet
        self.args = args
        self.out = out
        self.phase = "setup"
        self.t_origin = time.time()
        self.events: list[report.Event] = []
        self.connections: list[str] = []  # every connection ever STARTed, in order
        self._stopped: list[str] = []
        self._next_id = 1
        self._next_worker = 1
        self._progress: list[Sample] = []  # the samples progress lines were printed for
        self.large: tuple[str, int] | None = None  # (connection, seq) of the large frame sent
        self.kinds = kind_streams.KindStreams(fleet, self.say) if getattr(args, "kinds", True) else None
        self.kind_ids: list[str] = []
        self.crashed: tuple[str, float] | None = None  # (worker, when): the first crash
        self._print_lock = threading.Lock()

    def say(self, line: str) -> None:
        with self._print_lock:
            print(line, file=self.out, flush=True)

    def on_sample(self, sample: Sample) -> None:
        """The observer's callback: a progress line every couple of seconds. The stored
        rate is taken over two checkpoint intervals: checkpoints, written at most every
        CHECKPOINT_SECONDS per connection, move in steps."""
        if self.phase == "setup":
            return
        if self._progress and sample.t - self._progress[-1].t < PROGRESS_EVERY_S:
            return
        window = max(PROGRESS_EVERY_S, 2 * self.fleet.timing.checkpoint_s)
        earlier = next((s for s in reversed(self._progress) if sample.t - s.t >= window), None)
        earlier = earlier or (self._progress[0] if self._progress else None)
        self._progress.append(sample)
        states = {name: p.state for name, p in self.fleet.workers.items()}
        self.say(report.progress_line(sample.t - self.t_origin, self.phase, sample, earlier, states))

    # -- steps ------------------------------------------------------------------------------------

    def new_ids(self, n: int) -> list[str]:
        ids = [f"c{self._next_id + i:03d}" for i in range(n)]
        self._next_id += n
        return ids

    def start_workers(self, n: int) -> list[str]:
        names = [self._worker_name() for _ in range(n)]
        for name in names:
            self.fleet.start_worker(name, wait=False)
        for name in names:
            self.fleet.wait_started(name)
        return names

    def _worker_name(self) -> str:
        name = f"w{self._next_worker}"
        self._next_worker += 1
        return name

    def start(self, ids: Sequence[str], label: str) -> report.Event:
        self.phase = "start"
        event = self._record(report.START, label, time.time(), dict.fromkeys(ids, 0.0), self.fleet.timing.start_bound_s)
        for cid in ids:
            event.affected[cid] = time.time()  # each START is timed from its own request
            self.fleet.start_connection(cid)
            if cid not in self.connections:
                self.connections.append(cid)
        self._await(event)
        return event

    def send_large_frame(self) -> None:
        cid = self.connections[0]
        seq = self.fleet.upstream.publish(cid, {"kind": "large frame", "text": "x" * LARGE_FRAME_BYTES})
        self.large = (cid, seq)
        self.say(f"           large frame: {cid} seq {seq}, {LARGE_FRAME_BYTES / 2**20:g} MiB of data: stored through S3")

    def _await_large_frame(self) -> None:
        """Until the large frame is checkpointed, before the STOPs: a STOP closes the
        socket with what is in flight unacknowledged (a START resumes from the
        checkpoint), so a short run would otherwise STOP it away and never store it.
        Bounded: a frame never stored shows in the audit."""
        if self.large is None or self.large[0] in self._stopped:
            return
        cid, seq = self.large
        try:
            # One item through the API (GET), not a Scan of every connection each poll.
            eventually(lambda: int(self.fleet.get_connection(cid)[1].get("last_seq") or 0) >= seq, LARGE_FRAME_WAIT_S,
                       f"the large frame ({cid} seq {seq}) to be checkpointed", interval=0.2)
        except TimeoutError as exc:
            self.say(f"           {exc}; stopping anyway")

    def crash(self) -> report.Event:
        self.phase = "crash"
        # The stream that cannot replay must live through a crash: its owner is the victim.
        owner = self.kinds.owner_of_live_only() if self.kinds is not None else None
        victim = owner if owner in self.fleet.live_workers() else self._busiest()
        affected = self.fleet.owned_by(victim)
        at = self.fleet.kill(victim)
        self.crashed = self.crashed or (victim, at)
        event = self._record(report.CRASH, f"crash: kill -9 {victim}", at, dict.fromkeys(affected, at), self.fleet.timing.crash_bound_s, victim)
        self._await(event)
        return event

    def deploy(self) -> report.Event:
        self.phase = "deploy"
        victim = self._busiest()
        (replacement,) = self.start_workers(1)
        affected = self.fleet.owned_by(victim)
        at = time.time()
        self.say(f"           deploy: {replacement} is up; SIGTERM {victim}, which owns {len(affected)}")
        _, status = self.fleet.terminate(victim, timeout=self.fleet.timing.shutdown_s + 10)
        self.say(f"           {victim} exited with status {status} after {time.time() - at:.2f}s")
        event = self._record(
            report.DEPLOY, f"deploy: SIGTERM {victim}, {replacement} new", at, dict.fromkeys(affected, at),
            self.fleet.timing.graceful_bound_s, victim,
        )
        self._await(event)
        return event

    def pause(self) -> report.Event:
        self.phase = "pause"
        victim = self._busiest()
        affected = self.fleet.owned_by(victim)
        at = self.fleet.pause(victim)
        event = self._record(report.PAUSE, f"pause: SIGSTOP {victim}", at, dict.fromkeys(affected, at), self.fleet.timing.crash_bound_s, victim)
        self._await(event)
        # Stay frozen a little longer than the lease, then wake up to find it gone.
        time.sleep(max(0.0, at + self.fleet.timing.lease_s + self.fleet.timing.heartbeat_s - time.time()))
        sessions = len(self.fleet.sessions_of(victim))
        event.until = self.fleet.resume(victim)
        self.say(f"           SIGCONT {victim}: it must close its stale sockets, write nothing more and open a new session")
        try:
            eventually(lambda: len(self.fleet.sessions_of(victim)) > sessions, 10, f"a new session of {victim}", interval=0.2)
            self.say(f"           {victim} is back with a new session")
        except TimeoutError as exc:
            self.say(f"           {exc}")
        return event

    def scale_out(self) -> report.Event:
        self.phase = "scale-out"
        held = {cid for cid, owner in self.fleet.sample().owners().items() if owner}
        (newcomer,) = self.start_workers(1)
        at = time.time()
        return self._record(
            report.JOIN, f"scale-out: {newcomer} joins, no STARTs", at, dict.fromkeys(held, at), self.fleet.timing.graceful_bound_s
        )

    def stop(self) -> report.Event:
        self.phase = "stop"
        running = [c for c in self.connections if c not in self._stopped]
        chosen = running[-max(1, len(running) // 4):]
        event = self._record(report.STOP, f"STOP {len(chosen)}", time.time(), dict.fromkeys(chosen, 0.0), self.fleet.timing.stop_bound_s)
        for cid in chosen:
            event.affected[cid] = time.time()
            self.fleet.stop_connection(cid)
        self._stopped.extend(chosen)
        self._await(event)
        return event

    def burst(self) -> report.Event:
        restart = self._stopped[: (len(self._stopped) + 1) // 2]
        self._stopped = self._stopped[len(restart):]
        fresh = self.new_ids(max(1, self.args.connections // 4))
        label = f"START burst: {len(fresh)} new" + (f", {len(restart)} restarted" if restart else "")
        return self.start(fresh + restart, label)

    def _busiest(self) -> str:
        counts = self.fleet.sample().owned_counts()
        live = self.fleet.live_workers()
        if not live:
            raise RuntimeError("no live worker left")
        return max(live, key=lambda name: (counts.get(name, 0), name))

    def _record(self, kind: str, label: str, at: float, affected: dict[str, float], bound: float, victim: str | None = None) -> report.Event:
        event = report.Event(kind, label, at, affected, bound_s=bound, victim=victim)
        self.events.append(event)
        self.say(f"[{at - self.t_origin:6.1f}s] EVENT {label} ({len(affected)} connections)")
        return event

    def _await(self, event: report.Event) -> None:
        """Until every affected connection is done (or well past the bound), then say how it went."""
        limit = (event.bound_s or 10) * 2 + 10

        def outcome() -> report.Outcome | None:
            o = report.measure(event, self._sockets(event.affected), self.fleet.samples)
            return o if not o.pending else None

        try:
            o = eventually(outcome, limit, event.label, interval=0.2)
        except TimeoutError:
            o = report.measure(event, self._sockets(event.affected), self.fleet.samples)
        self.say(
            f"           {event.label}: {len(o.done)}/{len(event.affected)} done, "
            f"p50 {report.fmt_s(o.p50)}, max {report.fmt_s(o.max)} (bound {report.fmt_s(event.bound_s)})"
        )

    def _sockets(self, ids) -> dict:
        return {cid: self.fleet.upstream.sockets(cid) for cid in ids}

    def start_kinds(self) -> report.Event:
        """START one connection of each upstream kind, timed as a START event."""
        assert self.kinds is not None
        self.phase = "start"
        at = time.time()
        self.kind_ids = self.kinds.start()
        event = self._record(report.START, f"START {len(self.kind_ids)} upstream kinds", at,
                             dict.fromkeys(self.kind_ids, at), self.fleet.timing.start_bound_s)
        self._await(event)
        return event

    def hold(self, until: float) -> None:
        self.phase = "steady"
        time.sleep(max(0.0, until - time.time()))

    # -- the whole run ----------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        fleet = self.fleet
        self.say(f"wsfleet demo: {args.workers} workers, {args.connections} connections, scenario {args.scenario}; logs in {fleet.run_dir}")
        self.start_workers(args.workers)
        self.say(f"           API: {fleet.api.url}   upstream: {fleet.upstream.url}   backend: {fleet.emulator.endpoint_url}")
        self.say(f"           try: curl -s {fleet.api.url}/connections/c001")
        self.say(f"           cli: env PYTHONPATH={RUNTIME_DIR} {' '.join(f'{k}={v}' for k, v in fleet.aws_env.items())} {sys.executable} -m wsfleet status  (start/stop/get/messages: --api {fleet.api.url})")
        steps = SCENARIOS[args.scenario]
        gap = args.duration / (1 + sum(STEP_LENGTH.get(step, 1) for step in steps))
        began = time.time()
        self.start(self.new_ids(args.connections), f"START {args.connections}")
        self.send_large_frame()
        if self.kinds is not None:
            self.start_kinds()
            self.hold(began + gap / 2)
            self.kinds.rotate()
            self.kinds.cut()
        until = began + gap
        self.hold(until)
        for step in steps:
            getattr(self, step)()
            until += gap * STEP_LENGTH.get(step, 1)
            self.hold(until)
        return self.finish()

    def finish(self) -> int:
        fleet = self.fleet
        self.phase = "quiesce"
        running = [c for c in self.connections if c not in self._stopped] + self.kind_ids
        ended_at = time.time()
        report.close_steps(self.events, ended_at)
        self._await_large_frame()
        self.say(f"[{ended_at - self.t_origin:6.1f}s] STOP the remaining {len(running)} connections, then audit every message")
        for cid in running:
            fleet.stop_connection(cid)
        try:
            fleet.wait_quiet(self.connections + self.kind_ids, timeout=fleet.timing.stop_bound_s * 2 + fleet.timing.lease_s + 10)
        except TimeoutError as exc:
            self.say(f"           {exc}; auditing anyway")
        time.sleep(2 * fleet.sample_interval)  # let the observer see the quiet fleet
        self.phase = "audit"
        audits = fleet.audit(self.connections)
        large = fleet.large_frame(*self.large) if self.large else None
        kinds = self.kinds.audit() if self.kinds is not None else []
        # The stream, where it is a sink: every connection's order and deliveries again;
        # the data of the default-protocol ones (the kinds' is in their own audit). Not
        # the assigned-seq kinds': after a crash their seqs jump past what the dead owner
        # reserved; nor the live-only one (resume none), whose first seq is whatever its
        # first socket was sent, not 1 (their own audits read the stream as a consumer
        # keeps it).
        assigned = ({k.connection_id for k in self.kinds.streams if k.assigned or k.live_only}
                    if self.kinds is not None else set())
        audited = [c for c in self.connections + self.kind_ids if c not in assigned]
        # The same rules over the delivery stream's objects, where it is a sink (in the
        # order a reader sorts them: sim.delivery_audit).
        streams: dict[str, tuple[str, StreamAudit]] = {}
        if schema.SINK_KINESIS in fleet.sinks:
            streams["the messages stream"] = (fleet.aws_env[settings_spec.MESSAGES_STREAM_NAME], fleet.stream_audit(
                audited, data_of=self.connections, deliveries=[d for d in fleet.read_stream() if d.partition_key not in assigned]))
        if schema.SINK_FIREHOSE in fleet.sinks:
            streams["the delivery stream"] = (fleet.aws_env[settings_spec.MESSAGES_DELIVERY_STREAM_NAME], fleet.delivery_audit(
                audited, data_of=self.connections, deliveries=[d for d in fleet.read_delivery() if d.partition_key not in assigned]))
        stream = streams.get("the messages stream", streams.get("the delivery stream", (None, None)))[1]
        sockets = self._sockets(self.connections + self.kind_ids)
        samples = list(fleet.samples)
        # The data summary is the default-protocol connections' (the kinds have their own audit).
        frames_sent = sum(r.frames_sent for cid in self.connections for r in sockets[cid])
        outcomes = [report.measure(e, sockets, samples) for e in self.events]
        summary = report.summarise(audits, frames_sent)
        overlaps = fleet.upstream.overlaps()
        failed = report.failures(
            outcomes, summary, overlaps, strict=self.args.strict, samples=samples, ended_at=ended_at, large=large
        )
        failed += [f"{a.connection_id}: {p}" for a in kinds for p in a.problems]
        dead_letters = fleet.dead_letters()  # the stack's alarm: none in joins, crashes and deploys
        if dead_letters:
            failed.append(f"{dead_letters} START hints in the dead-letter queue")
        failed += [f"{what}: {len(a.findings)} violations of the at-least-once and ordering rules"
                   for what, (_, a) in streams.items() if not a.ok]
        lines = report.render(
            outcomes, summary, overlaps, samples, list(fleet.workers), t_origin=self.t_origin, ended_at=ended_at, large=large
        )
        for what, (name, a) in streams.items():
            lines += ["", f"== {what} ({name}, SINK={','.join(fleet.sinks)}): "
                          f"frames again after a takeover are owed only above its checkpoint, received within "
                          f"{fleet.again_window_s:g}s (CHECKPOINT_SECONDS + the takeover) of the previous owner's last",
                      *a.lines()]
        if kinds:
            lines += kind_streams.lines(kinds, t_origin=self.t_origin, crash=self.crashed)
        lines += ["", f"START hints in the dead-letter queue (received {schema.MAX_HINT_RECEIVES} times, never deleted): {dead_letters}"]
        text = "\n".join(lines + ["", "PASSED" if not failed else "FAILED: " + "; ".join(failed)])
        (fleet.run_dir / "report.txt").write_text(text + "\n")
        (fleet.run_dir / "report.json").write_text(
            report.as_json(
                outcomes, summary, audits, overlaps, samples, t_origin=self.t_origin, settings=vars(self.args), failed=failed, large=large,
                kinds=kinds, stream=stream.as_dict() if stream is not None else None,
            )
        )
        self.say("")
        self.say(text)
        self.say(f"report: {fleet.run_dir / 'report.txt'} and report.json; worker logs: {fleet.run_dir}/w*.log")
        self.say(pictures.write(fleet.run_dir))
        if fleet.traces:
            self._say_traces()
        return 0 if not failed else 1

    def _say_traces(self) -> None:
        """Where the spans are, with a START's trace and a takeover's to look at first."""
        spans = traces.read(self.fleet.run_dir)
        grouped = traces.by_trace(spans)
        self.say(f"traces (TRACING=otel): {len(spans)} spans in {len(grouped)} traces, {self.fleet.run_dir}/traces-*.jsonl")
        for first in ("router", "end_session"):
            found = [t for t, members in grouped.items() if any(s.name == first and not s.parent_id for s in members)]
            if found:
                longest = max(found, key=lambda t: len(grouped[t]))
                self.say(f"  a {first} trace: python -m sim.traces {self.fleet.run_dir} {longest}")
