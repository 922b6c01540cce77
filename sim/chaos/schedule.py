"""The generator: a seeded schedule of faults, and the bound each one is judged by.

Everything here is drawn from one ``random.Random(seed)`` and the run's settings, and
nothing else (no clock, no machine): the same seed gives the same schedule, down to the
victims, the streams and the shares. What the fleet does under it is timing-dependent;
the schedule is not.

Faults come one at a time. Each is followed by its recovery bound and a quiet spell
before the next one starts, so every recovery is measured against one fault. Kinds are
dealt from a shuffled deck, so a run of N faults covers every kind before it repeats
one (a run may deal only some kinds: ``kinds``). A fault that targets a worker picks a
slot (one of the W worker processes the fleet keeps running); the runner names the
processes.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from wsfleet.leases import SessionTiming
from wsfleet.worker.upstream_socket import CLOSE_TIMEOUT_S
from wsfleet.worker.takeover import RING_REFRESH_S
from ..timing import TAKEOVER_SLACK_S, Timing
from .byzantine import CLASSES

# Kinds, by where the fault is injected. "ambiguous" reaches SQS as well as DynamoDB.
DYNAMODB = ("ddb_throttle", "ddb_latency", "ddb_outage", "ambiguous")
SQS = ("sqs_outage",)
UPSTREAM = ("drop", "stall", "slow", "oversize", "malformed", "byzantine", "seq_jump", "replay_offset", "close_stall")
PROCESS = ("kill", "pause", "term", "clock", "drain_term", "burst_term")
CONTROL = ("storm", "flip")
# The messages stream's, dealt only where the sink has kinesis (a deck without them is
# the one every seed dealt before there was a stream: the same seed, the same schedule).
KINESIS = ("kinesis_outage", "kinesis_throttle", "kinesis_refuse", "kinesis_ambiguous")
KINDS = DYNAMODB + SQS + UPSTREAM + PROCESS + CONTROL + KINESIS
FRAMES = ("malformed", "byzantine", "seq_jump")  # bad frames: the socket must stay up
CLOSE_TRIGGERS = ("stop", "term", "lost")  # what closes a close_stall's stalled sockets

# Recovery is measured from the fault's start for these, from its end for the rest (the
# end of a window, or the act the recovery is timed from: a START, a SIGTERM).
FROM_START = ("drop", "oversize", "replay_offset", "flip", "kill", "pause", "term", "clock", "drain_term") + FRAMES

THROTTLED_OPS = ("UpdateItem", "BatchWriteItem", "Query", "BatchGetItem", "PutItem")
MALFORMED = ("not json", '{"data": 1}', "[]", '{"seq": "7", "data": 1}', '{"seq": 1.5}', "")
MAX_FRAME_BYTES = 1 << 20  # the chaos workers' MAX_FRAME_BYTES (run.py sets it), which oversize faults exceed
# The first reconnect waits at most 0.25 s (connection.py: backoff base 0.2 s + 0.05 s).
FIRST_RECONNECT_S = 0.25
# The room TAKEOVER_SLACK_S keeps for a busy 2-core machine, given to the handoff too:
# it goes through an SQS hint to a peer's long poll, and a loaded emulator slows that.
BUSY_MACHINE_S = 1.5


@dataclass(frozen=True)
class Bounds:
    """How long each kind of fault may keep a connection from being whole again, from
    the worker timing (:class:`~sim.timing.Timing`)."""

    timing: Timing

    @property
    def takeover_s(self) -> float:
        """kill -9 or SIGSTOP of the owner: lease + skew + slack (Timing.crash_bound_s)."""
        return self.timing.crash_bound_s

    @property
    def unwatched_extra_s(self) -> float:
        """A session younger than :attr:`settle_s` may not be watched yet: a watcher
        finds a newcomer at its next ring refresh."""
        return RING_REFRESH_S

    @property
    def settle_s(self) -> float:
        """How long after a session opens its crash is covered by :attr:`takeover_s`:
        the ring refresh plus the longest pause between two watch passes (as the fleet
        tests' ``watched_by_all``)."""
        st = SessionTiming(round(self.timing.lease_s * 1000), round(self.timing.heartbeat_s * 1000), self.timing.skew_ms)
        return RING_REFRESH_S + 0.85 * st.watch_window_ms() / 1000 + 0.5

    @property
    def handoff_s(self) -> float:
        """SIGTERM with a replacement up: the graceful handoff (Timing.graceful_bound_s),
        with the busy machine's room."""
        return self.timing.graceful_bound_s + BUSY_MACHINE_S

    @property
    def reconnect_s(self) -> float:
        """A socket the upstream dropped (or the worker closed on an oversized frame)
        is reopened after the first backoff, plus the slack."""
        return FIRST_RECONNECT_S + TAKEOVER_SLACK_S

    @property
    def catch_up_s(self) -> float:
        """A stalled or slowed stream delivers its backlog once healed."""
        return TAKEOVER_SLACK_S

    @property
    def stop_s(self) -> float:
        return self.timing.stop_bound_s

    @property
    def unhinted_start_s(self) -> float:
        """A START whose hint was lost (SQS down) is found by the FREE# scan."""
        return self.timing.reconcile_s + TAKEOVER_SLACK_S

    @property
    def restart_s(self) -> float:
        """A START while the STOP before it is still being carried out: the owner closes
        and releases it (within the STOP bound), and the FREE# scan finds it then."""
        return self.stop_s + self.unhinted_start_s

    @property
    def after_dynamodb_s(self) -> float:
        """After a DynamoDB fault heals: a session lost in it is taken over as a crash."""
        return self.timing.crash_bound_s

    @property
    def flip_s(self) -> float:
        """A START with a new url right after a STOP: the owner closes and releases
        within the STOP bound and hints the connection itself, which then connects within
        the START target, with the busy machine's room."""
        return self.stop_s + self.timing.start_bound_s + BUSY_MACHINE_S

    @property
    def stalled_handoff_s(self) -> float:
        """SIGTERM of an owner whose upstream stalls the close handshake: the handoff, and
        the longest a graceful close waits for the upstream's half."""
        return self.handoff_s + CLOSE_TIMEOUT_S

    def for_kind(self, kind: str, trigger: str = "") -> float:
        """The bound of a fault of ``kind`` (a close_stall's: by its ``trigger``)."""
        if kind == "close_stall":
            return {"stop": self.unhinted_start_s, "term": self.stalled_handoff_s, "lost": self.takeover_s}[trigger]
        return {
            "ddb_throttle": self.after_dynamodb_s,
            "ddb_latency": self.after_dynamodb_s,
            "ddb_outage": self.after_dynamodb_s,
            "ambiguous": self.after_dynamodb_s,
            # The writer holds what it could not send until the stream takes it; a session
            # that could not be renewed meanwhile (it cannot: DynamoDB is up) is not at stake.
            "kinesis_outage": self.after_dynamodb_s,
            "kinesis_throttle": self.after_dynamodb_s,
            "kinesis_refuse": self.after_dynamodb_s,
            "kinesis_ambiguous": self.after_dynamodb_s,
            "sqs_outage": self.unhinted_start_s,
            "drop": self.reconnect_s,
            "oversize": self.reconnect_s,
            "replay_offset": self.reconnect_s,
            "malformed": 0.0,
            "byzantine": 0.0,
            "seq_jump": 0.0,
            "stall": self.catch_up_s,
            "slow": self.catch_up_s,
            "kill": self.takeover_s,
            "pause": self.takeover_s,
            "term": self.handoff_s,
            "clock": self.handoff_s,
            # The victim's connections, from the kill: taken over, then handed over again
            # by the watcher that was draining them when it got SIGTERM.
            "drain_term": self.takeover_s + self.handoff_s,
            # From the STARTs: a hint may reach the leaving worker, which hands it over.
            "burst_term": self.unhinted_start_s + self.handoff_s,
            "storm": self.restart_s,
            "flip": self.flip_s,
        }[kind]


@dataclass(frozen=True)
class Fault:
    """One entry of the schedule. ``at_s`` is from the start of the chaos phase;
    ``duration_s`` is how long it lasts (0: a single act). ``params`` is JSON."""

    n: int
    at_s: float
    kind: str
    duration_s: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        p = self.params
        what = {
            "ddb_throttle": lambda: "throttle " + ", ".join(f"{op} {share:.0%}" for op, share in p["shares"].items()),
            "ddb_latency": lambda: f"+{p['latency_ms']} ms (+0-{p['jitter_ms']} ms) on every request",
            "ddb_outage": lambda: f"DynamoDB down ({p['mode']})",
            "sqs_outage": lambda: f"SQS down; STOP then START {len(p['streams'])} connections inside",
            "drop": lambda: f"drop {len(p['streams'])} sockets ({'abrupt' if p['abrupt'] else 'clean'})",
            "stall": lambda: f"stall {len(p['streams'])} streams",
            "slow": lambda: f"slow {len(p['streams'])} streams to one frame per {p['delay_s']} s",
            "oversize": lambda: f"oversized frame ({p['size']} bytes) on {len(p['streams'])} streams",
            "malformed": lambda: f"malformed frame {p['text']!r} on {len(p['streams'])} streams",
            "byzantine": lambda: f"{len(p['classes'])} byzantine frames on {len(p['streams'])} streams",
            "seq_jump": lambda: f"seq jump {p['jump']:+d} on {len(p['streams'])} streams",
            "replay_offset": lambda: f"drop {len(p['streams'])} sockets; the next replays from {p['offset']:+d} seqs off",
            "close_stall": lambda: {
                "stop": f"stall {len(p.get('streams', ()))} streams, then STOP them (START after {self.duration_s:g} s)",
                "term": f"stall {p.get('few')} streams of slot {p.get('slot')}, then SIGTERM it",
                "lost": f"stall {p.get('few')} streams of slot {p.get('slot')}, then SIGSTOP it {self.duration_s:g} s",
            }[p["trigger"]],
            "ambiguous": lambda: f"{p['share']:.0%} of every DynamoDB and SQS request ({p['writes']:.0%} of UpdateItem and "
                                 f"TransactWriteItems) applied, then answered 500; STOP {len(p['streams'])} connections "
                                 "inside, then START them with a new url",
            "kill": lambda: f"kill -9 slot {p['slot']}, replaced after {self.duration_s} s",
            "pause": lambda: f"SIGSTOP slot {p['slot']} for {self.duration_s} s, then SIGCONT",
            "term": lambda: f"SIGTERM slot {p['slot']} once its replacement is up",
            "clock": lambda: f"replace slot {p['slot']} with a worker whose clock is {p['offset_ms']:+d} ms off",
            "drain_term": lambda: f"kill -9 slot {p['slot']}, SIGTERM the watcher that drains it, replaced after {self.duration_s} s",
            "burst_term": lambda: f"STOP {len(p['streams'])}, START them from {p['threads']} threads, SIGTERM slot {p['slot']} "
                                  f"after {p['term_after']}",
            "storm": lambda: f"STOP/START storm on {len(p['streams'])} connections: {p['flaps']} flaps, then STOPPED {p['hold_s']} s",
            "flip": lambda: f"STOP then START with a new url {p['gap_s'] * 1000:.0f} ms later on {len(p['streams'])} connections",
            "kinesis_outage": lambda: "Kinesis down (every request answered 500)",
            "kinesis_throttle": lambda: f"{p['share']:.0%} of PutRecords refused whole for throughput",
            "kinesis_refuse": lambda: f"{p['share']:.0%} of the records of every PutRecords refused for throughput (a partial failure)",
            "kinesis_ambiguous": lambda: f"{p['share']:.0%} of PutRecords applied, then answered 500",
        }[self.kind]()
        quiet = ("kill", "pause", "drain_term", "burst_term", "close_stall")
        span = f" for {self.duration_s:g} s" if self.duration_s and self.kind not in quiet else ""
        return f"#{self.n:<3} {self.at_s:7.1f}s {self.kind:<12} {what}{span}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    minutes: float
    workers: int
    connections: int
    warmup_s: float
    faults: tuple[Fault, ...]

    def lines(self) -> list[str]:
        return [f.describe() for f in self.faults]

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "faults": [asdict(f) for f in self.faults]}, indent=1)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out


