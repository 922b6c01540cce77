"""One worker under a load, as the ingestion and sinks benchmarks run it: its defaults
(what a level's settings start from) and the START of its connections."""

from __future__ import annotations

import time
from typing import Any

from wsfleet import config as cfg
from wsfleet import settings_spec
from sim.processes import eventually

from .common import Rig
from .kinds import DEFAULT, UpstreamKind


def worker_defaults() -> cfg.WorkerConfig:
    """The worker's configuration when nothing optional is set."""
    required = {settings_spec.TABLE_NAME: "-", settings_spec.SESSIONS_TABLE_NAME: "-", settings_spec.MESSAGES_TABLE_NAME: "-", settings_spec.MESSAGES_BUCKET_NAME: "-", settings_spec.QUEUE_URL: "-",
                settings_spec.AWS_REGION: "-"}
    return cfg.WorkerConfig.from_env(required)


DEFAULTS = worker_defaults()
FLUSH_MS = DEFAULTS.flush_interval_ms  # FLUSH_INTERVAL_MS's default (100)


def connect(rig: Rig, upstream: Any, ids: list[str], kind: UpstreamKind = DEFAULT) -> float:
    """START every connection with its hint; returns the seconds until every socket is open."""
    began = time.monotonic()
    rig.start_connections(ids, upstream, hint=True, kind=kind)
    eventually(lambda: upstream.open_sockets() == len(ids), max(60, len(ids) * 0.3), f"{len(ids)} sockets open",
               interval=0.5)
    return time.monotonic() - began
