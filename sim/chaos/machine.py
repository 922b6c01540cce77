"""The machine under the run: how much CPU this run's processes used, and how much
everything else on the machine did (Linux /proc; nothing elsewhere).

The bounds assume the run has the machine's cores to itself. On a shared machine a
busy neighbour (a test suite, a build) slows every step of a recovery at once, the
emulator's requests and the workers' alike: a recovery past its bound in such a window
is still a violation, but the report says what else was running, so that it is not
mistaken for a slow worker (or hidden by a looser bound). Seed 300750, #71 (clock): the
handoff took 3.56 s against 3.50 s while a ``make test`` ran beside the soak; the
replacement worker took 3.96 s from spawn to its first log line, against 0.82-1.51 s
for the other 22 replacements of the run.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_SHARE = 0.5  # cores used by other processes above which a window is called busy


@dataclass(frozen=True)
class CpuSample:
    t: float  # epoch seconds
    busy_s: float  # CPU seconds the whole machine has spent busy (since boot)
    ours_s: float  # CPU seconds of this process and its live descendants (reaped children included)
    load1: float = 0.0  # /proc/loadavg, the one-minute average


def machine_busy_s(stat: str) -> float:
    """Busy CPU seconds from the ``cpu`` line of /proc/stat: user, nice, system, irq,
    softirq and steal (guest time is already inside user)."""
    for line in stat.splitlines():
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:]]
            f += [0] * (8 - len(f))
            user, nice, system, _idle, _iowait, irq, softirq, steal = f[:8]
            return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS
    raise ValueError("no cpu line in /proc/stat")


def parse_pid_stat(text: str) -> tuple[int, float]:
    """(parent pid, CPU seconds: utime + stime + cutime + cstime) from /proc/<pid>/stat.
    The command name, in parentheses, may hold spaces and parentheses itself."""
    rest = text[text.rindex(")") + 2:].split()
    ppid = int(rest[1])
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    return ppid, (utime + stime + cutime + cstime) / CLOCK_TICKS


def tree_cpu_s(root: int, stats: Iterable[tuple[int, str]]) -> float:
    """CPU seconds of ``root`` and every descendant among ``stats`` ((pid, stat text)).
    A child that exited and was reaped is counted in its parent's cutime/cstime."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for pid, text in stats:
        try:
            parent[pid], cpu[pid] = parse_pid_stat(text)
        except (ValueError, IndexError):
            continue
    total = 0.0
    for pid in cpu:
        p, hops = pid, 0
        while p != root and p in parent and hops < 64:
            p, hops = parent[p], hops + 1
        if p == root:
            total += cpu[pid]
    return total


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def sample(t: float, root: int | None = None) -> CpuSample | None:
    """One reading of the machine and of this run's process tree; None off Linux."""
    root = os.getpid() if root is None else root
    try:
        busy = machine_busy_s(_read("/proc/stat"))
        load1 = float(_read("/proc/loadavg").split()[0])
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except (OSError, ValueError):
        return None
    stats = []
    for pid in pids:
        try:
            stats.append((pid, _read(f"/proc/{pid}/stat")))
        except OSError:
            continue  # gone meanwhile
    return CpuSample(t, busy, tree_cpu_s(root, stats), load1)


@dataclass(frozen=True)
class Window:
    """CPU over one stretch of the run, in cores (CPU seconds per second)."""

    t0: float
    t1: float
    ours: float
    others: float


def window(samples: Sequence[CpuSample], t0: float, t1: float) -> Window | None:
    """Cores used by this run and by everything else between the samples that bracket
    ``t0`` .. ``t1`` (None without two samples there)."""
    times = [s.t for s in samples]
    i = max(0, bisect.bisect_right(times, t0) - 1)
    j = min(len(samples) - 1, bisect.bisect_left(times, t1))
    if j <= i:
        return None
    a, b = samples[i], samples[j]
    dt = b.t - a.t
    ours = max(0.0, b.ours_s - a.ours_s)
    others = max(0.0, (b.busy_s - a.busy_s) - ours)
    return Window(a.t, b.t, ours / dt, others / dt)


def windows(samples: Sequence[CpuSample], every_s: float) -> list[Window]:
    """Consecutive windows of about ``every_s`` seconds over the whole run."""
    out: list[Window] = []
    i = 0
    for j in range(1, len(samples)):
        if samples[j].t - samples[i].t >= every_s or j == len(samples) - 1:
            w = window(samples, samples[i].t, samples[j].t)
            if w is not None:
                out.append(w)
            i = j
    return out


def summary(samples: Sequence[CpuSample], every_s: float = 10.0) -> dict[str, float | int]:
    """Mean and max (over ``every_s`` windows) cores of this run and of everything else,
    how many windows other processes kept busy, and the highest one-minute load."""
    ws = windows(samples, every_s)
    if not ws:
        return {}
    whole = window(samples, samples[0].t, samples[-1].t)
    assert whole is not None
    return {
        "cores": os.cpu_count() or 0,
        "ours_mean": round(whole.ours, 2),
        "ours_max": round(max(w.ours for w in ws), 2),
        "others_mean": round(whole.others, 2),
        "others_max": round(max(w.others for w in ws), 2),
        "busy_windows": sum(1 for w in ws if w.others > BUSY_SHARE),
        "windows": len(ws),
        "load1_max": max(s.load1 for s in samples),
    }