def generate(
    *,
    seed: int,
    minutes: float,
    workers: int,
    connections: int,
    timing: Timing | None = None,
    warmup_s: float | None = None,
    kinds: Sequence[str] | None = None,
    sink: str = "dynamodb",
) -> Schedule:
    """The schedule for a chaos phase of ``minutes``: faults back to back, each after
    the previous one's end, its recovery bound and a quiet spell (a fifth to a half of
    the lease). Windows are sized in leases, so a short lease gives a dense run.

    ``warmup_s``: how long before the chaos phase the last worker's session opened (the
    runner waits that long; default: until every session is watched). Worker faults wait
    for a watched victim while there is something else to do. ``kinds``: the kinds the
    deck holds (default: every one; drain_term needs three workers, a drainer's survivor;
    the Kinesis ones a ``sink`` with kinesis)."""
    rng = random.Random(seed)
    timing = timing or Timing()
    bounds = Bounds(timing)
    warmup_s = bounds.settle_s if warmup_s is None else warmup_s
    dealt = dealt_kinds(kinds, workers, sink)
    total = minutes * 60
    slots = _Slots([-warmup_s] * workers)
    deck: list[str] = []
    faults: list[Fault] = []
    t = 2.0
    while True:
        if not deck:
            deck = list(dealt)
            rng.shuffle(deck)
        kind = next((k for k in deck if k not in PROCESS or slots.victim_ready(k, t, bounds)), deck[0])
        deck.remove(kind)
        duration, params = _draw(kind, rng, timing, bounds, connections, slots, t)
        ref = 0.0 if kind in FROM_START else duration
        frozen = kind == "pause" or params.get("trigger") == "lost"
        busy = max(duration + (bounds.stop_s if frozen else 0.0), ref + bounds.for_kind(kind, params.get("trigger", "")))
        if "slot" in params and slots.young(params["slot"], t, bounds):
            busy = max(busy, bounds.takeover_s + bounds.unwatched_extra_s)
        end = t + busy + max(1.0, rng.uniform(0.2, 0.5) * timing.lease_s)
        if end > total:
            break
        faults.append(Fault(len(faults) + 1, round(t, 1), kind, duration, params))
        slots.after(kind, params, duration, t, bounds)
        t = round(end, 1)
    return Schedule(seed, minutes, workers, connections, round(warmup_s, 1), tuple(faults))


