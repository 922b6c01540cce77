"""What a fleet run showed, as numbers and pictures. Pure functions over the books
(the upstream's socket records, the observer's samples, the audit): no I/O.

Failover is measured from the upstream's socket books, which are exact: for every
connection an event affected, the time from the event to the first socket the
upstream accepted on that stream afterwards. A killed, terminated or frozen worker
opens no socket after the event, so that socket is its successor's; the observer's
samples name the successor.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from wsfleet.balance import FleetLoad, shed_count
from .observed import Audit, LargeFrame, Sample
from .upstream import Overlap, SocketRecord

# Event kinds, and what "done" means for the connections each affects.
START = "start"  # a socket is open (START through the API)
CRASH = "crash"  # a successor opened a socket (SIGKILL of the owner)
DEPLOY = "deploy"  # a successor opened a socket (SIGTERM of the owner, a replacement started)
PAUSE = "pause"  # a successor opened a socket (SIGSTOP of the owner, SIGCONT later)
STOP = "stop"  # the socket is closed (STOP through the API)
JOIN = "join"  # a worker joined: each connection moved to rebalance opened a new socket
TAKEOVERS = (CRASH, DEPLOY, PAUSE)
FLEET_CHANGES = (CRASH, DEPLOY, PAUSE, JOIN)  # steps after which the report shows the spread
MARKERS = {START: "S", CRASH: "K", DEPLOY: "D", PAUSE: "P", STOP: "X", JOIN: "J"}
DEFAULT_TOLERANCE = 0.1  # REBALANCE_TOLERANCE's default: what "balanced" is judged by


@dataclass
class Event:
    kind: str
    label: str
    at: float  # epoch seconds
    affected: dict[str, float]  # connection id -> when the event reached it (epoch s)
    bound_s: float | None = None
    victim: str | None = None
    until: float | None = None  # PAUSE: when the worker was resumed; JOIN: the end of its step


@dataclass
class Outcome:
    """How long each affected connection took to be done (None: never, within the run)."""

    event: Event
    took_s: dict[str, float | None]
    successors: dict[str, str] = field(default_factory=dict)

    @property
    def done(self) -> list[float]:
        return sorted(t for t in self.took_s.values() if t is not None)

    @property
    def pending(self) -> list[str]:
        return sorted(cid for cid, t in self.took_s.items() if t is None)

    @property
    def p50(self) -> float | None:
        return statistics.median(self.done) if self.done else None

    @property
    def max(self) -> float | None:
        return self.done[-1] if self.done else None

    @property
    def within_bound(self) -> bool:
        return not self.pending and (self.event.bound_s is None or not self.done or self.done[-1] <= self.event.bound_s)


def measure(event: Event, sockets: Mapping[str, Sequence[SocketRecord]], samples: Sequence[Sample]) -> Outcome:
    """Per affected connection, seconds from the event to done (see the kinds above)."""
    took: dict[str, float | None] = {}
    successors: dict[str, str] = {}
    for cid, t0 in event.affected.items():
        records = sockets.get(cid, ())
        if event.kind == JOIN:
            moved = socket_handoff(records, t0, event.until)
            if moved is not None:  # the others stayed where they were (not pending)
                closed, opened = moved
                took[cid] = opened - closed
                successor = _owner_after(samples, cid, opened, exclude=None)
                if successor:
                    successors[cid] = successor
            continue
        if event.kind == STOP:
            open_then = [r for r in records if r.opened_at < t0 and (r.closed_at is None or r.closed_at >= t0)]
            if any(r.closed_at is None for r in open_then):
                took[cid] = None
            else:
                took[cid] = max((r.closed_at - t0 for r in open_then), default=0.0)
            continue
        opened = [r.opened_at for r in records if r.opened_at >= t0]
        took[cid] = min(opened) - t0 if opened else None
        if took[cid] is not None:
            successor = _owner_after(samples, cid, t0 + took[cid], exclude=event.victim)
            if successor:
                successors[cid] = successor
    return Outcome(event, took, successors)


def socket_handoff(records: Sequence[SocketRecord], at: float, until: float | None = None) -> tuple[float, float] | None:
    """(closed, opened): when the socket open at ``at`` closed and the next one opened,
    both by ``until``; None if the stream was not moved. Their difference is how long
    the stream had no socket."""
    end = math.inf if until is None else until
    old = [r for r in records if r.opened_at < at and r.closed_at is not None and at <= r.closed_at <= end]
    if not old:
        return None
    closed = max(r.closed_at for r in old)
    new = [r.opened_at for r in records if closed <= r.opened_at <= end]
    return (closed, min(new)) if new else None


def above_share(counts: Mapping[str, int], tolerance: float = DEFAULT_TOLERANCE) -> list[str]:
    """The workers that would still shed under the fleet's own rule
    (:func:`wsfleet.balance.shed_count`, every worker with the same MAX_CONNECTIONS): none
    means balanced."""
    if not counts:
        return []
    per_worker = 100  # the fair share does not depend on it when every worker has the same
    fleet = FleetLoad(len(counts), sum(counts.values()), per_worker * len(counts), 0, 0, 0)
    return sorted(
        name for name, n in counts.items()
        if shed_count(active=n, max_connections=per_worker, fleet=fleet, tolerance=tolerance, max_moves=n, recovering=False)
    )


def _owner_after(samples: Sequence[Sample], cid: str, t: float, *, exclude: str | None) -> str:
    for sample in samples:
        if sample.t >= t:
            owner = sample.owners().get(cid, "")
            if owner and owner != exclude:
                return owner
    return ""


def excused(overlap: Overlap, events: Iterable[Event]) -> Event | None:
    """The PAUSE that explains an overlap, if any: a frozen process keeps its socket open
    (the kernel answers for it) while a successor connects; it closes it on resume."""
    for e in events:
        if e.kind == PAUSE and overlap.stream in e.affected and e.at <= overlap.started_at <= (e.until or float("inf")):
            return e
    return None


# --- progress ---------------------------------------------------------------------------------


def progress_line(elapsed: float, phase: str, sample: Sample, earlier: Sample | None, workers: Mapping[str, str]) -> str:
    """One plain-text line: elapsed, phase, connections per worker, orphans, open sockets,
    stored messages per second (from the checkpoints, so it moves at each checkpoint
    write, at most CHECKPOINT_SECONDS apart while frames arrive)."""
    counts = sample.owned_counts()
    parts = []
    for name, state in workers.items():
        tag = "" if state == "running" else f"({state})"
        parts.append(f"{name}:{counts.get(name, 0)}{tag}")
    rate = ""
    if earlier is not None and sample.t > earlier.t:
        rate = f"{(sample.stored - earlier.stored) / (sample.t - earlier.t):6.1f}"
    sockets = sum(sample.open_sockets.values())
    return (
        f"[{elapsed:6.1f}s] {phase:<10} {' '.join(parts)} | orphans {len(sample.orphans())}"
        f" | sockets {sockets} | stored/s {rate}"
    )


# --- the report ---------------------------------------------------------------------------------


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}s"


def event_table(outcomes: Sequence[Outcome], t_origin: float) -> list[str]:
    header = f"{'event':<34} {'at':>7} {'conns':>5} {'done':>5} {'p50':>7} {'max':>7} {'bound':>7}  verdict"
    lines = [header, "-" * len(header)]
    for o in outcomes:
        e = o.event
        verdict = "ok" if o.within_bound else ("NOT DONE: " + ",".join(o.pending[:4]) if o.pending else "SLOW")
        what = "moved to" if e.kind == JOIN else f"{'closed' if e.kind == STOP else 'connected'} again, now owned by"
        conns = len(o.took_s) if e.kind == JOIN else len(e.affected)  # a join affects what it moves
        lines.append(
            f"{e.label:<34} {e.at - t_origin:6.1f}s {conns:>5} {len(o.done):>5} "
            f"{fmt_s(o.p50):>7} {fmt_s(o.max):>7} {fmt_s(e.bound_s):>7}  {verdict}"
        )
        if e.kind in (*TAKEOVERS, JOIN) and o.successors:
            spread: dict[str, int] = {}
            for owner in o.successors.values():
                spread[owner] = spread.get(owner, 0) + 1
            lines.append(f"{'':<4}{what}: " + ", ".join(f"{k} {v}" for k, v in sorted(spread.items())))
    return lines


def _counts_at(samples: Sequence[Sample], t: float) -> tuple[float, dict[str, int]] | None:
    """The last sample at or before ``t``: (when, connections per owning worker)."""
    chosen = None
    for sample in samples:
        if sample.t > t:
            break
        chosen = sample
    return (chosen.t, chosen.owned_counts()) if chosen is not None else None


def _fmt_counts(counts: Mapping[str, int], workers: Sequence[str]) -> str:
    names = [w for w in workers if w in counts] + sorted(set(counts) - set(workers))
    return " ".join(f"{w}:{counts[w]}" for w in names) or "none"


def spread_lines(
    events: Sequence[Event], samples: Sequence[Sample], workers: Sequence[str], *, ended_at: float, t_origin: float
) -> list[str]:
    """Connections per worker just before each step that changes the fleet and at the end
    of that step (just before the next event, or the final STOP), judged by the fleet's
    own rule: balanced when no worker is above its fair share by more than the tolerance."""
    lines = []
    ordered = sorted(events, key=lambda e: e.at)
    for i, e in enumerate(ordered):
        if e.kind not in FLEET_CHANGES:
            continue
        end = ordered[i + 1].at if i + 1 < len(ordered) else ended_at
        before, after = _counts_at(samples, e.at), _counts_at(samples, end)
        if before is None or after is None or after[0] <= e.at:
            lines.append(f"{e.label}: not enough samples")
            continue
        counts = after[1]
        total = sum(counts.values())
        above = above_share(counts)
        share = total / len(counts) if counts else 0.0
        verdict = "balanced" if not above else "NOT balanced: " + ", ".join(f"{w} {counts[w]}" for w in above)
        lines.append(f"{e.label}")
        lines.append(f"    before ({before[0] - t_origin:5.1f}s): {_fmt_counts(before[1], workers)}")
        lines.append(
            f"    after  ({after[0] - t_origin:5.1f}s): {_fmt_counts(counts, workers)}  "
            f"(fair share {share:.1f}, spread {max(counts.values(), default=0) - min(counts.values(), default=0)}; {verdict})"
        )
    return lines


def unbalanced_joins(events: Sequence[Event], samples: Sequence[Sample], *, ended_at: float) -> list[str]:
    """Joins after which the fleet was still not balanced when the next step began."""
    out = []
    ordered = sorted(events, key=lambda e: e.at)
    for i, e in enumerate(ordered):
        if e.kind == JOIN:
            after = _counts_at(samples, ordered[i + 1].at if i + 1 < len(ordered) else ended_at)
            if after is None or above_share(after[1]):
                out.append(e.label)
    return out


def close_steps(events: Sequence[Event], ended_at: float) -> None:
    """Give each JOIN the end of its step (the next event, or the final STOP): only
    sockets moved within it count as its moves."""
    ordered = sorted(events, key=lambda e: e.at)
    for i, e in enumerate(ordered):
        if e.kind == JOIN and e.until is None:
            e.until = ordered[i + 1].at if i + 1 < len(ordered) else ended_at


@dataclass
class DataSummary:
    connections: int
    produced: int
    delivered: int  # distinct seqs sent to some socket
    frames_sent: int  # every frame sent, replays after a takeover included
    stored: int  # rows in the messages table
    checkpoints: int  # sum of last_seq
    bad: list[str]  # connections whose rows are not exactly 1..checkpoint
    missing: int  # seqs absent below a connection's last stored one
    unstored: int  # delivered above the checkpoint: in flight when a socket closed for STOP

    @property
    def ok(self) -> bool:
        return not self.bad and self.missing == 0


def summarise(audits: Sequence[Audit], frames_sent: int) -> DataSummary:
    return DataSummary(
        connections=len(audits),
        produced=sum(a.produced for a in audits),
        delivered=sum(a.delivered for a in audits),
        frames_sent=frames_sent,
        stored=sum(a.rows for a in audits),
        checkpoints=sum(a.checkpoint for a in audits),
        bad=[a.connection_id for a in audits if not a.ok],
        missing=sum(len(a.missing) for a in audits),
        unstored=sum(max(0, a.delivered - a.rows) for a in audits),
    )


def data_lines(summary: DataSummary, overlaps: Sequence[Overlap], events: Sequence[Event]) -> list[str]:
    s = summary
    replays = s.frames_sent - s.delivered
    lines = [
        f"upstream produced {s.produced} messages on {s.connections} streams (a stream goes on while STOPPED); "
        f"sent {s.frames_sent} frames "
        f"({s.delivered} distinct, {replays} replayed to a successor from its checkpoint)",
        f"stored {s.stored} rows; checkpoints sum to {s.checkpoints}; "
        f"connections not exactly 1..checkpoint: {len(s.bad)}{' ' + ','.join(s.bad[:8]) if s.bad else ''}; "
        f"missing seqs (gaps): {s.missing}",
    ]
    if s.unstored:
        lines.append(
            f"  {s.unstored} frames were sent after the last stored one: in flight when a socket closed for STOP "
            "(never acknowledged, not lost: a START resumes from the checkpoint)"
        )
    unexplained = [o for o in overlaps if excused(o, events) is None]
    lines.append(
        f"moments with two sockets on one stream: {len(overlaps)}"
        + (f" ({len(overlaps) - len(unexplained)} during a SIGSTOP: the frozen process's socket stays open "
           "until it resumes and finds its session gone)" if len(overlaps) != len(unexplained) else "")
    )
    for o in unexplained[:10]:
        lines.append(f"  OVERLAP on {o.stream} at {o.started_at:.3f}: sockets {o.socket_ids} peers {o.peers}")
    return lines


def large_frame_lines(large: LargeFrame) -> list[str]:
    """The large frame the demo sent, read back through the read API and its presigned data_url."""
    head = f"large frame: {large.connection_id} seq {large.seq}, {large.sent_bytes:,} bytes of data sent"
    if large.stored != "object":
        return [f"{head}; stored: {large.stored} (expected an S3 object)"]
    verdict = "matches what the upstream sent" if large.ok else "DOES NOT match what the upstream sent"
    how, holder = {
        "stream": ("from its record on the stream and the object its data_ref names", "record"),
        "firehose": ("from its line in the delivery stream's objects and the object its data_ref names", "line"),
    }.get(large.via, (f"through GET /connections/{large.connection_id}/messages and its data_url", "item"))
    return [
        f"{head}, stored as {large.data_ref}",
        f"  read back {how}: {large.read_bytes:,} bytes ({holder} says {large.item_bytes:,}), SHA-256 {large.read_sha256} "
        f"({holder} {'the same' if large.item_sha256 == large.read_sha256 else large.item_sha256}): {verdict}",
    ]


def _ramp() -> str:
    blocks = " ▁▂▃▄▅▆▇█"
    try:
        blocks.encode(sys.stdout.encoding or "ascii")
        return blocks
    except (UnicodeEncodeError, LookupError):
        return " .:-=+*#@"


def ownership_chart(
    samples: Sequence[Sample],
    workers: Sequence[str],
    events: Sequence[Event],
    *,
    t_origin: float,
    width: int = 64,
    ramp: str | None = None,
) -> list[str]:
    """Connections per worker over time, one row per worker (and one for orphans); each
    column is one slice of the run, its character the count at the slice's end."""
    if not samples:
        return []
    ramp = ramp or _ramp()
    t_end = samples[-1].t
    span = max(1e-9, t_end - t_origin)
    columns: list[Sample] = []
    i = 0
    for col in range(width):
        edge = t_origin + span * (col + 1) / width
        while i + 1 < len(samples) and samples[i + 1].t <= edge:
            i += 1
        columns.append(samples[i])
    rows = {name: [c.owned_counts().get(name, 0) for c in columns] for name in workers}
    rows["orphans"] = [len(c.orphans()) for c in columns]
    top = max([1] + [v for row in rows.values() for v in row])
    label_w = max(len(n) for n in rows)
    scale = len(ramp) - 1
    lines = [f"connections per worker over time ({span:.0f}s, {span / width:.1f}s per column; full block = {top})"]
    for name, row in rows.items():
        chars = "".join(ramp[0] if v == 0 else ramp[max(1, round(v / top * scale))] for v in row)
        lines.append(f"{name:>{label_w}} |{chars}| max {max(row)}")
    marks = [" "] * width
    for e in events:
        col = min(width - 1, max(0, int((e.at - t_origin) / span * width)))
        marks[col] = MARKERS.get(e.kind, "?")
    lines.append(f"{'':>{label_w}} |{''.join(marks)}|")
    end = f"{span:.0f}s"
    lines.append(f"{'':>{label_w}} |0s{end:>{width - 2}}|")
    lines.append(f"{'':>{label_w}}  " + "  ".join(f"{m}={k}" for k, m in MARKERS.items()))
    return lines


