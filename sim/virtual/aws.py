"""The worker's :class:`wsfleet.aws.Aws` for a simulated worker: the same three ways to
call (``call``, ``call_urgent``, ``poll``), each taking a request's latency in virtual
time instead of a thread, against the in-memory table and queue.

A crashed worker's calls never land: from the moment ECS kills it
(:meth:`SimAws.kill`), a call it still had waiting raises CancelledError in the task
that made it, as if the process were gone.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from .dynamo import Dynamo
from .sqs import Queue

DYNAMODB_LATENCY_S = 0.006  # one request's round trip (in-region, small items)
SQS_LATENCY_S = 0.01


class SimAws:
    def __init__(self, dynamodb: Dynamo, sqs: Queue) -> None:
        self.dynamodb = self.dynamodb_writes = dynamodb
        self.sqs = sqs
        self.alive = True
        self.requests = 0

    def kill(self) -> None:
        self.alive = False

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(SQS_LATENCY_S if getattr(fn, "__self__", None) is self.sqs else DYNAMODB_LATENCY_S)
        if not self.alive:
            raise asyncio.CancelledError()
        self.requests += 1
        return fn(*args, **kwargs)

    call_urgent = call

    async def poll(self, fn: Callable[..., Any], /, *, on_abandoned: Callable[[Any], None] | None = None, **kwargs: Any) -> Any:
        """A long poll: received at once if anything is visible, else when a message may
        be (the queue wakes one poller per message), or empty after WaitTimeSeconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + kwargs.get("WaitTimeSeconds", 0)
        while True:
            resp = await self.call(fn, **kwargs)
            left = deadline - loop.time()
            if resp.get("Messages") or left <= 0:
                return resp
            await self.sqs.wait(left)
