"""The nemesis: plays one scheduled fault against a running fleet and writes down what
it did, when, and to whom (the history the checker reads beside the evidence).

Where each fault is injected:

* Kinesis (where the sink has it): outages, PutRecords refused whole for throughput,
  partly refused (a share of each one's records: a partial failure), or applied and
  answered 500; the emulator's fault switch too.
* DynamoDB throttling, added latency and outages, SQS outages, and ambiguous writes (a
  share of every DynamoDB and SQS request applied, then answered 500): the emulator's
  fault switch (:func:`sim.emulator.set_faults`). Workers and the API's router
  are faulted (the STARTs and STOPs sent inside an ambiguous window go through it); the
  fleet runner's own reads are not.
* Socket drops, stalls, slow sends, oversized, malformed and byzantine frames
  (:mod:`.byzantine`), seq jumps, replays from another seq than asked, and closes the
  upstream stalls (its stream answers nothing, close frames included, when a STOP, a
  handoff or a lost session closes the socket): the upstream's run-time controls, per
  stream.
* kill -9, SIGSTOP/SIGCONT, SIGTERM with a replacement, SIGTERM of the watcher that
  drains a killed worker's session (as soon as it logs ``session_ended_dead``), SIGTERM
  in the middle of a burst of STARTs: signals to the worker processes
  (:mod:`.worker_faults`). A slot always runs one worker: a killed one is replaced after
  the fault's duration, a terminated one once its replacement is up (a drainer: at once).
* A wall clock off by up to MAX_CLOCK_SKEW_MS: the slot's worker is replaced (as at a
  deploy) by one running under libfaketime (``FAKETIME=+0.8``): the whole process's
  wall clock, SigV4 signing included, is off. Without libfaketime the replacement runs
  on the true clock and the fault says so.
* STOP/START storms, and a STOP followed within 100 ms by a START with a new url (the
  connection's other stream: each connection has two, its own and a twin, and its ws_url
  names one of them at a time): the API, as a client would (retrying 5xx and 429 until
  answered).

The ownership reads it makes to name a fault's victims (which connections a worker held
when it was hit) come from the connections table, never from the worker.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence

from ..emulator import set_faults
from ..fleet import Fleet
from ..processes import eventually
from .byzantine import CLASSES, backwards
from .history import Applied, Op
from .schedule import Bounds, Fault
from .worker_faults import WorkerFaults

API_PATIENCE_S = 30.0  # how long a client keeps retrying one START or STOP
TWIN = "~b"  # a connection's second stream is its own name with this after it


class Nemesis(WorkerFaults):
    def __init__(self, fleet: Fleet, connection_ids: Sequence[str], *, workers: int, seed: int, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.bounds = Bounds(fleet.timing)
        self.ids = list(connection_ids)
        self.seed = seed
        self.say = say
        self.slots = [f"w{i + 1}" for i in range(workers)]  # the worker each slot runs now
        self._generation = [0] * workers
        self.desired = {cid: "" for cid in self.ids}
        self.url = {cid: cid for cid in self.ids}  # the stream each connection's ws_url names
        self.ops: list[Op] = []
        self.applied: list[Applied] = []
        self.exits: list[tuple[str, int, float]] = []  # (worker, status, when noticed): not our doing
        self._endpoint = fleet.emulator.endpoint_url

    # --- the fleet ---------------------------------------------------------------------------

    def start_workers(self) -> None:
        for name in self.slots:
            self.fleet.start_worker(name, wait=False)
        for name in self.slots:
            self.fleet.wait_started(name)

    def start_connections(self, ids: Sequence[str]) -> None:
        for cid in ids:
            for stream in self.streams_of(cid):  # both produce from now on: a flip finds its frames there
                self.fleet.upstream.create_stream(stream)
            self.api("START", cid)

    @staticmethod
    def streams_of(cid: str) -> list[str]:
        return [cid, cid + TWIN]

    def _other_stream(self, cid: str) -> str:
        return next(s for s in self.streams_of(cid) if s != self.url[cid])

    def stream_map(self) -> dict[str, list[str]]:
        """Per connection, the streams it may have a socket on, the one its ws_url names first."""
        return {cid: [self.url[cid], *(s for s in self.streams_of(cid) if s != self.url[cid])] for cid in self.ids}

    def api(self, action: str, cid: str, *, stream: str | None = None) -> Op:
        """START or STOP through the API, retried on 5xx and 429 as a client would. A
        START names the connection's current stream, or ``stream`` (a new url)."""
        op = Op(time.time(), action, cid)
        body: dict[str, Any] = {"event_type": action, "connection_id": cid}
        if action == "START":
            body["ws_url"] = op.ws_url = self.fleet.ws_url(stream or self.url[cid])
        deadline = time.monotonic() + API_PATIENCE_S
        while True:
            try:
                op.status, answer = self.fleet.request("POST", "/events", body)
            except (OSError, ValueError) as exc:  # the local API itself is not faulted; be safe anyway
                op.status, answer = 599, {"message": str(exc)}
            if op.status < 500 and op.status != 429 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if op.status >= 400:
            raise RuntimeError(f"{action} {cid} answered {op.status}: {json.dumps(answer)}")
        op.answered_at = time.time()
        self.desired[cid] = "STARTED" if action == "START" else "STOPPED"
        if action == "START":
            self.url[cid] = stream or self.url[cid]
        self.ops.append(op)
        return op

    def started(self) -> list[str]:
        return [cid for cid, state in self.desired.items() if state == "STARTED"]

    def check_exits(self) -> None:
        """Note (and replace) any worker that exited without being told to."""
        for slot, name in enumerate(self.slots):
            proc = self.fleet.workers.get(name)
            if proc is not None and proc.state == "running" and not proc.alive():
                status = proc.popen.wait()
                proc.state = "exited"
                self.exits.append((name, status, time.time()))
                self.say(f"           UNEXPECTED: {name} exited with status {status}; replacing it")
                self._replace(slot)

    def heal_all(self) -> None:
        """Switch every fault off: the end of the chaos phase (and of an interrupted one)."""
        try:
            set_faults(self._endpoint)
        except OSError:
            pass
        for cid in self.ids:
            for stream in self.streams_of(cid):
                self.fleet.upstream.stall(stream, False)
                self.fleet.upstream.slow(stream, 0.0)
        for name, proc in self.fleet.workers.items():
            if proc.state == "paused":
                self.fleet.resume(name)

    # --- playing a fault -----------------------------------------------------------------------

    def play(self, fault: Fault) -> Applied:
        """Inject ``fault`` now and return once it is over (healed, resumed, replaced)."""
        began = time.monotonic()

        def until(offset_s: float) -> None:
            time.sleep(max(0.0, began + offset_s - time.monotonic()))

        applied = Applied(fault.n, fault.kind, time.time())
        self.applied.append(applied)
        getattr(self, f"_{fault.kind}")(fault, applied, until)
        return applied

    def _ambiguous(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """A share of every DynamoDB and SQS request applied, then answered 500 (more of
        the ownership writes); STOPs sent inside, so that the router's writes are among
        them, then STARTs with a new url: a STOP whose notice got lost would leave the
        old owner on the old url."""
        p = fault.params
        chosen = [c for c in self._streams(fault) if self.desired[c] == "STARTED"]
        shares = {"*": p["share"], "UpdateItem": p["writes"], "TransactWriteItems": p["writes"]}
        set_faults(self._endpoint, ambiguous=shares, seed=self.seed * 1000 + fault.n)
        until(p["stop_at_s"])
        for cid in chosen:
            self.api("STOP", cid)
        until(p["start_at_s"])
        for cid in chosen:
            self.api("START", cid, stream=self._other_stream(cid))
        until(fault.duration_s)
        set_faults(self._endpoint)
        applied.healed_at = time.time()
        applied.affected = dict.fromkeys(self.started(), applied.healed_at)

    def _window(self, fault: Fault, applied: Applied, until: Callable[[float], None], **setting: Any) -> None:
        set_faults(self._endpoint, seed=self.seed * 1000 + fault.n, **setting)
        until(fault.duration_s)
        set_faults(self._endpoint)
        applied.healed_at = time.time()
        applied.affected = dict.fromkeys(self.started(), applied.healed_at)

    def _ddb_throttle(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, throttle=fault.params["shares"])

    def _ddb_latency(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, latency_ms=fault.params["latency_ms"], jitter_ms=fault.params["jitter_ms"])

    def _ddb_outage(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, outage={"dynamodb": fault.duration_s}, outage_mode=fault.params["mode"])

    def _kinesis_outage(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, outage={"kinesis": fault.duration_s})

    def _kinesis_throttle(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, throttle={"PutRecords": fault.params["share"]})

    def _kinesis_refuse(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, refuse_records=fault.params["share"])

    def _kinesis_ambiguous(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._window(fault, applied, until, ambiguous={"PutRecords": fault.params["share"]})

    def _sqs_outage(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        p = fault.params
        chosen = [self.ids[i] for i in p["streams"]]
        set_faults(self._endpoint, outage={"sqs": fault.duration_s})
        until(p["stop_at_s"])
        for cid in chosen:
            self.api("STOP", cid)
        until(p["start_at_s"])
        for cid in chosen:
            applied.affected[cid] = self.api("START", cid).t  # its hint cannot be sent
        until(fault.duration_s)
        set_faults(self._endpoint)
        applied.healed_at = time.time()

    def _streams(self, fault: Fault) -> list[str]:
        return [self.ids[i] for i in fault.params["streams"]]

    def _drop(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        for cid in self._streams(fault):
            applied.affected[cid] = time.time()
            self.fleet.upstream.drop(self.url[cid], abrupt=fault.params["abrupt"])

    def _oversize(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        for cid in self._streams(fault):
            applied.affected[cid] = time.time()
            self.fleet.upstream.oversize(self.url[cid], fault.params["size"])

    def _malformed(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        for cid in self._streams(fault):
            applied.affected[cid] = time.time()
            self.fleet.upstream.inject(self.url[cid], fault.params["text"])

    def _byzantine(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """Every class of bad frame, in the schedule's order: a numbered one takes the
        stream's next seq (the books keep which, for the checker), the others none."""
        for cid in self._streams(fault):
            stream = self.url[cid]
            applied.affected[cid] = time.time()
            for name in fault.params["classes"]:
                make = CLASSES[name].make
                if CLASSES[name].numbered:
                    seq = self.fleet.upstream.publish_raw(stream, lambda seq, make=make, stream=stream: make(seq, stream))
                    applied.sent.setdefault(stream, {})[seq] = name
                else:
                    self.fleet.upstream.inject(stream, make(0, stream))

    def _seq_jump(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """Forwards: the stream skips seqs (never produced). Backwards: a frame with an
        old seq (the head itself for -1) and other data than it had, to be dropped."""
        jump = fault.params["jump"]
        for cid in self._streams(fault):
            stream = self.url[cid]
            applied.affected[cid] = time.time()
            if jump > 0:
                self.fleet.upstream.skip(stream, jump)
            else:
                head = self.fleet.upstream.produced(stream)
                self.fleet.upstream.inject(stream, backwards(max(1, head + 1 + jump), stream))

    def _replay_offset(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """The next socket of each stream starts ``offset`` seqs off the from_seq it asks
        for; dropping the socket open now makes the owner ask at once."""
        for cid in self._streams(fault):
            if self.desired[cid] != "STARTED":
                continue  # nobody would ask soon: the offset would wait for another fault
            self.fleet.upstream.replay_from(self.url[cid], fault.params["offset"])
            applied.affected[cid] = time.time()
            self.fleet.upstream.drop(self.url[cid], abrupt=fault.params["abrupt"])

    def _stall(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._upstream_window(fault, applied, until, lambda cid, on: self.fleet.upstream.stall(self.url[cid], on))

    def _slow(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        delay = fault.params["delay_s"]
        self._upstream_window(
            fault, applied, until, lambda cid, on: self.fleet.upstream.slow(self.url[cid], delay if on else 0.0)
        )

    def _upstream_window(self, fault: Fault, applied: Applied, until: Callable[[float], None], switch: Callable[[str, bool], Any]) -> None:
        chosen = self._streams(fault)
        for cid in chosen:
            switch(cid, True)
        until(fault.duration_s)
        for cid in chosen:
            switch(cid, False)
        applied.healed_at = time.time()
        applied.affected = dict.fromkeys((c for c in chosen if self.desired[c] == "STARTED"), applied.healed_at)

    # --- the API -----------------------------------------------------------------------------------

    def _storm(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        p = fault.params
        chosen = [c for c in self._streams(fault) if self.desired[c] == "STARTED"]
        offset = 0.0
        gaps = list(p["gaps_s"])
        for _ in range(p["flaps"]):
            for action in ("STOP", "START"):
                for cid in chosen:
                    self.api(action, cid)
                offset += gaps.pop(0)
                until(offset)
        for cid in chosen:
            self.api("STOP", cid)
        until(offset + p["hold_s"])
        for cid in chosen:
            applied.affected[cid] = self.api("START", cid).t
        applied.healed_at = time.time()

    def _flip(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """Per connection: STOP, then within ``gap_s`` a START naming its other stream."""
        for cid in [c for c in self._streams(fault) if self.desired[c] == "STARTED"]:
            self.api("STOP", cid)
            time.sleep(fault.params["gap_s"])
            applied.affected[cid] = self.api("START", cid, stream=self._other_stream(cid)).t
        applied.healed_at = time.time()

    def wait_whole(self, timeout: float) -> bool:
        """Until every STARTED connection has one open socket and a live owner, and
        every STOPPED one none (False if the timeout passed first)."""
        want = set(self.started())

        def whole() -> bool:
            t, states, _ = self.fleet.read_ownership()
            now = int(t * 1000)
            for cid in self.ids:
                sockets = sum(len(self.fleet.upstream.open_sockets(s)) for s in self.streams_of(cid))
                if cid in want and (sockets != 1 or not states[cid].owned_at(now)):
                    return False
                if cid not in want and sockets:
                    return False
            return True

        try:
            eventually(whole, timeout, "the fleet to be whole", interval=0.5)
            return True
        except TimeoutError:
            return False