def render(
    outcomes: Sequence[Outcome],
    summary: DataSummary,
    overlaps: Sequence[Overlap],
    samples: Sequence[Sample],
    workers: Sequence[str],
    *,
    t_origin: float,
    ended_at: float | None = None,
    large: LargeFrame | None = None,
) -> list[str]:
    events = [o.event for o in outcomes]
    spreads = spread_lines(events, samples, workers, ended_at=ended_at or samples[-1].t, t_origin=t_origin) if samples else []
    return [
        "== failover and control (time until every affected connection was connected again, or closed for STOP;",
        "   for a join, each moved connection's time without a socket, old socket closed -> new one open)",
        *event_table(outcomes, t_origin),
        "",
        *(["== connections per worker, before and after each step that changes the fleet", *spreads, ""] if spreads else []),
        "== data",
        *data_lines(summary, overlaps, events),
        *(large_frame_lines(large) if large is not None else []),
        "",
        *ownership_chart(samples, workers, events, t_origin=t_origin),
    ]


def failures(
    outcomes: Sequence[Outcome],
    summary: DataSummary,
    overlaps: Sequence[Overlap],
    *,
    strict: bool,
    samples: Sequence[Sample] = (),
    ended_at: float | None = None,
    large: LargeFrame | None = None,
) -> list[str]:
    """Why the run counts as failed (empty: it passed). With ``strict``, also a join
    after which the fleet was not balanced by the next step."""
    events = [o.event for o in outcomes]
    out = []
    if strict and samples:
        out += [f"{label}: not balanced by the next step" for label in unbalanced_joins(events, samples, ended_at=ended_at or samples[-1].t)]
    if summary.bad or summary.missing:
        out.append(f"data: {len(summary.bad)} connections not exactly 1..checkpoint, {summary.missing} missing seqs")
    unexplained = [o for o in overlaps if excused(o, events) is None]
    if unexplained:
        out.append(f"{len(unexplained)} moments with two sockets on one stream")
    if large is not None and not large.ok:
        out.append(f"large frame {large.connection_id} seq {large.seq}: not read back as sent")
    for o in outcomes:
        if o.pending:
            out.append(f"{o.event.label}: {len(o.pending)} connections never done")
        elif strict and not o.within_bound:
            out.append(f"{o.event.label}: max {o.max:.2f}s over the {o.event.bound_s:.2f}s bound")
    return out


