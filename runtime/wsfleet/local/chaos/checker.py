"""The checker: reads the evidence and the nemesis's history, never the workers' claims,
and says what went wrong. Pure functions, no I/O.

Invariants, each a kind of :class:`Violation`:

* ``lost``: a connection's stored seqs are not exactly 1..checkpoint (a gap, or a
  checkpoint past what is stored), or a frame produced well before the connection's
  last STOP was never stored;
* ``doubled``: a frame stored a second time, under another seq; ``corrupt``: a row
  whose data is not what the upstream sent as that seq;
* ``overlap``: two sockets open on one stream at once, unless every socket but one
  belongs to a process frozen by SIGSTOP (its kernel keeps it open), and
  ``frozen_socket``: such a socket still open well after the process was resumed;
* ``stale_fence``: a message written, in the order DynamoDB applied it, after its
  connection had been acquired with a higher fence or after its writer's session had
  been ended by a watcher (the writer had lost it), or a stored row older in fence than
  a row below it; unless the writer was frozen by a SIGSTOP, every frame the write
  carries was received before the freeze began, and it landed within
  ``IN_FLIGHT_AFTER_RESUME_S`` of the SIGCONT: a request already past its deadline
  checks when the process froze (see ``wsfleet.aws.send_deadline``; the same frames
  as its successor's, which ``corrupt`` and ``doubled`` check);
* ``not_recovered`` / ``slow_recovery``: a connection a fault affected was not whole
  again (see :mod:`.recovery`) by the end, or not within the fault's bound;
* ``stop_not_closed``: a socket open on a STOPPED connection later than the STOP bound;
* ``malformed_closed``: a malformed frame cost the connection its socket;
* ``crash``: a worker exited without being told to, or a SIGTERM ended in an error.

The workers' logs are only a cross-check (``notes``): claims the table does not back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ... import schema
from ..fleet import Timing
from .evidence import Evidence
from .history import Applied, Op
from .recovery import Recovery, recovery
from .schedule import Bounds

VIOLATION_KINDS = (
    "lost", "doubled", "corrupt", "overlap", "frozen_socket", "stale_fence", "not_recovered",
    "slow_recovery", "stop_not_closed", "malformed_closed", "crash",
)
FROZEN_CLOSE_S = 3.0  # after SIGCONT the socket closes at the next renewal tick, its close handshake 3 s at most
MALFORMED_WATCH_S = 2.0
# A frozen writer's request that had passed its last deadline check lands as soon as the
# process runs again: it needs the GIL back, one send, and its turn at the emulator's lock.
IN_FLIGHT_AFTER_RESUME_S = 3.0


@dataclass(frozen=True)
class Violation:
    kind: str
    what: str  # a connection id, a fault (#n), a worker
    detail: str


@dataclass
class Verdict:
    violations: list[Violation]
    recoveries: list[Recovery]
    totals: dict[str, int]
    notes: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)

    @property
    def passed(self) -> bool:
        return not self.violations


def check(evidence: Evidence, applied: Sequence[Applied], ops: Sequence[Op], timing: Timing, *, slack_s: float = 0.0) -> Verdict:
    bounds = Bounds(timing)
    violations: list[Violation] = []
    totals = {"stored": 0, "produced": 0}
    for cid in evidence.connections:
        violations += check_data(cid, evidence, ops, timing, totals)
    violations += check_overlaps(evidence, applied, bounds)
    violations += check_fences(evidence, applied, totals)
    times = [s.t for s in evidence.snapshots]
    recoveries = [recovery(a, evidence, bounds, slack_s, times) for a in applied]
    for r in recoveries:
        violations += recovery_violations(r, evidence)
    violations += check_stops(evidence, ops, bounds)
    for name, status, at in evidence.exits:
        violations.append(Violation("crash", name, f"exited with status {status} at {at:.3f}, unasked"))
    for a in applied:
        if a.exit_status not in (None, 0):
            violations.append(Violation("crash", a.victim, f"#{a.n} SIGTERM: exit status {a.exit_status}"))
    totals["sockets"] = sum(len(s) for s in evidence.sockets.values())
    totals["overlaps"] = len(evidence.overlaps)
    totals["overlaps_excused"] = len(evidence.overlaps) - sum(1 for v in violations if v.kind == "overlap")
    writers: dict[tuple[str, int], set[int]] = {}
    for e in evidence.journal:
        if e.get("op") == "put":
            writers.setdefault((e["pk"], e["sk"]), set()).add(e["fence"])
    totals["rewrites"] = sum(1 for fences in writers.values() if len(fences) > 1)
    return Verdict(violations, recoveries, totals, cross_check(evidence))


# --- data ----------------------------------------------------------------------------------------


def check_data(cid: str, ev: Evidence, ops: Sequence[Op], timing: Timing, totals: dict[str, int]) -> list[Violation]:
    out = []
    rows = sorted(ev.rows.get(cid, []), key=lambda r: r.seq)
    frames = ev.frames.get(cid, {})
    seqs = [r.seq for r in rows]
    top = seqs[-1] if seqs else 0
    checkpoint = ev.checkpoints.get(cid, 0)
    present = set(seqs)
    missing = [s for s in range(1, max(top, checkpoint) + 1) if s not in present]
    if missing:
        out.append(Violation("lost", cid, f"{len(missing)} seqs missing below {max(top, checkpoint)} "
                             f"(checkpoint {checkpoint}), first {missing[:5]}"))
    # Produced well before the last STOP, never stored: the socket closed with them unread
    # only if they were sent at the very end.
    stops = [op.t for op in ops if op.connection_id == cid and op.action == "STOP"]
    if stops:
        cutoff_ms = (max(stops) - timing.stop_bound_s - timing.flush_ms / 1000 - 1.0) * 1000
        unstored = [s for s, data in frames.items() if s > top and _produced_ms(data) < cutoff_ms]
        if unstored:
            out.append(Violation("lost", cid, f"{len(unstored)} frames produced before the last STOP were never "
                                 f"stored (stored 1..{top}, first unstored {min(unstored)})"))
    for row in rows:
        want = frames.get(row.seq)
        if want is None or _same(row.data, want):
            continue
        v = _value(row.data)
        if isinstance(v, int) and v != row.seq and v in frames and _same(row.data, frames[v]):
            out.append(Violation("doubled", cid, f"seq {v}'s frame stored again as seq {row.seq} (fence {row.fence}, {row.worker})"))
        else:
            out.append(Violation("corrupt", cid, f"seq {row.seq} holds {row.data[:80]!r}, the upstream sent {want[:80]!r}"))
    totals["stored"] += len(rows)
    totals["produced"] += len(frames)
    return out


def _produced_ms(data: str) -> float:
    try:
        return float(json.loads(data).get("t", 0))
    except (ValueError, AttributeError):
        return 0.0


def _value(data: str) -> object:
    try:
        return json.loads(data).get("v")
    except (ValueError, AttributeError):
        return None


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


# --- sockets -------------------------------------------------------------------------------------


def check_overlaps(ev: Evidence, applied: Sequence[Applied], bounds: Bounds) -> list[Violation]:
    out = []
    pauses = [a for a in applied if a.kind == "pause"]
    for o in ev.overlaps:
        frozen = next((p for p in pauses if _excuses(p, o.started_at, o.peers, bounds)), None)
        if frozen is None:
            out.append(Violation("overlap", o.stream, f"{len(o.socket_ids)} sockets open at {o.started_at:.3f} "
                                 f"(ids {list(o.socket_ids)}, peers {list(o.peers)})"))
            continue
        closes_by = (frozen.resumed_at or ev.end_t) + bounds.stop_s + FROZEN_CLOSE_S
        ended = o.ended_at if o.ended_at is not None else ev.end_t
        if ended > closes_by:
            out.append(Violation("frozen_socket", o.stream, f"the socket of {frozen.victim} (#{frozen.n}) stayed open "
                                 f"{ended - (frozen.resumed_at or 0):.2f}s after SIGCONT"))
    return out


def _excuses(pause: Applied, at: float, peers: Iterable[str], bounds: Bounds) -> bool:
    """The overlap began while ``pause``'s process was frozen (or just after), and all
    its sockets but one are that process's."""
    resumed = pause.resumed_at if pause.resumed_at is not None else float("inf")
    if not pause.started_at <= at <= resumed + bounds.stop_s + FROZEN_CLOSE_S:
        return False
    return len([p for p in peers if p not in pause.frozen_peers]) <= 1


