"""The fleet as real processes: workers (``python -m wsfleet.worker``) crash, leave, freeze
and come back while the upstream's socket books and the messages table are watched.

Fast timings (lease 3 s, heartbeat 0.75 s, reconcile 1 s, skew 200 ms) and a few
connections keep every test to seconds; one emulator process serves the whole module,
each test has tables, queue, upstream, API and workers of its own.
"""

from __future__ import annotations

import time

import pytest

from wsfleet.local import report
from wsfleet.local.fleet import EmulatorProcess, Fleet, Timing, eventually

pytestmark = pytest.mark.timeout(120)

TIMING = Timing(lease_s=3.0, heartbeat_s=0.75, reconcile_s=1.0, skew_ms=200, flush_ms=500, shutdown_s=5.0)
RATE = 5.0  # messages per second per stream


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    with EmulatorProcess(tmp_path_factory.mktemp("backend") / "emulator.log") as emulator:
        yield emulator


@pytest.fixture
def fleet(backend, tmp_path):
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=RATE, emulator=backend, sample_interval=0.25) as f:
        yield f


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
    eventually(lambda: all(c.last_seq >= storing for c in fleet.scan().values()), 15, f"{storing} messages checkpointed each")
    return ids


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
    assert [a for a in audits if not a.ok] == []
    for a in audits:
        assert a.first == 1 and a.rows == a.checkpoint
        # Every frame the upstream sent is stored, except the few in flight when STOP
        # closed the socket (never acknowledged; a START resumes from the checkpoint).
        assert a.rows <= a.delivered <= a.rows + RATE * 2, a


def test_a_crashed_workers_connections_are_taken_over_after_its_lease_expires_within_lease_plus_reconcile(fleet):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 9)
    victim, affected = busiest(fleet)
    expiries = {c: s.expires_at_ms for c, s in fleet.scan().items() if c in affected}

    at = fleet.kill(victim)
    event = report.Event(report.CRASH, f"kill -9 {victim}", at, dict.fromkeys(affected, at), TIMING.crash_bound_s, victim)
    outcome = wait_taken_over(fleet, event, TIMING.crash_bound_s + 10)

    assert outcome.max <= TIMING.crash_bound_s, outcome.took_s
    for cid in affected:
        successor = next(r for r in fleet.upstream.sockets(cid) if r.opened_at >= at)
        # Never before the dead worker's lease (plus the skew margin) ran out.
        assert successor.opened_at * 1000 > expiries[cid] + TIMING.skew_ms, (cid, successor.opened_at, expiries[cid])
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
    assert outcome.max < TIMING.graceful_bound_s < TIMING.lease_s, outcome.took_s
    released = {e["connection_id"] for e in fleet.events(victim) if e["event"] == "lease_released"}
    assert released == affected
    assert fleet.upstream.overlaps() == []  # closed before released, so never two sockets
    stop_all_and_audit(fleet, ids)


def test_messages_stay_gap_free_through_a_crash_a_handoff_and_a_second_crash(fleet):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 9)
    for step, act in enumerate(("kill", "terminate", "kill")):
        victim, affected = busiest(fleet)
        start_workers(fleet, f"w{4 + step}")  # keep three alive
        at = fleet.kill(victim) if act == "kill" else fleet.terminate(victim)[0]
        event = report.Event(report.CRASH, f"{act} {victim}", at, dict.fromkeys(affected, at), None, victim)
        wait_taken_over(fleet, event, TIMING.crash_bound_s + 10)

    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)


def test_a_worker_paused_past_its_lease_writes_nothing_more_and_gives_its_connections_up(fleet):
    start_workers(fleet, "w1", "w2")
    ids = start_connections(fleet, 6)
    victim, affected = busiest(fleet)

    paused_at = fleet.pause(victim)
    event = report.Event(report.PAUSE, f"SIGSTOP {victim}", paused_at, dict.fromkeys(affected, paused_at), TIMING.crash_bound_s, victim)
    outcome = wait_taken_over(fleet, event, TIMING.crash_bound_s + 10)
    assert outcome.max <= TIMING.crash_bound_s, outcome.took_s

    def victims_rows() -> dict[str, dict[int, tuple[int, int]]]:
        """seq -> (fence, received_at_ms) of every row the victim wrote, per moved connection."""
        return {
            c: {r["sk"]: (r["fence_token"], r["received_at_ms"]) for r in fleet.messages(c) if r["worker_id"] == victim}
            for c in affected
        }

    before = victims_rows()
    successor_fences = {c: fleet.scan()[c].fence_token for c in affected}
    event.until = fleet.resume(victim)

    gave_up = {"lease_expired", "lease_lost", "lease_expired_while_writing"}
    eventually(
        lambda: affected <= {e.get("connection_id") for e in fleet.events(victim) if e["event"] in gave_up},
        10, f"{victim} to give its connections up",
    )
    frozen = [r for c in affected for r in fleet.upstream.sockets(c) if r.opened_at < paused_at]
    assert frozen
    eventually(lambda: all(r.closed_at for c in affected for r in fleet.upstream.sockets(c) if r.opened_at < paused_at), 10, "the frozen sockets to close")
    # Let every successor write a few more batches: any late write of the victim would land by then.
    marks = {c: s.last_seq for c, s in fleet.scan().items() if c in affected}
    eventually(lambda: all(fleet.scan()[c].last_seq >= marks[c] + 2 * RATE for c in affected), 10, "the successors to store more")

    after = victims_rows()
    # Nothing the victim received after its pause began was ever written...
    assert all(received <= paused_at * 1000 + 5 for rows in after.values() for _, received in rows.values())
    # ...and nothing it had decided to write before the freeze went out after it: the
    # deadline is checked as each request leaves (wsfleet.aws.send_deadline).
    late = {c: sorted(s for s in after[c] if after[c][s] != before[c].get(s)) for c in affected}
    assert not any(late.values()), f"{victim} wrote after a successor took over: {late}"
    for cid in affected:
        assert fleet.scan()[cid].fence_token == successor_fences[cid]  # the victim never took it back
    # The only overlaps are the frozen sockets, and they ended once the victim woke up.
    assert all(report.excused(o, [event]) for o in fleet.upstream.overlaps())
    assert all(o.ended_at is not None for o in fleet.upstream.overlaps())
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
    # Two more renewals by the same owner: nothing was reset, nobody else connected.
    eventually(lambda: fleet.get_connection("a")[1]["last_seq"] >= state["last_seq"] + 2 * RATE, 10, "more messages checkpointed")
    _, after = fleet.get_connection("a")
    assert (after["lease_owner"], after["fence_token"]) == (state["lease_owner"], state["fence_token"])
    assert len(fleet.upstream.sockets("a")) == 1
    stop_all_and_audit(fleet, ["a"])


def test_stop_closes_the_socket_and_releases_the_lease_within_a_heartbeat(fleet):
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
    stop_all_and_audit(fleet, ["c1", "c2"])