def as_json(
    outcomes: Sequence[Outcome],
    summary: DataSummary,
    audits: Sequence[Audit],
    overlaps: Sequence[Overlap],
    samples: Sequence[Sample],
    *,
    t_origin: float,
    settings: Mapping[str, Any],
    failed: Sequence[str],
    large: LargeFrame | None = None,
    kinds: Sequence[Any] = (),
    stream: Mapping[str, Any] | None = None,
) -> str:
    """The whole report as JSON; ``kinds``: the upstream kinds' audits (KindAudit);
    ``stream``: the stream audit's (StreamAudit.as_dict), where the sink has kinesis."""
    return json.dumps(
        {
            "settings": dict(settings), "t_origin": t_origin,  # epoch seconds: what at_s and until_s count from
            "passed": not failed,
            "failures": list(failed),
            "events": [
                {
                    "kind": o.event.kind,
                    "label": o.event.label,
                    "at_s": round(o.event.at - t_origin, 3), "until_s": round(o.event.until - t_origin, 3) if o.event.until else None,
                    "bound_s": o.event.bound_s,
                    "p50_s": o.p50,
                    "max_s": o.max,
                    "pending": o.pending,
                    "took_s": o.took_s,
                    "successors": o.successors,
                }
                for o in outcomes
            ],
            "data": asdict(summary),
            "large_frame": {**asdict(large), "ok": large.ok} if large is not None else None,
            "connections": [asdict(a) for a in audits],
            "upstream_kinds": [{**asdict(a), "ok": a.ok} for a in kinds],
            "stream": dict(stream) if stream is not None else None,
            "overlaps": [asdict(o) for o in overlaps],
            "series": [
                {"t_s": round(s.t - t_origin, 3), "owned": s.owned_counts(), "orphans": len(s.orphans()), "stored": s.stored}
                for s in samples
            ],
        },
        indent=1,
    )
