"""The checker: reads the evidence and the nemesis's history, never the workers' claims,
and says what went wrong. Pure functions, no I/O.

Invariants, each a kind of :class:`Violation`:

The stored data (``lost``, ``doubled``, ``corrupt``) is judged in :mod:`.data`.

* ``lost``: a connection's stored seqs are not exactly 1..checkpoint (a gap, or a
  checkpoint past what is stored), or a frame produced well before the connection's
  last STOP was never stored. A seq the upstream itself skipped is owed by nobody: one
  that a socket asking for it (``from_seq`` at or below it) went past without sending,
  because the stream never produced it (a forward seq jump) or started after it (a
  replay from another seq than asked) -- the upstream's books say so;
* ``doubled``: a frame stored a second time, under another seq; ``corrupt``: a row
  whose data is not what the upstream sent as that seq (a byzantine frame stored with
  its non-ASCII characters escaped is the same JSON value: not corrupt), a row at a seq
  the upstream never produced, a skip marker where the upstream sent a storable frame,
  or data where it sent a frame the frame rules make a marker (:mod:`.byzantine`);
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
* ``malformed_closed``: a bad frame (malformed, byzantine, a seq jump) cost the
  connection its socket;
* ``crash``: a worker exited without being told to, or a SIGTERM ended in an error;
* ``unreachable``: a STARTED connection no worker would ever take, between two
  consecutive observer samples (:func:`sim.observed.reachability_violations`); one the
  crash-loop breaker set aside is not, it is:
* ``quarantined``: a connection the crash-loop breaker quarantined. No worker dies of a
  connection here (``crash`` counts any that does), so each of its strikes was a death
  the nemesis caused: a quarantine is a false one;
* ``stale_url``: a socket to a url the connection's ws_url no longer named: opened after
  a START with a new url (the old owner may still reconnect before it could know of the
  STOP, within the STOP bound: counted, not a violation), or still open past the STOP
  bound of the STOP before that START;
* ``bounce``: a connection's fence climbed with nothing to explain the move (:mod:`.moves`);
* with hostile peers (``--hostile``), ``hostile_data``, ``hostile_error`` and
  ``neighbour_gap`` (:mod:`.hostile_check`);
* with a Kinesis sink, the messages stream's at-least-once and ordering rules
  (:mod:`.delivery`): ``lost``, ``order``, ``duplicate``, ``stale_fence``, ``corrupt``.

The workers' logs are only a cross-check (``notes``): claims the table does not back.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from wsfleet import schema
from wsfleet.worker.upstream_socket import CLOSE_TIMEOUT_S
from ..observed import reachability_violations
from ..timing import Timing
from ..upstream import stream_name
from ..stream_audit import Delivery
from .data import byzantine_expectations, check_data
from .delivery import check_stream, resent_note
from .evidence import Evidence
from .history import Applied, Op
from .hostile_check import VIOLATION_KINDS as HOSTILE_KINDS
from .moves import REASONS, Move, moves
from .recovery import Recovery, recovery
from .schedule import FRAMES, Bounds

VIOLATION_KINDS = (
    "lost", "doubled", "corrupt", "overlap", "frozen_socket", "stale_fence", "not_recovered",
    "slow_recovery", "stop_not_closed", "malformed_closed", "crash", "unreachable", "quarantined", "stale_url",
    "bounce", "order", "duplicate", *HOSTILE_KINDS,
)
# After SIGCONT a worker that lost its session aborts its sockets at the next renewal
# tick, with no close handshake (issue 17, item 5: it used to wait up to 3 s for each):
# the STOP bound covers that tick, this the upstream's noticing.
FROZEN_CLOSE_S = 0.5
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
    expected = byzantine_expectations(applied)
    for cid in evidence.connections:
        found = check_data(cid, evidence, ops, timing, totals, expected)
        violations += [Violation(kind, cid, detail) for kind, detail in found]
    if evidence.stream is not None:
        pauses = freezes(applied)

        def excuse(d: Delivery) -> bool:
            assert d.record is not None
            put = {"t_ms": (d.arrived_at or 0) * 1000, "received_ms": d.record.received_at_ms, "worker": d.record.worker_id}
            return in_flight_at_freeze(put, pauses) is not None

        violations += [Violation(kind, cid, detail)
                       for kind, cid, detail in check_stream(evidence, ops, timing, totals, expected, excuse)]
    violations += check_overlaps(evidence, applied, bounds)
    violations += check_fences(evidence, applied, totals)
    times = [s.t for s in evidence.snapshots]
    recoveries = [recovery(a, evidence, bounds, slack_s, times) for a in applied]
    found = moves(evidence.journal, applied, ops, bounds)
    handoffs = explained_moves(found)
    for r in recoveries:
        violations += recovery_violations(r, evidence, ops, handoffs, bounds)
    violations += check_stops(evidence, ops, bounds, applied)
    violations += check_urls(evidence, ops, bounds, totals)
    violations += check_reachability(evidence)
    violations += check_quarantine(evidence)
    violations += check_moves(found, totals)
    for name, status, at in evidence.exits:
        violations.append(Violation("crash", name, f"exited with status {status} at {at:.3f}, unasked"))
    for a in applied:
        if a.exit_status not in (None, 0):
            violations.append(Violation("crash", a.drainer or a.victim, f"#{a.n} SIGTERM: exit status {a.exit_status}"))
    totals["sockets"] = sum(len(s) for s in evidence.sockets.values())
    totals["overlaps"] = len(evidence.overlaps)
    totals["overlaps_excused"] = len(evidence.overlaps) - sum(1 for v in violations if v.kind == "overlap")
    writers: dict[tuple[str, int], set[int]] = {}
    for e in evidence.journal:
        if e.get("op") == "put":
            writers.setdefault((e["pk"], e["sk"]), set()).add(e["fence"])
    totals["rewrites"] = sum(1 for fences in writers.values() if len(fences) > 1)
    notes = cross_check(evidence) + ([resent_note(evidence, totals)] if evidence.stream is not None else [])
    return Verdict(violations, recoveries, totals, notes)


# --- sockets -------------------------------------------------------------------------------------


def freezes(applied: Sequence[Applied]) -> list[Applied]:
    """The faults that froze a worker with SIGSTOP (its kernel keeps its sockets open)."""
    return [a for a in applied if a.kind == "pause" or a.trigger == "lost"]


def check_overlaps(ev: Evidence, applied: Sequence[Applied], bounds: Bounds) -> list[Violation]:
    out = []
    pauses = freezes(applied)
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


def check_stops(ev: Evidence, ops: Sequence[Op], bounds: Bounds, applied: Sequence[Applied]) -> list[Violation]:
    """A STOPPED connection's socket is closed within the STOP bound and none opens
    until the next START. The bound runs from the STOP's answer: the contract's runs from
    when the router recorded it, which is at or before its answer, and under DynamoDB
    faults the router may take seconds to record it (botocore backs off on a 500). A STOP
    of a stream that stalls the close handshake (a close_stall's) has
    ``CLOSE_TIMEOUT_S`` more: a graceful close waits that long for the upstream's half
    before cutting it off."""
    stalled = [(a.started_at, a.healed_at or ev.end_t, a.affected) for a in applied if a.trigger == "stop"]
    out = []
    by_cid: dict[str, list[Op]] = {}
    for op in sorted(ops, key=lambda o: o.t):
        by_cid.setdefault(op.connection_id, []).append(op)
    for cid, seq in by_cid.items():
        for i, op in enumerate(seq):
            if op.action != "STOP":
                continue
            restart = next((o.t for o in seq[i + 1:] if o.action == "START"), ev.end_t)
            closed_by = op.recorded_by + bounds.stop_s
            if any(t0 <= op.t <= t1 and cid in which for t0, t1, which in stalled):
                closed_by += CLOSE_TIMEOUT_S
            if restart <= closed_by:
                continue  # started again before the bound: nothing to hold it to
            for s in ev.sockets_of(cid):
                closed = s.closed_at if s.closed_at is not None else ev.end_t + 1
                if s.opened_at < restart and closed > closed_by:
                    late = (min(closed, restart) - op.t)
                    out.append(Violation("stop_not_closed", cid, f"socket {s.id} open {late:.2f}s after the STOP at "
                                         f"{op.t:.3f} (bound {bounds.stop_s:.2f}s)"))
    return out


def check_urls(ev: Evidence, ops: Sequence[Op], bounds: Bounds, totals: dict[str, int]) -> list[Violation]:
    """Every socket is to the url the connection's ws_url named when it opened (its last
    START's), and one to an old url is closed within the STOP bound of the STOP before
    the START that changed it. A socket to the old url opened within that bound is the
    old owner reconnecting before it could know of the STOP (contract: a STOP takes
    effect within the bound): ``totals["old_url_reconnects"]``, not a violation."""
    out = []
    totals["old_url_reconnects"] = 0
    for cid in ev.connections:
        mine = sorted((op for op in ops if op.connection_id == cid), key=lambda o: o.t)
        starts = [op for op in mine if op.action == "START" and op.ws_url]
        if not starts:
            continue
        epochs = [(op.t, stream_name(op.ws_url)) for op in starts]
        times = [t for t, _ in epochs]
        # The STOP before each START, by when it was recorded at the latest (see check_stops).
        stop_before = {i: max((op.recorded_by for op in mine if op.action == "STOP" and op.t <= t), default=None)
                       for i, (t, _) in enumerate(epochs)}
        sockets = ev.sockets_of(cid)
        for r in sockets:
            i = bisect.bisect_right(times, r.opened_at) - 1
            if i < 0 or r.stream == epochs[i][1]:
                continue
            stop = stop_before[i]
            if i > 0 and r.stream == epochs[i - 1][1] and stop is not None and r.opened_at <= stop + bounds.stop_s:
                totals["old_url_reconnects"] += 1
                continue
            out.append(Violation("stale_url", cid, f"socket {r.id} opened on {r.stream} at {r.opened_at:.3f}; "
                                 f"the ws_url named {epochs[i][1]} since {epochs[i][0]:.3f}"))
        for i in range(1, len(epochs)):
            old, new, stop = epochs[i - 1][1], epochs[i][1], stop_before[i]
            if old == new or stop is None:
                continue
            closed_by = stop + bounds.stop_s
            for r in sockets:
                closed = r.closed_at if r.closed_at is not None else ev.end_t + 1
                if r.stream == old and r.opened_at <= closed_by < closed:
                    out.append(Violation("stale_url", cid, f"socket {r.id} to the old url ({old}) open {closed - stop:.2f}s "
                                         f"after the STOP at {stop:.3f} (bound {bounds.stop_s:.2f}s); the url is {new}"))
    return out


def check_quarantine(ev: Evidence) -> list[Violation]:
    """One violation per connection any observer sample found quarantined."""
    seen: dict[str, list[float]] = {}
    for snap in ev.snapshots:
        for cid, c in snap.connections.items():
            if c.quarantined:
                seen.setdefault(cid, []).append(snap.t)
    return [Violation("quarantined", cid, f"in {len(ts)} samples from {ts[0]:.3f} to {ts[-1]:.3f}: the breaker "
                                          "struck deaths the nemesis caused (the workers' logs: connection_struck)")
            for cid, ts in sorted(seen.items())]


def check_reachability(ev: Evidence) -> list[Violation]:
    """The reachability invariant between every two consecutive observer samples: one
    violation per connection, with when it was first and last found unreachable."""
    found: dict[str, list[tuple[float, str]]] = {}
    for t, cid, why in reachability_violations(ev.snapshots):
        found.setdefault(cid, []).append((t, why))
    return [
        Violation("unreachable", cid, f"in {len(seen)} samples from {seen[0][0]:.3f} to {seen[-1][0]:.3f} "
                                      f"({', '.join(sorted({why for _, why in seen}))})")
        for cid, seen in sorted(found.items())
    ]


def check_moves(found: Sequence[Move], totals: dict[str, int]) -> list[Violation]:
    """Every acquisition explained (``found``: :func:`.moves.moves`): one violation per
    connection that moved with nothing to explain it; ``totals["moves_<reason>"]``
    counts the rest."""
    for reason in REASONS:
        totals[f"moves_{reason}"] = sum(1 for m in found if m.why == reason)
    bounced: dict[str, list[Move]] = {}
    for m in found:
        if m.why is None:
            bounced.setdefault(schema.connection_id_from_pk(m.pk), []).append(m)
    return [
        Violation("bounce", cid, f"{len(ms)} moves with nothing to explain them, first: fence {ms[0].fence} to "
                                 f"{ms[0].worker} at {ms[0].t:.3f}, {ms[0].t - (ms[0].prev_t or 0):.2f}s after "
                                 f"{ms[0].prev_worker} took it")
        for cid, ms in sorted(bounced.items())
    ]


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
    pauses = freezes(applied)
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
    # The table's rows only: what a consumer keeps of a stream may hold a lower fence
    # above a higher one (a STOP before the taker caught up); the stream audit judges it.
    for cid, rows in (ev.rows if schema.SINK_DYNAMODB in ev.sinks else {}).items():
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


def explained_moves(found: Sequence[Move]) -> dict[str, list[float]]:
    """By connection id: when each move that something else explains happened (the
    acquisitions the bounce detector accepts, ``found``), the first ones left out."""
    out: dict[str, list[float]] = {}
    for m in found:
        if m.why not in (None, "first"):
            out.setdefault(schema.connection_id_from_pk(m.pk), []).append(m.t)
    return out


def recovery_violations(
    r: Recovery, ev: Evidence, ops: Sequence[Op], handoffs: dict[str, list[float]], bounds: Bounds
) -> list[Violation]:
    """Connections not whole again (in time), and a bad frame's socket that closed soon
    after it, unless it was dropped, a STOP sent meanwhile closed it, or it was handed
    over for a reason of its own (a shed, a SIGTERM: a move the bounce detector explains
    followed the close within the handoff bound)."""
    a = r.applied
    out = []
    for cid, took in sorted(r.took_s.items()):
        if took is None:
            out.append(Violation("not_recovered", cid, f"#{a.n} {a.kind}: never whole again after {a.affected[cid]:.3f}"))
        elif took > r.bound_s:
            out.append(Violation("slow_recovery", cid, f"#{a.n} {a.kind}: {took:.2f}s, bound {r.bound_s:.2f}s"))
    if a.kind in FRAMES:
        for cid, ref in a.affected.items():
            stops = [op.t for op in ops if op.connection_id == cid and op.action == "STOP"]
            for s in ev.sockets_of(cid):
                if s.opened_at <= ref and s.closed_at is not None and ref <= s.closed_at <= ref + MALFORMED_WATCH_S \
                        and not s.dropped and not any(ref <= t <= s.closed_at for t in stops) \
                        and not any(s.closed_at <= t <= s.closed_at + bounds.handoff_s for t in handoffs.get(cid, ())):
                    out.append(Violation("malformed_closed", cid, f"#{a.n} {a.kind}: socket {s.id} closed "
                                         f"{s.closed_at - ref:.2f}s after a bad frame"))
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
