"""The deadline clock counts time the machine spends suspended (CLOCK_BOOTTIME), so a
worker that wakes up from a suspension longer than its lease knows its session is gone
and writes nothing, whatever its monotonic clock says."""

from __future__ import annotations

import time

import pytest

from wsfleet import clock
from wsfleet.aws import SendDeadlinePassed, _refuse_after_deadline, send_deadline
from wsfleet.leases import SessionTiming
from wsfleet.logs import JsonLogger
from wsfleet.worker.session import SessionKeeper

pytestmark = pytest.mark.skipif(not clock.counts_suspended_time(), reason="no CLOCK_BOOTTIME on this platform")


@pytest.fixture
def suspended(monkeypatch):
    """``suspend(s)``: as if the machine had slept ``s`` seconds just now: CLOCK_BOOTTIME
    moves on, CLOCK_MONOTONIC does not (what Linux does across a VM or laptop suspend)."""
    real = time.clock_gettime
    slept = [0.0]

    def clock_gettime(clk_id: int) -> float:
        return real(clk_id) + (slept[0] if clk_id == time.CLOCK_BOOTTIME else 0.0)

    monkeypatch.setattr(time, "clock_gettime", clock_gettime)

    def suspend(seconds: float) -> None:
        slept[0] += seconds

    return suspend


def test_the_deadline_clock_is_boottime():
    assert abs(clock.now() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 0.05


def test_a_session_whose_worker_slept_past_its_deadline_is_no_longer_live(suspended):
    keeper = SessionKeeper(
        sessions=None,  # never called: liveness is the keeper's own reckoning
        worker_id="w1",
        timing=SessionTiming(10_000, 2_500, 1_000),
        max_connections=1,
        call=None,
        log=JsonLogger(),
        active=lambda: 0,
        on_stops=lambda stops: None,
    )
    keeper.session_id = "w1#1"
    keeper.deadline_mono = keeper.timing.deadline_mono(clock.now())  # renewed just now: 9 s to go
    assert keeper.live()

    suspended(30)  # the VM slept for 30 s; time.monotonic() did not move

    assert not keeper.live() and keeper.deadline_for("w1#1") < clock.now()


def test_a_write_decided_before_a_suspension_is_refused_after_it(suspended):
    with send_deadline(clock.now() + 5):
        _refuse_after_deadline()  # in time: goes
        suspended(30)
        with pytest.raises(SendDeadlinePassed):
            _refuse_after_deadline()
