"""The fleet's child processes (the emulator, the workers): how they are started, with
what environment, and how they are stopped; no process outlives the fleet (see
:mod:`.fleet`)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, TypeVar

from .. import config as cfg
from .. import schema
from .emulator import create_resources

RUNTIME_DIR = Path(__file__).resolve().parents[2]  # what PYTHONPATH must hold for children
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


def pin_runtime(run_dir: Path) -> Path:
    """Copy the ``wsfleet`` package into ``run_dir/runtime`` and return that directory,
    for a long run's children to import: code edited while the run goes on must not
    reach the workers it starts later (the API, in this process, keeps what it imported)."""
    pinned = run_dir / "runtime"
    shutil.copytree(RUNTIME_DIR / "wsfleet", pinned / "wsfleet", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return pinned


def pinned(env: dict[str, str], runtime_dir: Path | None) -> dict[str, str]:
    """``env`` with ``runtime_dir`` first on PYTHONPATH (None: unchanged)."""
    if runtime_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(runtime_dir), env.get("PYTHONPATH", "")])
    return env


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that could reach real AWS, plus
    what a ``python -m wsfleet...`` child needs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(RUNTIME_DIR), os.environ.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["AWS_XRAY_SDK_ENABLED"] = "false"
    # The local upstream is on loopback: the router and the worker must both allow it.
    env[cfg.ALLOWED_WS_HOSTS] = LOOPBACK
    env.update(extra)
    return env


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


class EmulatorProcess:
    """``python -m wsfleet.local.emulator`` in a process of its own: moto's DynamoDB is
    serialised, so a fleet must not share its interpreter (and GIL) with the workers'
    backend. Several fleets may share one (each creates its own tables and queue)."""

    def __init__(self, log_path: Path, *, runtime_dir: Path | None = None) -> None:
        self._log_path = log_path
        self._runtime_dir = runtime_dir
        self.proc: Process | None = None
        self.endpoint_url = ""

    def start(self, timeout: float = 30.0) -> "EmulatorProcess":
        self.proc = spawn(
            "emulator",
            [sys.executable, "-m", "wsfleet.local.emulator", "--host", LOOPBACK],
            pinned(child_env(), self._runtime_dir),
            self._log_path,
        )

        def ready() -> str | None:
            if not self.proc.alive():
                raise RuntimeError(f"the emulator exited at start-up; see {self._log_path}")
            return next((line.split()[1] for line in self.proc.lines() if line.startswith("READY ")), None)

        self.endpoint_url = eventually(ready, timeout, "the emulator to be READY", interval=0.05)
        return self

    def create_resources(self, sink: str = schema.SINK_DYNAMODB) -> dict[str, str]:
        """Tables and a queue (and the messages stream, where ``sink`` has kinesis) with
        names of their own; returns the env the worker needs."""
        suffix = uuid.uuid4().hex[:8]
        return create_resources(
            self.endpoint_url,
            table_name=f"wsfleet-connections-{suffix}",
            sessions_table_name=f"wsfleet-sessions-{suffix}",
            messages_table_name=f"wsfleet-messages-{suffix}",
            messages_bucket_name=f"wsfleet-messages-{suffix}",
            queue_name=f"wsfleet-start-{suffix}",
            sink=sink,
            messages_stream_name=f"wsfleet-messages-{suffix}",
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace_s=3.0)

    def __enter__(self) -> "EmulatorProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