def dealt_kinds(kinds: Sequence[str] | None, workers: int, sink: str = "dynamodb") -> tuple[str, ...]:
    """The kinds a run's deck holds, in KINDS order; ValueError for an unknown one, or
    a Kinesis one with no stream to fault."""
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    streamless = "kinesis" not in sink.split(",")
    if streamless and set(kinds or ()) & set(KINESIS):
        raise ValueError(f"{', '.join(sorted(set(kinds or ()) & set(KINESIS)))} need a sink with kinesis (--sink kinesis)")
    chosen = tuple(k for k in KINDS if (kinds is None or k in kinds) and not (streamless and k in KINESIS))
    chosen = tuple(k for k in chosen if k != "drain_term" or workers >= 3)
    if not chosen:
        raise ValueError("no fault kind to deal" + (" (drain_term needs at least 3 workers)" if kinds else ""))
    return chosen


@dataclass
class _Slots:
    """What the generator tracks of the worker slots, from its own schedule alone."""

    opened: list[float]  # per slot: when its current session opened
    skewed: int | None = None  # the one slot whose worker runs with its clock off

    def young(self, slot: int, t: float, bounds: Bounds) -> bool:
        return t - self.opened[slot] < bounds.settle_s

    def settled(self, t: float, bounds: Bounds) -> list[int]:
        return [s for s in range(len(self.opened)) if not self.young(s, t, bounds)]

    def victim_ready(self, kind: str, t: float, bounds: Bounds) -> bool:
        """A fault of ``kind`` on a worker has a watched victim to pick now (a clock
        fault goes to the skewed slot, if there is one)."""
        if kind == "clock" and self.skewed is not None:
            return not self.young(self.skewed, t, bounds)
        return bool(self.settled(t, bounds))

    def after(self, kind: str, params: Mapping[str, Any], duration: float, t: float, bounds: Bounds) -> None:
        """Note which slots got a new session (and when: they are not watched at once),
        and which one runs with its clock off."""
        timing = bounds.timing
        trigger = params.get("trigger")
        if kind in ("term", "clock", "kill", "burst_term", "drain_term") or trigger == "term":
            if kind == "drain_term":
                # The drainer, whichever slot it is, is replaced once it has ended the
                # victim's session: within the takeover bound. Its clock, if skewed, is
                # not known here: the skewed slot stays the only one clock faults pick.
                self.opened = [max(o, t + bounds.takeover_s) for o in self.opened]
            self.opened[params["slot"]] = t + duration
            if self.skewed == params["slot"]:
                self.skewed = None  # replaced by a worker with a true clock...
            if kind == "clock":
                self.skewed = params["slot"]  # ...unless the replacement is the skewed one
        elif kind == "pause" or trigger == "lost":
            self.opened[params["slot"]] = t + duration
        elif kind == "ddb_outage" and duration > timing.lease_s - timing.skew_ms / 1000 - timing.heartbeat_s:
            self.opened = [t + duration] * len(self.opened)


