"""The one visible place where the worker's blocking boto3 calls leave the event loop.

boto3 is synchronous. Every call the worker makes goes through :meth:`Aws.call`, which
runs it in a bounded thread pool, so the loop that drives a thousand sockets never
blocks on the network. SQS long polls get a pool of their own, so that a 10-second
poll never holds a thread that a lease renewal needs.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import boto3
from botocore.config import Config

from . import tracing
from .config import WorkerConfig

T = TypeVar("T")

SQS_WAIT_SECONDS = 10


class Aws:
    def __init__(
        self, config: WorkerConfig, *, threads: int = 32, session: boto3.session.Session | None = None
    ) -> None:
        session = session or boto3.session.Session(region_name=config.region)
        # botocore's own retries absorb short throttling bursts; the callers retry
        # longer, bounded by their lease deadline.
        base = dict(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=threads, connect_timeout=2)
        self.dynamodb = session.client(
            "dynamodb", endpoint_url=config.endpoint_url, config=Config(read_timeout=5, **base)
        )
        self.sqs = session.client(
            "sqs", endpoint_url=config.endpoint_url, config=Config(read_timeout=SQS_WAIT_SECONDS + 10, **base)
        )
        self.cloudwatch = session.client(
            "cloudwatch", endpoint_url=config.endpoint_url, config=Config(read_timeout=10, **base)
        )
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="aws")
        # Requests as sent on the wire (retries included), per "service.Operation": what
        # the bill and the cost benchmark count.
        self.requests: Counter[str] = Counter()
        for client in (self.dynamodb, self.sqs, self.cloudwatch):
            client.meta.events.register("request-created", self._count)

    def _count(self, event_name: str = "", **_: Any) -> None:
        # "request-created.<service>.<Operation>", emitted once per attempt.
        self.requests[event_name.partition(".")[2]] += 1

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a blocking call in the pool. Cancelling the await does not stop the
        thread: the request may still land, which every write we make tolerates
        (renewals and message writes are idempotent; acquire and release recognise a
        retry of a write that landed)."""
        loop = asyncio.get_running_loop()
        with tracing.subsegment(getattr(fn, "__qualname__", "aws_call")):
            return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def poll(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a long poll in a daemon thread of its own: it never takes a pool thread
        from a lease renewal, and a poll in flight at exit does not hold the process
        (its messages simply become visible again)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, exc: BaseException | None) -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)

        def work() -> None:
            try:
                result, exc = fn(*args, **kwargs), None
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
                result, exc = None, e
            try:
                loop.call_soon_threadsafe(settle, result, exc)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more

        threading.Thread(target=work, name="sqs-poll", daemon=True).start()
        return await future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
