"""The fleet's child processes (the emulator, the workers): how they are started and
stopped, so that no process outlives the fleet (see :mod:`.fleet`, which says with what
environment and code)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, TypeVar


LOOPBACK = "127.0.0.1"
T = TypeVar("T")


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when we die, or None elsewhere.

    Resolved here, in the parent, so that the forked child only makes one libc call.
    The signal fires when the *thread* that started the child exits, so start children
    from a thread that lives as long as the fleet (the main thread does).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return preexec


@dataclass
class Process:
    """A child process with its output in a log file."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    started_at: float  # epoch seconds
    state: str = "running"  # running | paused | killed | terminated

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []


def spawn(name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> Process:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop them in order
            preexec_fn=_die_with_parent(),
        )
    return Process(name, popen, log_path, time.time())


def stop_process(proc: Process, *, grace_s: float = 0.0) -> int:
    """SIGTERM and wait up to ``grace_s``, then SIGKILL; returns the exit status."""
    if proc.alive():
        if proc.state == "paused":
            os.kill(proc.pid, signal.SIGCONT)
        if grace_s > 0:
            proc.popen.send_signal(signal.SIGTERM)
            try:
                return proc.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        proc.popen.kill()
    return proc.popen.wait()


def eventually(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
