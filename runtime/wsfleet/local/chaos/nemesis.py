"""The nemesis: plays one scheduled fault against a running fleet and writes down what
it did, when, and to whom (the history the checker reads beside the evidence).

Where each fault is injected:

* DynamoDB throttling, added latency and outages, and SQS outages: the emulator's fault
  switch (:func:`wsfleet.local.emulator.set_faults`). Workers and the API's router are
  faulted; the fleet runner's own reads are not.
* Socket drops, stalls, slow sends, oversized and malformed frames: the upstream's run-time
  controls, per stream.
* kill -9, SIGSTOP/SIGCONT, SIGTERM with a replacement: signals to the worker processes.
  A slot always runs one worker: a killed one is replaced after the fault's duration, a
  terminated one once its replacement is up.
* A wall clock off by up to MAX_CLOCK_SKEW_MS: the slot's worker is replaced (as at a
  deploy) by one running under libfaketime (``FAKETIME=+0.8``): the whole process's
  wall clock, SigV4 signing included, is off. Without libfaketime the replacement runs
  on the true clock and the fault says so.
* STOP/START storms: the API, as a client would (retrying 5xx and 429 until answered).

The ownership reads it makes to name a fault's victims (which connections a worker held
when it was hit) come from the connections table, never from the worker.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any, Callable, Sequence

from ... import schema
from ..emulator import set_faults
from ..fleet import Fleet, eventually
from .history import Applied, Op
from .schedule import Fault

FAKETIME_LIB = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
API_PATIENCE_S = 30.0  # how long a client keeps retrying one START or STOP


def clock_off_by(offset_ms: int) -> dict[str, str]:
    """Environment that runs a worker with its wall clock ``offset_ms`` off (libfaketime).

    The monotonic clock is shifted by the same constant, which changes no interval the
    worker measures. Leaving it alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``) would be the
    obvious choice, but with it libfaketime 0.9.10 fails every ``time.sleep`` (Python
    sleeps with an absolute CLOCK_MONOTONIC ``clock_nanosleep``) with EINVAL: a worker
    whose botocore retries cannot sleep, which no real clock error causes."""
    if FAKETIME_LIB is None:
        return {}
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"{offset_ms / 1000:+.3f}"}


def tcp_peers(pid: int, port: int) -> list[str]:
    """The ``127.0.0.1:<local port>`` of every TCP connection process ``pid`` holds to
    ``port`` on loopback: how the upstream names that process's sockets (from /proc)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        with open(f"/proc/{pid}/net/tcp") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return []
    peers = []
    for row in rows:
        parts = row.split()
        local, remote, inode = parts[1], parts[2], parts[9]
        if inode in inodes and int(remote.split(":")[1], 16) == port:
            peers.append(f"127.0.0.1:{int(local.split(':')[1], 16)}")
    return sorted(peers)