def check_stops(ev: Evidence, ops: Sequence[Op], bounds: Bounds) -> list[Violation]:
    """A STOPPED connection's socket is closed within the STOP bound and none opens
    until the next START."""
    out = []
    by_cid: dict[str, list[Op]] = {}
    for op in sorted(ops, key=lambda o: o.t):
        by_cid.setdefault(op.connection_id, []).append(op)
    for cid, seq in by_cid.items():
        for i, op in enumerate(seq):
            if op.action != "STOP":
                continue
            restart = next((o.t for o in seq[i + 1:] if o.action == "START"), ev.end_t)
            closed_by = op.t + bounds.stop_s
            if restart <= closed_by:
                continue  # started again before the bound: nothing to hold it to
            for s in ev.sockets.get(cid, []):
                closed = s.closed_at if s.closed_at is not None else ev.end_t + 1
                if s.opened_at < restart and closed > closed_by:
                    late = (min(closed, restart) - op.t)
                    out.append(Violation("stop_not_closed", cid, f"socket {s.id} open {late:.2f}s after the STOP at "
                                         f"{op.t:.3f} (bound {bounds.stop_s:.2f}s)"))
    return out


# --- fences --------------------------------------------------------------------------------------


def check_fences(ev: Evidence, applied: Sequence[Applied], totals: dict[str, int]) -> list[Violation]:
    """In the journal's order: a message written with fence F after a higher fence was
    acquired, or after the session that acquired F was ended by a watcher (its worker had
    stopped writing, by its own deadline, a skew margin before the watcher could end it).
    In the table: a stored row with a lower fence than a row below it. A write in flight
    when its writer froze (:func:`in_flight_at_freeze`) is excused in both, and counted
    in ``totals["late_in_flight"]``."""
    out = []
    totals["late_in_flight"] = 0
    pauses = [a for a in applied if a.kind == "pause"]
    highest: dict[str, int] = {}
    holder: dict[tuple[str, int], str] = {}  # (pk, fence) -> the session that acquired it
    ended: dict[str, str] = {}  # session -> who ended it, when a watcher did
    last_put: dict[tuple[str, int], bool] = {}  # (pk, seq) -> whether its last write was excused
    for e in ev.journal:
        if e.get("op") == "ended" and e.get("by") != e.get("worker"):
            ended.setdefault(e["session"], e.get("by") or "?")
            continue
        pk, fence = e.get("pk"), e.get("fence")
        if pk is None or fence is None:
            continue
        if e["op"] == "update" and e.get("session"):
            holder[(pk, fence)] = e["session"]
        if e["op"] == "put":
            stale = None
            if fence < highest.get(pk, 0):
                stale = f"after fence {highest[pk]} was acquired (journal #{e.get('n')}, t {e.get('t_ms')})"
            elif holder.get((pk, fence)) in ended:
                session = holder[(pk, fence)]
                stale = f"after its session {session} was ended by {ended[session]} (journal #{e.get('n')})"
            excused = stale is not None and in_flight_at_freeze(e, pauses) is not None
            last_put[(pk, e.get("sk"))] = excused
            totals["late_in_flight"] += excused
            if stale is not None and not excused:
                out.append(Violation("stale_fence", pk, f"seq {e.get('sk')} written by {e.get('worker')} with fence {fence} {stale}"))
        highest[pk] = max(highest.get(pk, 0), fence)
    for cid, rows in ev.rows.items():
        top = 0
        for row in sorted(rows, key=lambda r: r.seq):
            if last_put.get((schema.connection_pk(cid), row.seq)):
                continue  # landed late, as a frozen writer woke: excused above
            if row.fence < top:
                out.append(Violation("stale_fence", cid, f"stored seq {row.seq} has fence {row.fence} ({row.worker}), "
                                     f"below fence {top} of a lower seq"))
            top = max(top, row.fence)
    return out


