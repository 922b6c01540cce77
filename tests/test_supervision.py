"""The supervisor every long-lived loop of the worker runs under: whatever a loop raises
is logged (with its traceback unless it is transient), counted in LoopErrors unless it
is transient, and the loop runs again after a backoff; a store call is tried again
until the deadline."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from wsfleet import clock
from wsfleet import metrics_names as names
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.sinks import InvalidItem
from wsfleet.store import TransientError
from wsfleet.worker.retry import LeaseExpired
from wsfleet.worker.supervision import LOOP_BACKOFF_BASE_S, Supervisor


class Logged:
    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.counters = Counters()
        self.supervisor = Supervisor(log=JsonLogger(self.stream, worker_id="w1"), counters=self.counters)

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]


def test_a_loop_that_raises_is_logged_with_its_traceback_counted_and_run_again():
    s = Logged()
    runs = []

    async def step() -> str:
        runs.append(clock.now())
        if len(runs) == 1:
            raise RuntimeError("a bug")
        return "done"

    assert asyncio.run(s.supervisor.keep("watch", step)) == "done"
    assert len(runs) == 2 and runs[1] - runs[0] <= LOOP_BACKOFF_BASE_S + 0.2
    (line,) = s.lines()
    assert (line["event"], line["level"], line["loop"], line["worker_id"]) == ("loop_error", "error", "watch", "w1")
    assert line["error"] == "RuntimeError: a bug" and line["attempt"] == 0
    assert line["traceback"].startswith("Traceback (most recent call last)") and "in step" in line["traceback"]
    assert s.counters.total(names.LOOP_ERRORS) == 1


def test_a_transient_fault_is_a_warning_and_not_a_loop_error():
    s = Logged()
    runs = []

    async def step() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise TransientError("throttled")

    asyncio.run(s.supervisor.keep("poll-0", step))
    assert [(line["event"], line["level"]) for line in s.lines()] == [("loop_retry", "warning")]
    assert len(runs) == 2 and s.counters.total(names.LOOP_ERRORS) == 0


def test_a_loop_that_keeps_failing_backs_off_and_goes_on():
    s = Logged()
    runs = []

    async def step() -> None:
        runs.append(clock.now())
        if len(runs) < 4:
            raise KeyError("again")

    asyncio.run(s.supervisor.keep("audit", step))
    assert [line["attempt"] for line in s.lines()] == [0, 1, 2]
    assert s.counters.total(names.LOOP_ERRORS) == 3


def test_cancelling_a_supervised_loop_cancels_it():
    async def scenario():
        s = Logged()
        task = asyncio.create_task(s.supervisor.keep("lag-probe", lambda: asyncio.sleep(60)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return s

    assert asyncio.run(scenario()).lines() == []


def test_a_call_is_tried_again_until_it_succeeds():
    s = Logged()
    calls = []

    async def call() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise PermissionError("AccessDenied")
        return 7

    got = asyncio.run(s.supervisor.retry("writer", call, deadline=lambda: clock.now() + 60))
    assert got == 7 and len(calls) == 3 and s.counters.total(names.LOOP_ERRORS) == 2


def test_a_call_is_tried_again_only_until_the_deadline():
    s = Logged()
    deadline = clock.now() + 0.5

    async def call() -> None:
        raise PermissionError("AccessDenied")

    with pytest.raises(LeaseExpired):
        asyncio.run(s.supervisor.retry("checkpoints", call, deadline=lambda: deadline))
    assert clock.now() >= deadline and s.counters.total(names.LOOP_ERRORS) >= 1


@pytest.mark.parametrize("exc", [LeaseExpired(), InvalidItem("refused")])
def test_what_the_caller_handles_goes_straight_to_it(exc):
    s = Logged()

    async def call() -> None:
        raise exc

    with pytest.raises(type(exc)):
        asyncio.run(s.supervisor.retry("writer", call, deadline=lambda: clock.now() + 60, passes=(InvalidItem,)))
    assert s.lines() == []
