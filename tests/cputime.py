"""Opt-in plugin: the CPU seconds each test cost, child processes included, for finding
where the suite's time goes (``pytest -p tests.cputime``; each pytest process, xdist
workers too, writes ``$CPUTIME_OUT-<worker>.json``: rows of [node id, CPU s, wall s]).

A test's CPU is that of this process and of the processes it reaped, plus what every
live descendant (a worker, the shared emulator process) used meanwhile, read from
/proc: the emulator a module shares is charged to the tests that kept it busy. Linux
only; elsewhere it counts this process and the children it reaped.
"""

from __future__ import annotations

import json
import os
import resource
import time
from typing import Iterator

import pytest

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_rows: list[tuple[str, float, float]] = []


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _own_and_waited_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a live process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s() -> float:
    me, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime
    stack = _children(os.getpid())
    while stack:
        pid = stack.pop()
        total += _own_and_waited_s(pid)
        stack += _children(pid)
    return total


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = tree_cpu_s(), time.monotonic()
    try:
        return (yield)
    finally:
        _rows.append((item.nodeid, tree_cpu_s() - cpu, time.monotonic() - wall))


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("CPUTIME_OUT", "cputime")
    with open(f"{out}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json", "w") as f:
        json.dump({"rows": _rows, "total_s": tree_cpu_s()}, f)
