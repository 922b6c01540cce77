"""What the nemesis did, as it happened: the history the checker reads beside the
evidence (which faults, when, to whom, which connections they touched, every START and
STOP sent). Plain data; the checker's tests build it by hand."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Op:
    """One START or STOP through the API: sent at ``t``, answered ``status`` at
    ``answered_at`` (0: not known; the router may take seconds under DynamoDB faults)."""

    t: float
    action: str  # START | STOP
    connection_id: str
    status: int = 0
    ws_url: str = ""  # a START's
    answered_at: float = 0.0

    @property
    def recorded_by(self) -> float:
        """When the router had recorded it at the latest: its answer (or, not known, its send)."""
        return self.answered_at or self.t


@dataclass
class Applied:
    """What the nemesis did for one fault, as it happened (epoch seconds)."""

    n: int
    kind: str
    started_at: float
    healed_at: float | None = None
    victim: str = ""  # the worker process it hit
    drainer: str = ""  # drain_term: the watcher SIGTERMed while it drained the victim's session
    trigger: str = ""  # close_stall: what closed the stalled sockets (stop, term, lost)
    replacement: str = ""
    victim_session_age_s: float | None = None  # how long the victim's live session had been open
    affected: dict[str, float] = field(default_factory=dict)  # connection -> when its recovery is timed from
    frozen_peers: list[str] = field(default_factory=list)  # pause: the frozen process's client addresses
    resumed_at: float | None = None
    exit_status: int | None = None  # term, clock: the leaving worker's
    note: str = ""
    # byzantine: per stream, the seqs its bad frames took and their class (byzantine.CLASSES)
    sent: dict[str, dict[int, str]] = field(default_factory=dict)
