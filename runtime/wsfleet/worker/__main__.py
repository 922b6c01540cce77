"""Entry point: ``python -m wsfleet.worker``. Configuration comes only from the
environment (see ``wsfleet.config``); SIGTERM and SIGINT start a graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import urllib.request

from .. import tracing
from ..aws import Aws
from ..config import WorkerConfig
from ..settings_spec import ConfigError
from ..logs import JsonLogger, route_stdlib_logging
from . import allocator
from .lifecycle import Worker

FLUSH_AT_EXIT_S = 2.0  # inside SHUTDOWN_SECONDS' margin below the container's stopTimeout


def resolve_worker_id(config: WorkerConfig) -> str:
    """WORKER_ID if given, else the ECS task id from the task metadata endpoint, else
    hostname-pid."""
    if config.worker_id:
        return config.worker_id
    if config.ecs_metadata_uri:
        try:
            with urllib.request.urlopen(f"{config.ecs_metadata_uri}/task", timeout=2) as resp:
                arn = json.load(resp)["TaskARN"]
            return arn.rsplit("/", 1)[-1]
        except (OSError, ValueError, KeyError):
            pass
    return config.default_worker_id()


async def run(config: WorkerConfig, worker_id: str, log: JsonLogger) -> None:
    aws = Aws(config)
    worker = Worker(config, worker_id, aws=aws, log=log)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_shutdown)
    try:
        await worker.run()
    finally:
        aws.close()
        # The spans of the shutdown itself too: a stopped task's buffer is lost.
        if not await asyncio.to_thread(tracing.flush, FLUSH_AT_EXIT_S):
            log.warning("trace_flush_incomplete", timeout_s=FLUSH_AT_EXIT_S)


def main() -> int:
    route_stdlib_logging()
    log = JsonLogger()
    try:
        config = WorkerConfig.from_env()
        tracing.configure_worker(config.tracing, config.service_name)
    except ConfigError as exc:
        log.error("config_error", message=str(exc))
        print(f"wsfleet worker: configuration error: {exc}", file=sys.stderr)
        return 2
    worker_id = resolve_worker_id(config)
    route_stdlib_logging(worker_id=worker_id)
    # Before the first large frame: glibc's threshold moves with the blocks freed (see allocator).
    log.info("allocator_tuned", worker_id=worker_id, **allocator.tune())
    asyncio.run(run(config, worker_id, log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