def in_flight_at_freeze(put: dict, pauses: Iterable[Applied]) -> Applied | None:
    """The SIGSTOP that explains a late message write, if any: it froze the writer, the
    frame was received before the freeze began, and the write landed just after the
    SIGCONT. Between its last deadline check and its send a request can still be frozen
    (the few bytecodes before the system call); once running it is sent at once."""
    t_s = put.get("t_ms", 0) / 1000
    received_s = put.get("received_ms", float("inf")) / 1000
    for p in pauses:
        if p.victim == put.get("worker") and p.resumed_at is not None and received_s <= p.started_at \
                and p.resumed_at <= t_s <= p.resumed_at + IN_FLIGHT_AFTER_RESUME_S:
            return p
    return None


# --- recovery ------------------------------------------------------------------------------------


def recovery_violations(r: Recovery, ev: Evidence) -> list[Violation]:
    a = r.applied
    out = []
    for cid, took in sorted(r.took_s.items()):
        if took is None:
            out.append(Violation("not_recovered", cid, f"#{a.n} {a.kind}: never whole again after {a.affected[cid]:.3f}"))
        elif took > r.bound_s:
            out.append(Violation("slow_recovery", cid, f"#{a.n} {a.kind}: {took:.2f}s, bound {r.bound_s:.2f}s"))
    if a.kind == "malformed":
        for cid, ref in a.affected.items():
            for s in ev.sockets.get(cid, []):
                if s.opened_at <= ref and s.closed_at is not None and ref <= s.closed_at <= ref + MALFORMED_WATCH_S and not s.dropped:
                    out.append(Violation("malformed_closed", cid, f"#{a.n}: socket {s.id} closed {s.closed_at - ref:.2f}s after a malformed frame"))
    return out


