"""What the simulator's child processes (the emulator, the workers, a benchmark's
helpers) import and see: the code they run (this checkout, or a copy pinned at the start of
a long run), an environment that cannot reach real AWS, and the emulator as a child
(:class:`EmulatorProcess`)."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

from wsfleet import settings_spec
from wsfleet import schema
from .emulator import create_resources
from .processes import LOOPBACK, Process, eventually, spawn, stop_process

# Children import the product (``wsfleet``) from RUNTIME_DIR and the simulator (``sim``)
# from SIM_ROOT; a benchmark or a chaos run points both at a copy taken at its start
# (pin_runtime), by assigning this module's RUNTIME_DIR.
SIM_ROOT = Path(__file__).resolve().parents[1]  # holds the ``sim`` package
RUNTIME_DIR = SIM_ROOT / "runtime"  # holds the ``wsfleet`` package


def pin_runtime(run_dir: Path) -> Path:
    """Copy the ``wsfleet`` and ``sim`` packages into ``run_dir/runtime`` and return that
    directory, for a long run's children to import: code edited while the run goes on must
    not reach the workers it starts later (the API, in this process, keeps what it imported)."""
    pinned = run_dir / "runtime"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(RUNTIME_DIR / "wsfleet", pinned / "wsfleet", ignore=ignore, dirs_exist_ok=True)
    shutil.copytree(SIM_ROOT / "sim", pinned / "sim", ignore=ignore, dirs_exist_ok=True)
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
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(RUNTIME_DIR), str(SIM_ROOT), os.environ.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["AWS_XRAY_SDK_ENABLED"] = "false"
    env[settings_spec.TRACING] = "off"  # unless the fleet traces (Fleet(traces=True)): no daemon, no collector here
    env.pop(settings_spec.TRACING_FILE, None)
    # The local upstream is on loopback: the router and the worker must both allow it.
    env[settings_spec.ALLOWED_WS_HOSTS] = LOOPBACK
    env.update(extra)
    return env


class EmulatorProcess:
    """``python -m sim.emulator`` in a process of its own: moto's DynamoDB is
    serialised, so a fleet must not share its interpreter (and GIL) with the workers'
    backend. Several fleets may share one (each creates its own tables and queue)."""

    def __init__(self, log_path: Path, *, runtime_dir: Path | None = None, partition_writes_per_s: float = 0) -> None:
        self._log_path = log_path
        self._runtime_dir = runtime_dir
        self._partition_writes_per_s = partition_writes_per_s  # sim.emulator_partitions (0: no limit)
        self.proc: Process | None = None
        self.endpoint_url = ""

    def start(self, timeout: float = 30.0) -> "EmulatorProcess":
        self.proc = spawn(
            "emulator",
            [sys.executable, "-m", "sim.emulator", "--host", LOOPBACK,
             "--partition-writes-per-s", f"{self._partition_writes_per_s:g}"],
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
        """Tables and a queue (and the messages stream, where ``sink`` has kinesis; the delivery stream, where it has firehose) with
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
            delivery_stream_name=f"wsfleet-messages-{suffix}",
            delivery_bucket_name=f"wsfleet-delivery-{suffix}",
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace_s=3.0)

    def __enter__(self) -> "EmulatorProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