def _streams(rng: random.Random, connections: int, most: int) -> list[int]:
    k = rng.randint(1, max(1, min(most, connections)))
    return sorted(rng.sample(range(connections), k))


def _draw(
    kind: str, rng: random.Random, timing: Timing, bounds: Bounds, connections: int, slots: _Slots, t: float
) -> tuple[float, dict[str, Any]]:
    """(duration, params) of one fault of ``kind``."""
    r = lambda a, b: round(rng.uniform(a, b), 1)  # noqa: E731
    lease = timing.lease_s
    few = max(1, connections // 8)
    if kind == "ddb_throttle":
        if rng.random() < 0.5:
            shares = {"*": round(rng.uniform(0.1, 0.5), 2)}
        else:
            ops = sorted(rng.sample(THROTTLED_OPS, rng.randint(1, 3)))
            shares = {op: round(rng.uniform(0.3, 0.9), 2) for op in ops}
        return r(lease, 2.5 * lease), {"shares": shares}
    if kind == "ddb_latency":
        return r(lease, 2.5 * lease), {"latency_ms": rng.randint(50, 400), "jitter_ms": rng.randint(0, 200)}
    if kind == "ddb_outage":
        mode = rng.choice(("error", "hang"))
        safe = timing.lease_s - timing.skew_ms / 1000 - timing.heartbeat_s  # costs no session
        if rng.random() < 0.5:
            return r(min(1.0, safe / 2), max(0.5, safe - 0.5)), {"mode": mode}
        return r(lease, 1.5 * lease), {"mode": mode}
    if kind == "kinesis_outage":
        return r(0.5 * lease, 1.5 * lease), {}
    if kind in ("kinesis_throttle", "kinesis_refuse", "kinesis_ambiguous"):
        return r(lease, 2 * lease), {"share": round(rng.uniform(0.2, 0.6), 2)}
    if kind == "sqs_outage":
        stop_at = 0.5
        start_at = round(stop_at + bounds.stop_s + 1.0, 1)
        return r(start_at + 1, start_at + 1 + 0.7 * lease), {"streams": _streams(rng, connections, few), "stop_at_s": stop_at, "start_at_s": start_at}
    if kind == "drop":
        return 0.0, {"streams": _streams(rng, connections, few), "abrupt": rng.random() < 0.5}
    if kind == "stall":
        return r(0.4 * lease, 1.5 * lease), {"streams": _streams(rng, connections, few)}
    if kind == "slow":
        return r(0.5 * lease, 1.5 * lease), {"streams": _streams(rng, connections, few), "delay_s": r(0.5, 2.0)}
    if kind == "oversize":
        return 0.0, {"streams": _streams(rng, connections, 2), "size": MAX_FRAME_BYTES + rng.randint(1, 64 * 1024)}
    if kind == "malformed":
        return 0.0, {"streams": _streams(rng, connections, few), "text": rng.choice(MALFORMED)}
    if kind == "byzantine":
        return 0.0, {"streams": _streams(rng, connections, few), "classes": rng.sample(sorted(CLASSES), len(CLASSES))}
    if kind == "seq_jump":
        return 0.0, {"streams": _streams(rng, connections, few), "jump": rng.choice((-1, 1)) * rng.randint(1, 20)}
    if kind == "replay_offset":
        return 0.0, {"streams": _streams(rng, connections, few), "offset": rng.choice((-1, 1)) * rng.randint(1, 10),
                     "abrupt": rng.random() < 0.5}
    if kind == "close_stall":
        settled = slots.settled(t, bounds)
        trigger = rng.choice(CLOSE_TRIGGERS) if settled else "stop"
        if trigger == "stop":
            return round(bounds.stop_s + 1.0, 1), {"trigger": trigger, "streams": _streams(rng, connections, few)}
        slot = rng.choice(settled)
        pause = r(lease + timing.heartbeat_s, 1.5 * lease + timing.heartbeat_s) if trigger == "lost" else 0.0
        return pause, {"trigger": trigger, "slot": slot, "few": rng.randint(1, few)}
    if kind == "ambiguous":
        stop_at = 0.5
        start_at = round(stop_at + bounds.stop_s + 1.0, 1)
        # Every request may lose its answer; the ownership writes (the router's STOP and
        # START among them) more often than the rest.
        share, writes = round(rng.uniform(0.05, 0.3), 2), round(rng.uniform(0.2, 0.6), 2)
        return max(r(lease, 1.5 * lease), round(start_at + 1.0, 1)), {
            "share": share, "writes": writes, "streams": _streams(rng, connections, few), "stop_at_s": stop_at,
            "start_at_s": start_at}
    if kind == "flip":
        return 0.0, {"streams": _streams(rng, connections, few), "gap_s": round(rng.uniform(0, 0.1), 3)}
    if kind in PROCESS:
        # At most one clock is off at a time, so no two workers disagree by more than
        # the skew margin: a clock fault goes to the slot already skewed, if any.
        if kind == "clock" and slots.skewed is not None:
            slot = slots.skewed
        else:
            slot = rng.choice(slots.settled(t, bounds) or list(range(len(slots.opened))))
        if kind == "kill":
            return r(0, bounds.takeover_s), {"slot": slot}
        if kind == "pause":
            return r(lease + timing.heartbeat_s, 1.5 * lease + timing.heartbeat_s), {"slot": slot}
        if kind == "term":
            return 0.0, {"slot": slot}
        if kind == "drain_term":
            return r(0.5 * bounds.takeover_s, bounds.takeover_s), {"slot": slot}
        if kind == "burst_term":
            least = min(3, connections)  # a burst: several STARTs in flight at once
            streams = sorted(rng.sample(range(connections), rng.randint(least, max(least, connections // 2))))
            return round(bounds.stop_s + 0.5, 1), {
                "slot": slot, "streams": streams, "threads": 4, "term_after": rng.randint(1, max(1, len(streams) - 1))}
        offset = rng.choice((-1, 1)) * rng.randint(round(0.3 * timing.skew_ms), timing.skew_ms)
        return 0.0, {"slot": slot, "offset_ms": offset}
    if kind == "storm":
        flaps = rng.randint(0, 2)
        gaps = [r(0, 1) for _ in range(2 * flaps)]
        hold = r(bounds.stop_s + 1, bounds.stop_s + 1 + 0.5 * lease)
        streams = _streams(rng, connections, max(1, connections // 2))
        return round(sum(gaps) + hold, 1), {"streams": streams, "flaps": flaps, "gaps_s": gaps, "hold_s": hold}
    raise ValueError(f"unknown fault kind {kind!r}")
