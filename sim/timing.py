"""The worker settings a local fleet run is judged by (:class:`Timing`), and the bounds
that follow from them: what the fleet tests, the demo's report and chaos' recovery
bounds measure against."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from wsfleet import settings_spec
from wsfleet.leases import SessionTiming, TimingError


# What a takeover costs past the dead session's expiry + skew: the watcher's jitter (at
# most 0.3 s), its end, drain query and acquires, the stored-end query and the connect
# (about 0.5 s on an idle machine), and a second and a half of room for a busy 2-core one.
TAKEOVER_SLACK_S = 2.5


@dataclass(frozen=True)
class Timing:
    """The worker settings a fleet run is judged by, and the bounds that follow from them.

    The defaults are the worker's own for the session (lease 10 s, heartbeat 2.5 s, skew
    1 s); reconcile (the scan for lost hints), flush and checkpoint are shorter than in
    production so that a short local run shows them and its checkpoints move visibly."""

    lease_s: float = 10.0
    heartbeat_s: float = 2.5
    reconcile_s: float = 3.0
    skew_ms: int = 1000
    flush_ms: int = 1000
    shutdown_s: float = 10.0
    checkpoint_s: float = 5.0  # CHECKPOINT_SECONDS: how stale the observer's last_seq may be

    def env(self) -> dict[str, str]:
        return {
            settings_spec.LEASE_SECONDS: f"{self.lease_s:g}",
            settings_spec.HEARTBEAT_SECONDS: f"{self.heartbeat_s:g}",
            settings_spec.RECONCILE_SECONDS: f"{self.reconcile_s:g}",
            settings_spec.MAX_CLOCK_SKEW_MS: str(self.skew_ms),
            settings_spec.FLUSH_INTERVAL_MS: str(self.flush_ms),
            settings_spec.SHUTDOWN_SECONDS: f"{self.shutdown_s:g}",
            settings_spec.CHECKPOINT_SECONDS: f"{self.checkpoint_s:g}",
        }

    @property
    def crash_bound_s(self) -> float:
        """A crashed (or frozen) worker's connections, from the kill:
        ``lease + skew + TAKEOVER_SLACK_S``. Its session was last renewed at most a
        heartbeat before the kill, so it expires at most a lease after it; a watcher,
        which saw the missed renewal well before, ends it once the skew margin has also
        passed, and takes its connections (acquire, find the stored end, connect) within
        the slack."""
        return self.lease_s + self.skew_ms / 1000 + TAKEOVER_SLACK_S

    @property
    def graceful_bound_s(self) -> float:
        """A leaving worker releases and hints its peers through SQS: well inside a lease."""
        return min(2.0, self.lease_s / 2)

    @property
    def start_bound_s(self) -> float:
        """A START reaches a worker through the queue hint, not the reconcile."""
        return 2.0

    @property
    def stop_bound_s(self) -> float:
        """The owner sees STOP at its next renewal, then closes the socket."""
        return self.heartbeat_s + 1.0


def add_arguments(p: argparse.ArgumentParser, *, shutdown: bool = False) -> None:
    """The worker settings a run's command line may set (``--shutdown`` where asked), each
    defaulting to :class:`Timing`'s."""
    d = Timing()
    p.add_argument("--lease", type=float, default=d.lease_s, help=f"LEASE_SECONDS, the session lease [{d.lease_s:g}]")
    p.add_argument("--heartbeat", type=float, default=d.heartbeat_s, help=f"HEARTBEAT_SECONDS [{d.heartbeat_s:g}]")
    p.add_argument("--reconcile", type=float, default=d.reconcile_s, help=f"RECONCILE_SECONDS [{d.reconcile_s:g}]")
    p.add_argument("--skew-ms", type=int, default=d.skew_ms, help=f"MAX_CLOCK_SKEW_MS [{d.skew_ms}]")
    p.add_argument("--flush-ms", type=int, default=d.flush_ms, help=f"FLUSH_INTERVAL_MS [{d.flush_ms}]")
    p.add_argument("--checkpoint", type=float, default=d.checkpoint_s, help=f"CHECKPOINT_SECONDS [{d.checkpoint_s:g}]")
    if shutdown:
        p.add_argument("--shutdown", type=float, default=d.shutdown_s, help=f"SHUTDOWN_SECONDS [{d.shutdown_s:g}]")


def from_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> Timing:
    """The :class:`Timing` the parsed arguments ask for; the worker's own rule
    (:meth:`SessionTiming.checked`) refuses a bad one, in the flags' names."""
    try:
        SessionTiming.checked(lease_s=a.lease, heartbeat_s=a.heartbeat, max_clock_skew_ms=a.skew_ms)
    except TimingError as exc:
        p.error(exc.sentence(lease="--lease", heartbeat="--heartbeat", skew="--skew-ms"))
    return of_arguments(a)


def of_arguments(a: argparse.Namespace) -> Timing:
    """The :class:`Timing` of arguments :func:`from_arguments` has already checked."""
    return Timing(lease_s=a.lease, heartbeat_s=a.heartbeat, reconcile_s=a.reconcile, skew_ms=a.skew_ms,
                  flush_ms=a.flush_ms, checkpoint_s=a.checkpoint,
                  **({"shutdown_s": a.shutdown} if hasattr(a, "shutdown") else {}))
