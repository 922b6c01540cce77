"""The nemesis' faults on the worker processes: kill -9, SIGSTOP/SIGCONT, SIGTERM with a
replacement (on a clock set off, for a clock fault), SIGTERM of the watcher draining a
killed worker's session, SIGTERM in a burst of STARTs, and closes the upstream stalls
around a STOP, a SIGTERM or a lost session (see :mod:`.nemesis` for every fault).

A part of :class:`~.nemesis.Nemesis` (its base class), kept apart from the faults of the
emulator, the upstream and the API: a slot always runs one worker, so each fault here
names its victim, signals it and replaces it.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Callable

from wsfleet import schema
from ..fleet import Fleet
from .history import Applied, Op
from .schedule import Bounds, Fault
from .workers import FAKETIME_LIB, clock_off_by, log_lines_from, log_size, tcp_peers

DRAINER_POLL_S = 0.05  # how often the workers' new log lines are read for session_ended_dead


class WorkerFaults:
    """The worker-process faults; :class:`~.nemesis.Nemesis` provides what they use."""

    # Set up by Nemesis.__init__.
    fleet: Fleet
    bounds: Bounds
    seed: int
    slots: list[str]
    _generation: list[int]
    desired: dict[str, str]
    url: dict[str, str]
    # And Nemesis' api() (a START or STOP as a client sends it) and _streams() (a fault's
    # connections).
    api: Callable[..., Op]
    _streams: Callable[[Fault], list[str]]

    def _held_by(self, victim: str) -> list[str]:
        """The soak's connections ``victim`` holds (the table says): a hostile peer it
        holds too is judged apart (:mod:`.hostile_check`), not timed as a fault's victim."""
        return [cid for cid in self.fleet.owned_by(victim) if cid in self.desired]

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
        held = self._held_by(victim)
        at = self.fleet.kill(victim)
        applied.affected = dict.fromkeys(held, at)
        until(fault.duration_s)
        applied.replacement = self._replace(fault.params["slot"])
        applied.healed_at = time.time()

    def _pause(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        victim = self._victim(fault, applied)
        held = self._held_by(victim)
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
        held = self._held_by(victim)
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

    def _drain_term(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """kill -9 the victim; SIGTERM the watcher that ends its session as soon as it
        says so (``session_ended_dead``), while it drains; replace both."""
        victim = self._victim(fault, applied)
        held = self._held_by(victim)
        watchers = {name: log_size(self.fleet.workers[name].log_path) for name in self.fleet.live_workers() if name != victim}
        at = self.fleet.kill(victim)
        applied.affected = dict.fromkeys(held, at)
        drainer = self._drainer(victim, watchers, timeout=self.bounds.takeover_s + 5)
        if drainer is None:
            applied.note = "no watcher said it ended the victim's session in time: nobody to SIGTERM"
        else:
            applied.drainer = drainer
            its_own = self._held_by(drainer)
            term_at, applied.exit_status = self.fleet.terminate(drainer, timeout=self.fleet.timing.shutdown_s + 10)
            for cid in its_own:
                applied.affected.setdefault(cid, term_at)
            self._replace(self.slots.index(drainer))
        until(fault.duration_s)
        applied.replacement = self._replace(fault.params["slot"])
        applied.healed_at = time.time()

    def _drainer(self, victim: str, offsets: dict[str, int], *, timeout: float) -> str | None:
        """The first of the workers whose logs grow past ``offsets`` to log that it ended
        ``victim``'s session (only the new lines are read: a long run's logs are large)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, offset in offsets.items():
                lines, offsets[name] = log_lines_from(self.fleet.workers[name].log_path, offset)
                if any(e.get("event") == "session_ended_dead" and e.get("worker") == victim for e in lines):
                    return name
            time.sleep(DRAINER_POLL_S)
        return None

    def _burst_term(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """With the victim's replacement up: STOP the streams, then START them again from
        several threads at once, and SIGTERM the victim once ``term_after`` of those STARTs
        were answered (the rest are still being sent)."""
        p = fault.params
        victim = self._victim(fault, applied)
        applied.replacement = self._replace(p["slot"])
        chosen = [c for c in self._streams(fault) if self.desired[c] == "STARTED"]
        stopped = time.monotonic()
        for cid in chosen:
            self.api("STOP", cid)
        time.sleep(max(0.0, stopped + fault.duration_s - time.monotonic()))  # closed and released: they start afresh
        with ThreadPoolExecutor(p["threads"], thread_name_prefix="burst") as pool:
            starts = [pool.submit(self.api, "START", cid) for cid in chosen]
            pending, answered = set(starts), 0
            while pending and answered < p["term_after"]:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                answered += len(done)
            held = self._held_by(victim)
            at, applied.exit_status = self.fleet.terminate(victim, timeout=self.fleet.timing.shutdown_s + 10)
        for start in starts:
            op = start.result()
            applied.affected[op.connection_id] = op.t
        for cid in held:
            applied.affected.setdefault(cid, at)
        applied.healed_at = time.time()

    def _close_stall(self, fault: Fault, applied: Applied, until: Callable[[float], None]) -> None:
        """Streams that stall (answer nothing, close frames included) when something
        closes their sockets: a STOP (then a START), a handoff at SIGTERM, or a lost
        session (SIGSTOP past the lease, then SIGCONT)."""
        p = fault.params
        applied.trigger = p["trigger"]
        up = self.fleet.upstream
        if p["trigger"] == "stop":
            chosen = [c for c in self._streams(fault) if self.desired[c] == "STARTED"]
            for cid in chosen:
                up.stall(self.url[cid], True)
            for cid in chosen:
                self.api("STOP", cid)
            until(fault.duration_s)
            for cid in chosen:
                applied.affected[cid] = self.api("START", cid).t
            for cid in chosen:
                up.stall(self.url[cid], False)
            applied.healed_at = time.time()
            return
        victim = self._victim(fault, applied)
        if p["trigger"] == "term":
            applied.replacement = self._replace(p["slot"])
        held = self._held_by(victim)
        stalled = [self.url[cid] for cid in random.Random(self.seed * 1000 + fault.n).sample(sorted(held), min(p["few"], len(held)))]
        for stream in stalled:
            up.stall(stream, True)
        if p["trigger"] == "term":
            at, applied.exit_status = self.fleet.terminate(victim, timeout=self.fleet.timing.shutdown_s + 10)
            applied.affected = dict.fromkeys(held, at)
        else:
            at = self.fleet.pause(victim)
            applied.affected = dict.fromkeys(held, at)
            applied.frozen_peers = tcp_peers(self.fleet.workers[victim].pid, self._upstream_port())
            until(fault.duration_s)
            applied.resumed_at = self.fleet.resume(victim)
            # Still stalled while it wakes and learns its session is lost: its sockets must
            # go at once (aborted), not after a close handshake the stream never answers.
            time.sleep(self.bounds.stop_s + 1.0)
        for stream in stalled:
            up.stall(stream, False)
        applied.healed_at = time.time()
