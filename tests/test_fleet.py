"""The fleet as real processes: workers (``python -m wsfleet.worker``) crash, leave, freeze
and come back while the upstream's socket books and the messages table are watched.

Fast timings (session lease 3 s, heartbeat 0.75 s, reconcile 1 s, skew 200 ms,
checkpoint 1 s) and a few connections keep every test to seconds; one emulator process
serves every test (tests/conftest.py), each test has tables, queue, upstream, API and workers of its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sim import report
from wsfleet.cli import main as cli_main
from wsfleet.leases import SessionTiming
from sim.chaos.checker import IN_FLIGHT_AFTER_RESUME_S
from sim.chaos.workers import FAKETIME_LIB
from sim.chaos.workers import clock_off_by as chaos_clock_off_by
from sim.fleet import Fleet
from sim.observed import SessionState, reachability_violations
from sim.processes import eventually
from sim.timing import Timing
from wsfleet.worker.takeover import RING_REFRESH_S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TIMING = Timing(lease_s=3.0, heartbeat_s=0.75, reconcile_s=1.0, skew_ms=200, flush_ms=500, shutdown_s=5.0, checkpoint_s=1.0)
RATE = 5.0  # messages per second per stream
GAVE_UP = ("deadline_passed_before_release", "connection_dropped")  # a runner's end without a release
# Polls that read the tables (a Scan of each, some 30 ms of CPU between this process and
# the emulator) look four times a second, not ten: the fleet under test needs the cores.
SCAN_POLL_S = 0.25


@pytest.fixture(scope="module")
def backend(emulator):
    """The emulator process the slow tests of this pytest process share (tests/conftest.py)."""
    return emulator


# Samples of ownership (a Scan of both tables every 0.25 s, a sixth of a fleet test's
# CPU) are taken only for the tests that judge reachability by them; the others judge
# by the upstream's books, the tables and the workers' logs.
SAMPLED = "sampled"


@pytest.fixture
def fleet(backend, tmp_path, request: pytest.FixtureRequest):
    interval = 0.25 if request.node.get_closest_marker(SAMPLED) else None
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=RATE, emulator=backend, sample_interval=interval) as f:
        yield f


def unreachable(fleet: Fleet) -> list[tuple[float, str, str]]:
    """Reachability violations in the fleet's samples (only a ``sampled`` test has any:
    none would pass for none found). On a loaded machine a Scan of both tables can take
    longer than the sampling interval, so a test that ends quickly may have few samples
    yet: it waits (with a deadline) for enough of them, which also judges the end state a
    little longer."""
    assert fleet.samples is not None and fleet.sample_interval, "no samples to judge: mark the test @pytest.mark.sampled"
    eventually(lambda: len(fleet.samples) > 10, 30, "ten ownership samples", interval=0.25)
    return reachability_violations(fleet.samples)


def start_workers(fleet: Fleet, *names: str) -> None:
    for name in names:
        fleet.start_worker(name, wait=False)
    for name in names:
        fleet.wait_started(name)


def start_connections(fleet: Fleet, n: int, *, storing: int = 3) -> list[str]:
    """START n connections, then wait until each is connected and has checkpointed a few messages."""
    ids = [f"c{i}" for i in range(1, n + 1)]
    for cid in ids:
        assert fleet.start_connection(cid) == 202
    fleet.wait_connected(ids, timeout=15)
    eventually(
        lambda: all(c.last_seq >= storing for c in fleet.scan().values()), 15, f"{storing} messages checkpointed each", interval=SCAN_POLL_S
    )
    return ids


def watched_by_all(fleet: Fleet, timing: Timing = TIMING) -> None:
    """Until every worker is watched. A worker that opens a session announces itself to
    its predecessors in the ring, who learn it from their next renewal and read their
    successors at their next watch pass; a crash bound holds from then on. No log line
    shows that read: this waits for the time it takes after the last session opened (a
    heartbeat, plus the longest pause between two watch passes, plus room)."""
    st = SessionTiming(round(timing.lease_s * 1000), round(timing.heartbeat_s * 1000), timing.skew_ms)
    last = max(e["ts"] for name in fleet.live_workers() for e in fleet.events(name) if e["event"] == "session_opened")
    settled = last + timing.heartbeat_s + 0.85 * st.watch_window_ms() / 1000 + 1.0
    eventually(lambda: time.time() >= settled, 30, "every worker to be watched", interval=0.25)


def stored_more(fleet: Fleet, marks: dict[str, int], more: float) -> bool:
    """Whether each connection of ``marks`` has checkpointed ``more`` past its mark (one read of the table)."""
    states = fleet.scan()
    return all(states[c].last_seq >= mark + more for c, mark in marks.items())


def busiest(fleet: Fleet) -> tuple[str, set[str]]:
    owned = {name: fleet.owned_by(name) for name in fleet.live_workers()}
    name = max(owned, key=lambda n: len(owned[n]))
    assert owned[name], owned
    return name, owned[name]


def wait_taken_over(fleet: Fleet, event: report.Event, timeout: float) -> report.Outcome:
    """Until every affected connection has a new socket and a live owner other than the victim."""

    def done() -> report.Outcome | None:
        outcome = report.measure(event, {c: fleet.upstream.sockets(c) for c in event.affected}, fleet.samples)
        if outcome.pending:
            return None
        states = fleet.scan()
        now = int(time.time() * 1000)
        owners = {states[c].owned_at(now) for c in event.affected}
        return outcome if owners <= set(fleet.live_workers()) - {event.victim} else None

    return eventually(done, timeout, f"takeover after {event.label}", interval=0.1)


def stop_all_and_audit(fleet: Fleet, ids: list[str]) -> None:
    """STOP everything, wait until closed and released, then every connection must hold
    exactly seqs 1..checkpoint, as many as the upstream delivered."""
    for cid in ids:
        fleet.stop_connection(cid)
    fleet.wait_quiet(ids, timeout=TIMING.stop_bound_s + TIMING.lease_s + 5)
    audits = fleet.audit(ids)
    # An owner whose session's deadline passed first (a starved machine) writes nothing
    # more, its release included; its last batch may have landed: gap-free past the checkpoint.
    events = [e for n in fleet.workers for e in fleet.events(n)]  # each worker's log parsed once
    gave_up = {e["connection_id"] for e in events if e["event"] in GAVE_UP}
    bad = [a for a in audits if not (a.ok or (a.connection_id in gave_up and a.gap_free))]
    assert bad == [], [(a, [e for e in events if e.get("connection_id") == a.connection_id]) for a in bad]
    for a in audits:
        assert a.first == 1 and a.rows == a.last
        # Every frame the upstream sent is stored, except the few in flight when STOP
        # closed the socket (never acknowledged; a START resumes from the checkpoint),
        # and, for an owner that gave up (its session past its deadline on a starved
        # machine), what it had received unstored: its successor resumed from the
        # checkpoint, and the STOP may come before it reaches them again.
        most = a.delivered if a.connection_id in gave_up else a.rows + RATE * 2
        assert a.rows <= a.delivered <= most, a


def live_session(fleet: Fleet, name: str) -> tuple[str, SessionState]:
    """The session worker ``name`` holds now (its newest LIVE one)."""
    live = [(sid, s) for sid, s in fleet.sessions_of(name).items() if s.state == "LIVE"]
    assert live, f"{name} has no live session: {fleet.sessions_of(name)}"
    return max(live, key=lambda item: item[1].started_at_ms)


def test_a_crashed_workers_connections_are_taken_over_once_its_session_expires_within_lease_plus_skew_and_slack(fleet):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 9)
    watched_by_all(fleet)
    victim, affected = busiest(fleet)
    dead_id, _ = live_session(fleet, victim)

    at = fleet.kill(victim)
    event = report.Event(report.CRASH, f"kill -9 {victim}", at, dict.fromkeys(affected, at), TIMING.crash_bound_s, victim)
    outcome = wait_taken_over(fleet, event, TIMING.crash_bound_s + 10)

    assert outcome.max <= TIMING.crash_bound_s, outcome.took_s
    dead = fleet.sessions()[dead_id]
    # A peer ended it (the dead can end nothing), and only once it was past its expiry
    # by the skew margin: no successor socket opened before that.
    assert dead.state == "ENDED" and dead.ended_by in {sid for n in fleet.live_workers() for sid in fleet.sessions_of(n)}
    for cid in affected:
        successor = next(r for r in fleet.upstream.sockets(cid) if r.opened_at >= at)
        assert successor.opened_at * 1000 > dead.expires_at_ms + TIMING.skew_ms, (cid, successor.opened_at, dead)
    assert not any(c.session == dead_id for c in fleet.scan().values())
    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)


def test_a_terminated_worker_hands_its_connections_over_well_before_its_lease_would_expire(fleet):
    start_workers(fleet, "w1", "w2")
    ids = start_connections(fleet, 8)
    victim, affected = busiest(fleet)
    start_workers(fleet, "w3")  # the replacement of a rolling deploy comes up first

    at, status = fleet.terminate(victim, timeout=TIMING.shutdown_s + 5)
    event = report.Event(report.DEPLOY, f"SIGTERM {victim}", at, dict.fromkeys(affected, at), TIMING.graceful_bound_s, victim)
    outcome = wait_taken_over(fleet, event, TIMING.lease_s + 10)

    assert status == 0
    # Handed over, not taken over: a takeover cannot begin before the lease and the skew
    # have run out (3.2 s here). The handoff's own target (p99 under 1 s at the defaults)
    # is the failover benchmark's to show; on a loaded 2-core CI machine this fleet's
    # handoffs took up to 1.88 s (once in six fresh-clone runs), so the test allows a
    # heartbeat less than a lease rather than graceful_bound_s (1.5 s).
    assert outcome.max < TIMING.lease_s - TIMING.heartbeat_s, outcome.took_s
    released = {e["connection_id"] for e in fleet.events(victim) if e["event"] == "lease_released"}
    assert released == affected
    # Everything released, it ended its own session: nobody had to wait for it to expire.
    assert {(s.state, s.ended_by) for s in fleet.sessions_of(victim).values()} == {("ENDED", victim)}
    assert fleet.upstream.overlaps() == []  # closed before released, so never two sockets
    stop_all_and_audit(fleet, ids)


@pytest.mark.sampled
def test_sigterm_during_a_start_burst_leaves_every_connection_reachable_and_soon_owned(fleet):
    # Acquisitions in flight when SIGTERM arrives land on a session that is about to
    # end, with no runner to hold them: the leaving worker frees them before its session
    # leaves the ring (or leaves it in the ring for its watchers), never in between.
    start_workers(fleet, "w1", "w2")
    ids = [f"b{i}" for i in range(1, 41)]
    with ThreadPoolExecutor(8) as pool:  # STARTs arrive eight at a time, as from a busy caller
        first = list(pool.map(fleet.start_connection, ids[:16]))
        rest = pool.map(fleet.start_connection, ids[16:])
        fleet.terminate("w1", timeout=TIMING.shutdown_s + 5)  # mid-burst, acquisitions in flight
        assert first + list(rest) == [202] * len(ids)

    # Room for w2 to lose its session to slow renewals and take everything back from it
    # (twice on a loaded 2-core machine: a 3-s lease against the one-lock emulator), the
    # invariant being that nothing is left unreachable, not how fast.
    fleet.wait_connected(ids, timeout=TIMING.graceful_bound_s + 2 * TIMING.reconcile_s + 3 * TIMING.lease_s + 20)
    assert fleet.owned_by("w2") == set(ids)
    assert unreachable(fleet) == []
    # Drained: out of the ring. Its last handoffs' takers may still have been on their way
    # when it ended its session, which then stays in the ring for its watchers, who leave it
    # once they read it empty twice (1.4 s after every connection was held, on a loaded
    # 2-core machine): a lease is room enough.
    eventually(
        lambda: {s.in_ring for s in fleet.sessions_of("w1").values()} == {False},
        TIMING.lease_s,
        "w1's session out of the ring",
        interval=0.1,
    )
    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)


@pytest.mark.sampled
def test_sigterm_of_the_worker_draining_a_dead_workers_session_leaves_nothing_unreachable(fleet):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 12)
    watched_by_all(fleet)
    victim, affected = busiest(fleet)
    others = [n for n in ("w1", "w2", "w3") if n != victim]
    killed_at = fleet.kill(victim)

    def drainer() -> str | None:
        return next((n for n in others if any(e["event"] == "session_ended_dead" for e in fleet.events(n))), None)

    draining = eventually(drainer, TIMING.crash_bound_s + 5, "a watcher to end the dead session", interval=0.05)
    fleet.terminate(draining, timeout=TIMING.shutdown_s + 5)  # while it drains
    survivor = next(n for n in others if n != draining)

    fleet.wait_connected(ids, timeout=TIMING.crash_bound_s + TIMING.lease_s + 10)
    assert fleet.owned_by(survivor) == set(ids)
    assert unreachable(fleet) == []
    assert time.time() - killed_at < 60
    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)


def test_messages_stay_gap_free_through_a_crash_a_handoff_and_a_second_crash(fleet):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 9)
    for step, act in enumerate(("kill", "terminate", "kill")):
        victim, affected = busiest(fleet)
        start_workers(fleet, f"w{4 + step}")  # keep three alive
        at = fleet.kill(victim) if act == "kill" else fleet.terminate(victim)[0]
        event = report.Event(report.CRASH, f"{act} {victim}", at, dict.fromkeys(affected, at), None, victim)
        # About data, not timing: the victim may have joined too recently to be watched yet.
        wait_taken_over(fleet, event, TIMING.crash_bound_s + RING_REFRESH_S + 10)

    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)


def victims_rows(fleet: Fleet, victim: str, connection_ids) -> dict[str, dict[int, tuple[int, int]]]:
    """seq -> (fence, received_at_ms) of every row ``victim`` wrote, per connection."""
    return {
        c: {r["sk"]: (r["fence_token"], r["received_at_ms"]) for r in fleet.messages(c) if r["worker_id"] == victim}
        for c in connection_ids
    }


def late_rows(before: dict, after: dict) -> dict[str, list[int]]:
    """Per connection, the seqs whose row (as :func:`victims_rows` shows it) changed."""
    return {c: late for c in after if (late := sorted(s for s in after[c] if after[c][s] != before[c].get(s)))}


def in_flight_at_the_freeze(fleet: Fleet, victim: str, connection_ids, before: dict, paused_at: float, resumed_at: float) -> dict:
    """``victim``'s rows once a request it had in flight when it froze has surely landed:
    past its last deadline check, a request can still be frozen in the few bytecodes
    before the send system call, and it goes out as the process wakes. What changed
    since ``before`` (taken while it was frozen) must be only that: frames received
    before the freeze (the same data its successor stores, which the final audit checks),
    landed by IN_FLIGHT_AFTER_RESUME_S after the SIGCONT (the chaos checker's rule)."""
    time.sleep(max(0.0, resumed_at + IN_FLIGHT_AFTER_RESUME_S - time.time()))
    woke = victims_rows(fleet, victim, connection_ids)
    late = {c: {s: woke[c][s] for s in seqs} for c, seqs in late_rows(before, woke).items()}
    assert all(received <= paused_at * 1000 + 5 for rows in late.values() for _, received in rows.values()), late
    return woke


def test_a_worker_paused_past_its_lease_writes_nothing_more_and_comes_back_with_a_new_session(fleet):
    start_workers(fleet, "w1", "w2")
    ids = start_connections(fleet, 6)
    watched_by_all(fleet)
    victim, affected = busiest(fleet)
    (other,) = set(fleet.live_workers()) - {victim}
    old_session, _ = live_session(fleet, victim)
    opened = len([e for e in fleet.events(victim) if e["event"] == "session_opened"])

    paused_at = fleet.pause(victim)
    event = report.Event(report.PAUSE, f"SIGSTOP {victim}", paused_at, dict.fromkeys(affected, paused_at), TIMING.crash_bound_s, victim)
    outcome = wait_taken_over(fleet, event, TIMING.crash_bound_s + 10)
    assert outcome.max <= TIMING.crash_bound_s, outcome.took_s
    assert fleet.sessions()[old_session].state == "ENDED"  # ended by its watcher, never to be renewed

    before = victims_rows(fleet, victim, affected)
    successor_fences = {c: fleet.scan()[c].fence_token for c in affected}
    event.until = fleet.resume(victim)

    # It finds its session lost, drops every connection (closing its frozen sockets)...
    eventually(
        lambda: affected <= {e.get("connection_id") for e in fleet.events(victim) if e["event"] == "connection_dropped"},
        10, f"{victim} to drop its connections",
    )
    frozen = {(c, r.id) for c in affected for r in fleet.upstream.sockets(c) if r.opened_at < paused_at}
    assert frozen
    eventually(  # the books are read again each time: sockets() answers copies
        lambda: all(r.closed_at for c in affected for r in fleet.upstream.sockets(c) if (c, r.id) in frozen),
        10,
        "the frozen sockets to close",
    )
    # ...and opens a NEW session, in its log and in the sessions table.
    new_session = eventually(
        lambda: [e["session_id"] for e in fleet.events(victim) if e["event"] == "session_opened"][opened:], 10, "a new session"
    )[-1]
    assert new_session != old_session
    assert fleet.sessions()[new_session].live_at(int(time.time() * 1000))
    woke = in_flight_at_the_freeze(fleet, victim, affected, before, paused_at, event.until)
    # Let every successor write a few more batches: any late write of the victim would land by then.
    marks = {c: s.last_seq for c, s in fleet.scan().items() if c in affected}
    eventually(lambda: stored_more(fleet, marks, 2 * RATE), 10, "the successors to store more", interval=SCAN_POLL_S)

    after = victims_rows(fleet, victim, affected)
    # Nothing the victim received after its pause began was ever written...
    assert all(received <= paused_at * 1000 + 5 for rows in after.values() for _, received in rows.values())
    # ...and nothing it had decided to write before the freeze went out once it was awake
    # (the deadline is checked as each request leaves: wsfleet.aws.send_deadline)...
    assert after == woke, f"{victim} wrote after it woke up: {late_rows(woke, after)}"
    # ...and every row it wrote carries an older fence than its successor's.
    assert all(fence < successor_fences[c] for c in affected for fence, _ in after[c].values())
    for cid in affected:
        assert fleet.scan()[cid].fence_token == successor_fences[cid]  # the victim never took it back
    # The only overlaps are the frozen sockets, and they ended once the victim woke up.
    assert all(report.excused(o, [event]) for o in fleet.upstream.overlaps())
    assert all(o.ended_at is not None for o in fleet.upstream.overlaps())

    # Under its new session it takes connections again: the other worker crashes, and
    # the resumed one takes everything over.
    killed_at = fleet.kill(other)
    held = fleet.owned_by(other) | set(ids) - affected
    crash = report.Event(report.CRASH, f"kill -9 {other}", killed_at, dict.fromkeys(held, killed_at), TIMING.crash_bound_s, other)
    wait_taken_over(fleet, crash, TIMING.crash_bound_s + 10)
    assert {c.session for c in fleet.scan().values()} == {new_session}
    assert [o for o in fleet.upstream.overlaps() if not report.excused(o, [event])] == []
    stop_all_and_audit(fleet, ids)


def test_start_reaches_a_connected_socket_quickly_and_a_repeated_start_never_opens_a_second_socket(fleet):
    start_workers(fleet, "w1", "w2")
    sent = time.time()
    assert fleet.start_connection("a") == 202
    eventually(lambda: fleet.upstream.sockets("a"), TIMING.start_bound_s + 5, "a socket for a")
    assert fleet.upstream.sockets("a")[0].opened_at - sent < TIMING.start_bound_s
    eventually(lambda: fleet.get_connection("a")[1].get("lease_owner"), 5, "an owner")
    _, state = fleet.get_connection("a")

    for _ in range(3):
        assert fleet.start_connection("a") == 200
    # More checkpoints by the same owner: nothing was reset, nobody else connected.
    eventually(lambda: fleet.get_connection("a")[1]["last_seq"] >= state["last_seq"] + 2 * RATE, 10, "more messages checkpointed")
    _, after = fleet.get_connection("a")
    assert (after["lease_owner"], after["fence_token"]) == (state["lease_owner"], state["fence_token"])
    assert len(fleet.upstream.sockets("a")) == 1
    stop_all_and_audit(fleet, ["a"])


def test_stop_closes_the_socket_and_releases_the_lease_within_a_heartbeat(fleet, capsys):
    start_workers(fleet, "w1", "w2")
    start_connections(fleet, 2)

    stopped_at = time.time()
    assert fleet.stop_connection("c1") == 202
    eventually(lambda: not fleet.upstream.open_sockets("c1"), TIMING.stop_bound_s + 5, "the socket to close")
    (socket,) = fleet.upstream.sockets("c1")
    assert socket.closed_at - stopped_at < TIMING.stop_bound_s
    status, state = fleet.get_connection("c1")
    assert status == 200 and state["desired_state"] == "STOPPED"
    eventually(lambda: fleet.get_connection("c1")[1]["lease_owner"] == "", 5, "the lease to be released")
    assert fleet.stop_connection("c1") == 200
    assert fleet.upstream.open_sockets("c2")  # the other one carries on
    # `wsfleet logs c1 --run-dir` reads the run's own files: its owner's lines of it, in time order.
    capsys.readouterr()
    assert cli_main(["logs", "c1", "--run-dir", str(fleet.run_dir), "--json"], env={}) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    events = [line["event"] for line in lines]
    assert {line["connection_id"] for line in lines} == {"c1"} and lines == sorted(lines, key=lambda line: line["ts"])
    assert "lease_acquired" in events and "connection_ended" in events
    assert events.index("lease_acquired") < events.index("connection_ended")
    stop_all_and_audit(fleet, ["c1", "c2"])


# --- wall clocks that disagree -------------------------------------------------------------

CLOCK_OFF_S = 0.45  # each way: the two workers' clocks disagree by 0.9 s, under the 1 s margin


def clock_off_by(offset_s: float) -> dict[str, str]:
    """Environment that runs a worker with its wall clock ``offset_s`` off (libfaketime;
    see sim.chaos.nemesis.clock_off_by for why its monotonic clock moves too)."""
    assert FAKETIME_LIB is not None
    return chaos_clock_off_by(round(offset_s * 1000))


def fences_never_go_back(fleet: Fleet, connection_ids) -> dict[str, list[int]]:
    """Per connection, the seqs stored with an older fence than a lower seq: a write by an
    owner that had already been superseded (empty when none)."""
    out = {}
    for cid in connection_ids:
        highest, back = 0, []
        for row in sorted(fleet.messages(cid), key=lambda r: r["sk"]):
            if row["fence_token"] < highest:
                back.append(row["sk"])
            highest = max(highest, row["fence_token"])
        out[cid] = back
    return {c: b for c, b in out.items() if b}


@pytest.mark.skipif(FAKETIME_LIB is None, reason="needs libfaketime (Debian: apt-get install faketime; make test installs it)")
def test_workers_whose_wall_clocks_disagree_by_less_than_the_skew_margin_never_overlap_lose_or_double(backend, tmp_path):
    # A skew margin of a second needs a longer lease than TIMING's, or a renewal slowed
    # by a busy machine would run into the deadline (lease - skew after the last one).
    timing = dataclasses.replace(TIMING, lease_s=6.0, heartbeat_s=1.5, skew_ms=1000)
    off_ms = CLOCK_OFF_S * 1000
    with Fleet(run_dir=tmp_path, timing=timing, rate=RATE, emulator=backend, sample_interval=None) as fleet:
        # The one behind takes every connection; the one ahead joins afterwards.
        fleet.start_worker("behind", **clock_off_by(-CLOCK_OFF_S))
        ids = start_connections(fleet, 8)
        fleet.start_worker("ahead", **clock_off_by(+CLOCK_OFF_S))
        watched_by_all(fleet, timing)

        # The clocks are off as asked: each session's last renewal, stamped by its worker,
        # against this process's clock.
        now = int(time.time() * 1000)
        (behind_session, behind), (_, ahead) = live_session(fleet, "behind"), live_session(fleet, "ahead")
        assert behind.heartbeat_at_ms < now - off_ms + 100, (behind, now)
        assert ahead.heartbeat_at_ms > now + off_ms - timing.heartbeat_s * 1000 - 500, (ahead, now)

        # Freeze the one whose clock is behind: its session looks expired early to the one ahead.
        victim_holds = fleet.owned_by("behind")
        assert victim_holds, "behind holds nothing to take over"
        opened = len([e for e in fleet.events("behind") if e["event"] == "session_opened"])
        paused_at = fleet.pause("behind")
        pause = report.Event(report.PAUSE, "SIGSTOP behind", paused_at, dict.fromkeys(victim_holds, paused_at), timing.crash_bound_s, "behind")
        wait_taken_over(fleet, pause, timing.crash_bound_s + 10)
        frozen = fleet.sessions()[behind_session]
        # Nobody connected before the frozen worker's own deadline had passed: at the
        # latest its last renewal (stamped off_ms early) plus the lease, less the margin.
        for cid in victim_holds:
            successor = next(r for r in fleet.upstream.sockets(cid) if r.opened_at >= paused_at)
            assert successor.opened_at * 1000 > frozen.heartbeat_at_ms + off_ms + timing.lease_s * 1000 - timing.skew_ms, (
                cid, successor, frozen,
            )
        successor_fences = {c: fleet.scan()[c].fence_token for c in victim_holds}
        before = victims_rows(fleet, "behind", victim_holds)  # what it wrote before it froze
        pause.until = fleet.resume("behind")
        eventually(
            lambda: len([e for e in fleet.events("behind") if e["event"] == "session_opened"]) > opened, 10, "behind's new session"
        )
        woke = in_flight_at_the_freeze(fleet, "behind", victim_holds, before, paused_at, pause.until)
        marks = {c: s.last_seq for c, s in fleet.scan().items() if c in victim_holds}
        eventually(lambda: stored_more(fleet, marks, 2 * RATE), 10, "the successors to store more", interval=SCAN_POLL_S)
        after = victims_rows(fleet, "behind", victim_holds)
        assert after == woke, f"the frozen worker wrote after it woke up: {late_rows(woke, after)}"
        assert all(fence < successor_fences[c] for c in victim_holds for fence, _ in after[c].values())

        # Now the one ahead dies, and the one behind (under a new session) takes it all:
        # it sees the dead session expire late, never early.
        ahead_session, _ = live_session(fleet, "ahead")
        holds = fleet.owned_by("ahead")
        killed_at = fleet.kill("ahead")
        crash = report.Event(report.CRASH, "kill -9 ahead", killed_at, dict.fromkeys(holds, killed_at), timing.crash_bound_s, "ahead")
        outcome = wait_taken_over(fleet, crash, timing.crash_bound_s + 2 * CLOCK_OFF_S + 10)
        assert outcome.max <= timing.crash_bound_s + 2 * CLOCK_OFF_S, outcome.took_s
        dead = fleet.sessions()[ahead_session]
        for cid in holds:
            successor = next(r for r in fleet.upstream.sockets(cid) if r.opened_at >= killed_at)
            assert successor.opened_at * 1000 > dead.heartbeat_at_ms - off_ms + timing.lease_s * 1000 - timing.skew_ms

        # Two sockets on one stream only while the frozen worker's kernel kept its socket open.
        assert all(report.excused(o, [pause]) for o in fleet.upstream.overlaps())
        assert fences_never_go_back(fleet, ids) == {}
        stop_all_and_audit(fleet, ids)
