"""The fleet in virtual time: thousands of workers running the product's own roles and
decisions against an in-memory DynamoDB that enforces each partition's limits, an SQS
queue with the stack's dead-letter rule and an ECS service's model, in minutes on one
core. A seed replays a run exactly (FoundationDB's deterministic simulation, at the
level of the worker's decisions)."""

from __future__ import annotations

import resource
import time
from dataclasses import replace
from typing import Any

from .fleet import Fleet, Settings
from .report import figures
from .scenarios import SCENARIOS, Run

__all__ = ["SCENARIOS", "Settings", "simulate"]


def simulate(scenario: str, *, workers: int, per_worker: int, seed: int, settings: Settings | None = None) -> dict[str, Any]:
    """Run one scenario and return its figures (:func:`.report.figures`)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"no scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    if workers < 2 or per_worker < 1:
        raise ValueError("a fleet of at least 2 workers with at least 1 connection each")
    settings = settings or Settings()
    if per_worker > settings.max_connections:
        settings = replace(settings, max_connections=per_worker)
    began = time.monotonic()
    fleet = Fleet(settings, seed=seed)
    run = Run(scenario, workers, per_worker, seed)
    try:
        fleet.run(lambda: SCENARIOS[scenario](fleet, run))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return figures(fleet, run, wall_s=time.monotonic() - began, max_rss_mb=rss)
    finally:
        fleet.close()