# --- the workers' claims, as a cross-check only ----------------------------------------------------


def cross_check(ev: Evidence) -> list[str]:
    acquired = {(e["pk"], e["fence"]) for e in ev.journal if e.get("op") == "update"}
    notes = []
    if acquired:
        claims = [(name, e) for name, events in ev.logs.items() for e in events if e.get("event") == "lease_acquired"]
        unbacked = [f"{n}: {e.get('connection_id')} fence {e.get('fence_token')}" for n, e in claims
                    if ("CONN#" + str(e.get("connection_id")), e.get("fence_token")) not in acquired]
        if unbacked:
            notes.append(f"{len(unbacked)} acquisitions a worker logged are not in the journal: {unbacked[:5]}")
        notes.append(f"workers logged {len(claims)} acquisitions; the journal holds {len(acquired)} (connection, fence) pairs")
    # A worker logs each class of bad frame once a minute per connection, with the count it held back.
    malformed_logged = sum(1 + int(e.get("suppressed", 0)) for events in ev.logs.values() for e in events
                           if e.get("event") == "malformed_frame")
    malformed_sent = sum(s.injected_sent for socks in ev.sockets.values() for s in socks)
    notes.append(f"malformed frames: the upstream sent {malformed_sent}, the workers logged {malformed_logged} "
                 "(a killed worker's last lines, and the ones held back since its last line, may be missing)")
    return notes
