"""Named moves in a fleet of real worker processes, against the emulator whose START
queue has the stack's dead-letter rule (a hint received five times without a delete
moves to the dead-letter queue): a crash's connections planned for survivors are
assigned to their sessions, a rolling deploy's SIGTERM hands over through anonymous
hints, and no hint reaches the dead-letter queue. Fast timings as in test_fleet.py."""

from __future__ import annotations

import pytest

from sim import report
from sim.fleet import Fleet
from tests.test_fleet import TIMING, busiest, start_connections, start_workers, stop_all_and_audit, wait_taken_over, watched_by_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def backend(emulator):
    return emulator


@pytest.fixture
def fleet(backend, tmp_path):
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=5.0, emulator=backend, sample_interval=None) as f:
        yield f


def test_a_crash_then_a_rolling_deploy_leave_the_dead_letter_queue_empty(fleet):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 9)
    watched_by_all(fleet)

    victim, affected = busiest(fleet)
    at = fleet.kill(victim)
    crash = report.Event(report.CRASH, f"kill -9 {victim}", at, dict.fromkeys(affected, at), TIMING.crash_bound_s, victim)
    assert wait_taken_over(fleet, crash, TIMING.crash_bound_s + 10).max <= TIMING.crash_bound_s
    drains = [e for n in fleet.live_workers() for e in fleet.events(n) if e["event"] == "session_drain"]
    print("drains", [(e["acquired"], e["named"], e["hinted"]) for e in drains])
    assert sum(e["acquired"] + e["named"] + e["hinted"] for e in drains) >= len(affected), drains

    start_workers(fleet, "w4")  # the replacement of a rolling deploy comes up first
    leaving, handed = busiest(fleet)
    at, status = fleet.terminate(leaving, timeout=TIMING.shutdown_s + 5)
    deploy = report.Event(report.DEPLOY, f"SIGTERM {leaving}", at, dict.fromkeys(handed, at), TIMING.graceful_bound_s, leaving)
    assert status == 0
    assert wait_taken_over(fleet, deploy, TIMING.lease_s + 10).max < TIMING.lease_s

    assert fleet.dead_letters() == 0
    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)
    assert fleet.dead_letters() == 0
