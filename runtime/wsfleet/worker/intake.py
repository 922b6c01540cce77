"""Intake of START hints from SQS (sending them is :mod:`.hints`').

A hint only says "go try to take this one"; the conditional acquire decides. What to do
with each is :func:`.decide.choose_hint`'s; this module polls, and carries it out. Each worker
keeps ``HINT_POLLERS`` one-message long polls open, so a burst of STARTs is taken in
parallel and a leaving worker's hints spread over every waiting poll in the fleet
instead of all landing in whichever poll returned first; a busier worker pauses a
little before its next poll. Every hint is for anyone: a move to a named worker is a
write its target picks up from its session item (:mod:`.moves`), never a hint.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from .. import schema, tracing
from ..aws import SQS_WAIT_SECONDS, Aws
from ..leases import hint_pause_s
from ..logs import JsonLogger
from .acquisition import Acquisition
from .decide import HintAction, choose_hint, hint_age_s, parse_hint
from .hints import SEND_BATCH
from .holdings import Holdings
from .session import SessionKeeper
from .takeover import Takeover

# Idle, four polls cost 0.4 SQS requests/s per worker.
HINT_POLLERS = 4


class Intake:
    def __init__(
        self,
        *,
        aws: Aws,
        queue_url: str,
        log: JsonLogger,
        holdings: Holdings,
        acquisition: Acquisition,
        keeper: SessionKeeper,
        takeover: Takeover,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._aws = aws
        self._queue_url = queue_url
        self._log = log
        self._holdings = holdings
        self._acquisition = acquisition
        self._keeper = keeper
        self._takeover = takeover  # a poll that brought hints: connections move (its free scan's backoff resets)
        self._wall = wall  # epoch seconds, against a hint's SentTimestamp

    async def poll_once(self, *, wait_seconds: int = SQS_WAIT_SECONDS) -> int:
        """One long poll for a START hint; returns how many messages it handled."""
        standing = self._holdings.standing(self._keeper.session_id)
        if standing.room <= 0:
            return 0
        try:
            resp = await self._aws.poll(
                self._aws.sqs.receive_message,
                on_abandoned=self._give_back,
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=max(1, min(standing.room, standing.hints_per_poll())),
                WaitTimeSeconds=wait_seconds,
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp", schema.HINT_TRACE_HEADER],
            )
        except Exception:
            # The queue is out of reach: a START sent meanwhile has no hint, and the free
            # scan is its only way in. The scan goes at its base pace (not its backed-off
            # one) until a poll gets through, so a START in an SQS outage waits at most one
            # RECONCILE_SECONDS, not RECONCILE_BACKOFF_CAP of them. (A poll already waiting
            # does not fail: the router moves such a START to a worker itself, start_assign.)
            self._takeover.note_work()
            raise
        messages = resp.get("Messages", [])
        if messages:
            self._takeover.note_work()
        await asyncio.gather(*(self._on_hint(m) for m in messages))
        if self._acquisition.accepting() and messages:
            await asyncio.sleep(hint_pause_s(self._holdings.load()))
        return len(messages)

    def _give_back(self, resp: dict[str, Any]) -> None:
        """Hints a poll received after we stopped waiting for it (cancelled at shutdown):
        visible again at once, for a peer, instead of after the visibility timeout. A
        leaving worker's own polls would otherwise swallow its handover hints. Runs in
        the poll's thread."""
        messages = resp.get("Messages", [])
        for start in range(0, len(messages), SEND_BATCH):
            self._aws.sqs.change_message_visibility_batch(
                QueueUrl=self._queue_url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                    for n, m in enumerate(messages[start : start + SEND_BATCH])
                ],
            )
        if messages:
            self._log.info("hints_given_back", count=len(messages))

    async def _on_hint(self, message: dict[str, Any]) -> None:
        """Take the hinted connection, or leave it for a peer (:func:`.decide.choose_hint`)."""
        hint = parse_hint(message.get("Body", ""))
        connection_id = hint.connection_id
        attributes = message.get("Attributes", {})
        age_s = hint_age_s(attributes, self._wall())
        choice = choose_hint(
            hint,
            age_s=age_s,
            accepting=self._acquisition.accepting(),
            busy=connection_id is not None and self._holdings.busy(connection_id),
            ending=connection_id is not None and self._holdings.ending(connection_id),
            standing=self._holdings.standing(self._keeper.session_id),
        )
        keep = choice.action is HintAction.KEEP
        if choice.action is HintAction.BAD:
            self._log.warning("bad_hint", body=message.get("Body", "")[:200])
        if choice.declined_shed:
            self._log.info("shed_hint_left", connection_id=connection_id, age_s=round(age_s, 2))
        if choice.action is HintAction.TAKE:
            trace = tracing.valid_header(attributes.get(schema.HINT_TRACE_HEADER), where="hint")
            await self._acquisition.try_acquire(
                connection_id, source=choice.source, expected_session=hint.from_session, known=hint.released, trace_parent=trace
            )
        try:
            if keep:
                await self._aws.call(
                    self._aws.sqs.change_message_visibility,
                    QueueUrl=self._queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=choice.visibility_s,
                )
            else:
                # Won, lost or already ours: the hint has done its job either way.
                await self._aws.call(
                    self._aws.sqs.delete_message, QueueUrl=self._queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
        except Exception as exc:  # noqa: BLE001 - it comes back after its visibility timeout
            self._log.warning("hint_ack_failed", error=str(exc))
