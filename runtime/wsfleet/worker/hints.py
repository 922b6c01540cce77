"""Sending hints to peers: "this connection is free to take now".

A hint is only an optimisation (the free scan finds what a lost hint leaves); the
conditional acquire decides. Every role that frees or hands off a connection hints it
through the worker's one :class:`Hints`, so that hints asked for in the same turn of the
event loop leave together, ten to a SendMessageBatch (a drain hints dozens at once).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Mapping

from .. import schema, tracing
from ..aws import Aws
from ..logs import JsonLogger
from ..validation import plain_numbers

SEND_BATCH = 10  # SendMessageBatch's limit


class Hints:
    def __init__(self, *, aws: Aws, queue_url: str, log: JsonLogger) -> None:
        self.sent = 0
        self._outbox: list[tuple[dict, str, asyncio.Future]] = []
        self._sending: set[asyncio.Task] = set()
        self._aws = aws
        self._queue_url = queue_url
        self._log = log

    async def hint(
        self,
        connection_id: str,
        *,
        shed_by: str = "",
        from_session: str = "",
        released: Mapping[str, Any] | None = None,
        trace: str | None = None,
    ) -> bool:
        """Tell peers a connection is free to take now, so one takes it at once instead
        of at its next scan; ``shed_by`` marks one shed to rebalance, ``from_session``
        one still attached to that ENDED session (the taker's acquire is conditional on
        it), ``released`` the state a clean release left it in (see
        :func:`schema.released_state`). The hint carries ``trace`` (a trace header), else
        the one of the span current here, as its ``AWSTraceHeader``: the taker's acquire
        continues that trace. Returns once sent (True) or given up (False)."""
        body: dict[str, Any] = {schema.HINT_CONNECTION_ID: connection_id}
        if shed_by:
            body[schema.HINT_SHED_BY] = shed_by
        if from_session:
            body[schema.HINT_FROM_SESSION] = from_session
        if released:
            body[schema.HINT_RELEASED] = dict(released)
        done = asyncio.get_running_loop().create_future()
        entry = {"MessageBody": json.dumps(plain_numbers(body)), **schema.hint_trace_attributes(trace or tracing.current_header())}
        self._outbox.append((entry, connection_id, done))
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._send_outbox)
        return await done

    def _send_outbox(self) -> None:
        batch, self._outbox = self._outbox, []
        for i in range(0, len(batch), SEND_BATCH):
            task = asyncio.ensure_future(self._send_batch(batch[i : i + SEND_BATCH]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send_batch(self, batch: list[tuple[dict, str, asyncio.Future]]) -> None:
        failed: dict[str, str] = {}
        try:
            resp = await self._aws.call(
                self._aws.sqs.send_message_batch,
                QueueUrl=self._queue_url,
                Entries=[{"Id": str(n), **entry} for n, (entry, _, _) in enumerate(batch)],
            )
            failed = {f["Id"]: f.get("Message", f.get("Code", "failed")) for f in resp.get("Failed", [])}
        except Exception as exc:  # noqa: BLE001 - a hint is an optimisation; the free scan covers it
            failed = {str(n): str(exc) for n in range(len(batch))}
        for n, (_, connection_id, done) in enumerate(batch):
            if str(n) in failed:
                self._log.warning("hint_failed", connection_id=connection_id, error=failed[str(n)])
            else:
                self.sent += 1
            if not done.done():
                done.set_result(str(n) not in failed)