class Nemesis:
    def __init__(self, fleet: Fleet, connection_ids: Sequence[str], *, workers: int, seed: int, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.ids = list(connection_ids)
        self.seed = seed
        self.say = say
        self.slots = [f"w{i + 1}" for i in range(workers)]  # the worker each slot runs now
        self._generation = [0] * workers
        self.desired = {cid: "" for cid in self.ids}
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
            self.fleet.upstream.create_stream(cid)
            self.api("START", cid)

    def api(self, action: str, cid: str) -> Op:
        """START or STOP through the API, retried on 5xx and 429 as a client would."""
        op = Op(time.time(), action, cid)
        body: dict[str, Any] = {"event_type": action, "connection_id": cid}
        if action == "START":
            body["ws_url"] = self.fleet.ws_url(cid)
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
        self.desired[cid] = "STARTED" if action == "START" else "STOPPED"
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
            self.fleet.upstream.stall(cid, False)
            self.fleet.upstream.slow(cid, 0.0)
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
            self.fleet.upstream.drop(cid, abrupt=fault.params["abrupt"])

    def _oversize(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        for cid in self._streams(fault):
            applied.affected[cid] = time.time()
            self.fleet.upstream.oversize(cid, fault.params["size"])

    def _malformed(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        for cid in self._streams(fault):
            applied.affected[cid] = time.time()
            self.fleet.upstream.inject(cid, fault.params["text"])

    def _stall(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        self._upstream_window(fault, applied, until, lambda cid, on: self.fleet.upstream.stall(cid, on))

    def _slow(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        delay = fault.params["delay_s"]
        self._upstream_window(fault, applied, until, lambda cid, on: self.fleet.upstream.slow(cid, delay if on else 0.0))

    def _upstream_window(self, fault: Fault, applied: Applied, until: Callable[[float], None], switch: Callable[[str, bool], Any]) -> None:
        chosen = self._streams(fault)
        for cid in chosen:
            switch(cid, True)
        until(fault.duration_s)
        for cid in chosen:
            switch(cid, False)
        applied.healed_at = time.time()
        applied.affected = dict.fromkeys((c for c in chosen if self.desired[c] == "STARTED"), applied.healed_at)

    # --- worker processes ------------------------------------------------------------------------

    def _victim(self, fault: Fault, applied: Applied) -> str:
        name = self.slots[fault.params["slot"]]
        applied.victim = name
        live = [s for s in self.fleet.sessions_of(name).values() if s.state == schema.LIVE]
        if live:
            applied.victim_session_age_s = round(time.time() - max(s.started_at_ms for s in live) / 1000, 3)
        return name

    def _replace(self, slot: int, **env: str) -> str:
        self._generation[slot] += 1
        name = f"w{slot + 1}.{self._generation[slot]}"
        self.slots[slot] = name
        self.fleet.start_worker(name, **env)
        return name

    def _kill(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        victim = self._victim(fault, applied)
        held = self.fleet.owned_by(victim)
        at = self.fleet.kill(victim)
        applied.affected = dict.fromkeys(held, at)
        until(fault.duration_s)
        applied.replacement = self._replace(fault.params["slot"])
        applied.healed_at = time.time()

    def _pause(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        victim = self._victim(fault, applied)
        held = self.fleet.owned_by(victim)
        at = self.fleet.pause(victim)
        applied.affected = dict.fromkeys(held, at)
        # Frozen, its sockets stay open (the kernel answers for it): name them.
        applied.frozen_peers = tcp_peers(self.fleet.workers[victim].pid, self._upstream_port())
        until(fault.duration_s)
        applied.resumed_at = applied.healed_at = self.fleet.resume(victim)

    def _term(self, fault: Fault, applied: Applied, until: Callable[[float], None], **env: str) -> None:
        victim = self._victim(fault, applied)
        slot = fault.params["slot"]
        applied.replacement = self._replace(slot, **env)  # a rolling deploy: the new one is up first
        held = self.fleet.owned_by(victim)
        at, applied.exit_status = self.fleet.terminate(victim, timeout=self.fleet.timing.shutdown_s + 10)
        applied.affected = dict.fromkeys(held, at)
        applied.healed_at = time.time()

    def _clock(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        offset = fault.params["offset_ms"]
        if FAKETIME_LIB is None:
            applied.note = "no libfaketime (Debian: faketime): the replacement runs on the true clock"
        self._term(fault, applied, until, **clock_off_by(offset))

    def _upstream_port(self) -> int:
        return int(self.fleet.upstream.url.rsplit(":", 1)[1])

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

    def wait_whole(self, timeout: float) -> bool:
        """Until every STARTED connection has one open socket and a live owner, and
        every STOPPED one none (False if the timeout passed first)."""
        want = set(self.started())

        def whole() -> bool:
            t, states, _ = self.fleet.read_ownership()
            now = int(t * 1000)
            for cid in self.ids:
                sockets = len(self.fleet.upstream.open_sockets(cid))
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
