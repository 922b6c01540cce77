"""The ``slow`` marker, kept honest.

``make check`` runs the tests that are not ``slow``. A test is ``slow`` when it starts a
child process or runs a worker's loop (``Worker.run``): an interpreter importing boto3,
or a lease running out, takes seconds. Nobody has to remember that: a test that does
either without the marker fails, saying so. Mark a whole module with ``pytestmark =
pytest.mark.slow`` when all of it is slow, single tests otherwise, so that the quick
tests beside them stay in ``make check``.
"""

from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass, field
from typing import Iterator

import pytest

from wsfleet.worker.lifecycle import Worker

SLOW = "slow"

# Every way Python starts a process raises one of these audit events (PEP 578).
_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system"}
)


class _Guard:
    """What the test running now may do, and what it did that it may not. Tests of
    this plugin run pytest inside a test, hence a stack rather than one slot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: list[_Running] = []

    def enter(self, item: pytest.Item) -> None:
        with self._lock:
            self._running.append(_Running(item))

    def leave(self) -> None:
        with self._lock:
            self._running.pop()

    def now(self) -> "_Running | None":
        with self._lock:
            return self._running[-1] if self._running else None

    def check(self, what: str) -> None:
        """Raise (and remember, in case the caller swallows it) if the test running
        now is not marked slow and does ``what``."""
        running = self.now()
        if running is None or running.item.get_closest_marker(SLOW):
            return
        message = f"{running.item.nodeid} {what} but is not marked slow: add @pytest.mark.slow (see tests/markers.py)"
        running.refused.append(message)
        raise RuntimeError(message)


@dataclass
class _Running:
    item: pytest.Item
    refused: list[str] = field(default_factory=list)
    failed: bool = False  # a phase already failed: the refusal is in its report


_guard = _Guard()


def _audit(event: str, args: tuple) -> None:
    if event in _PROCESS_EVENTS:
        command = f" {args[1]!r:.120}" if event == "subprocess.Popen" else ""
        _guard.check(f"starts a process ({event}{command})")


sys.addaudithook(_audit)


def _guarded_run(run):
    @functools.wraps(run)
    async def guarded(self: Worker) -> None:
        _guard.check("runs a worker's loop (Worker.run)")
        await run(self)

    return guarded


Worker.run = _guarded_run(Worker.run)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _guard.enter(item)
    try:
        return (yield)
    finally:
        _guard.leave()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    """A test that caught the guard's error still fails: at teardown, with the refusals."""
    report = yield
    running = _guard.now()
    if running is not None:
        running.failed |= report.failed
        if call.when == "teardown" and running.refused and not running.failed:
            report.outcome = "failed"
            report.longrepr = "\n".join(running.refused)
    return report
