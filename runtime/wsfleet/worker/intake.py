"""Intake of START hints from SQS (sending them is :mod:`.hints`').

A hint only says "go try to take this one"; the conditional acquire decides. What to do
with each is :func:`.decide.choose_hint`'s; this module polls, and carries it out. Each worker
keeps ``HINT_POLLERS`` one-message long polls open, so a burst of STARTs is taken in
parallel and a leaving worker's hints spread over every waiting poll in the fleet
instead of all landing in whichever poll returned first; a busier worker pauses a
little before its next poll.

A shed connection named for another worker (sent only by a worker of an older release,
during a deploy: a move to a named worker is a write now, :mod:`.moves`) is left for it
(visible again at once). The queue is shared, so what gets it there fast is the others holding back: a worker whose
poll left one pauses all its polls (:func:`~wsfleet.leases.after_poll_pause_s`): for a
second, or for less when it may be the named worker of other handoffs itself
(:meth:`Intake.expecting`), so that it does not sit out its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from .. import schema, tracing
from ..aws import SQS_WAIT_SECONDS, Aws
from ..balance import SHED_ANYONE_AFTER_S
from ..leases import after_poll_pause_s
from ..logs import JsonLogger
from .acquisition import Acquisition
from .decide import HintAction, choose_hint, hint_age_s, parse_hint
from .hints import SEND_BATCH, Hints
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
        hints: Hints,
        holdings: Holdings,
        acquisition: Acquisition,
        keeper: SessionKeeper,
        takeover: Takeover,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._aws = aws
        self._queue_url = queue_url
        self._log = log
        self._hints = hints
        self._holdings = holdings
        self._acquisition = acquisition
        self._keeper = keeper
        self._takeover = takeover  # a poll that brought hints: connections move (its free scan's backoff resets)
        self._monotonic = monotonic
        self._wall = wall  # epoch seconds, against a hint's SentTimestamp
        self._paused_until = float("-inf")  # no poll of ours starts before (we left a peer's handoff)
        self._named_at = float("-inf")  # when a poll last brought a shed hint naming a worker
        self._ours_at = float("-inf")  # ... and one naming a worker that we took (named for us)

    def held_s(self) -> float:
        """How long before a poll of ours may start (we left a peer's named handoff)."""
        return max(0.0, self._paused_until - self._monotonic())

    def hold_back(self, seconds: float) -> None:
        """No poll of ours starts for ``seconds`` (one of ours left a peer's handoff)."""
        self._paused_until = max(self._paused_until, self._monotonic() + seconds)

    def expecting(self) -> bool:
        """Whether handoffs named for us may be in the queue now: named shed hints are on
        the move (a poll of ours saw one lately; after ``SHED_ANYONE_AFTER_S`` anyone
        takes them) and we are under our target, or we took one lately (a crash's
        drainer names survivors from a fresher read than our summary)."""
        now = self._monotonic()
        if now - self._ours_at < SHED_ANYONE_AFTER_S:
            return True
        return now - self._named_at < SHED_ANYONE_AFTER_S and self._holdings.standing(self._keeper.session_id).under_target()

    async def poll_once(self, *, wait_seconds: int = SQS_WAIT_SECONDS) -> int:
        """One long poll for a START hint; returns how many messages it handled."""
        # Another poll of ours left a peer's handoff. Waited out until none holds us: a
        # poll of ours still in flight may leave another, and hold us back longer, while
        # we wait.
        while (held := self.held_s()) > 0:
            await asyncio.sleep(held)
            if not self._acquisition.accepting():
                # Stopped meanwhile (SIGTERM): a new long poll would only take our own
                # handoffs' hints, and hold them invisible if we exit while it waits.
                return 0
        standing = self._holdings.standing(self._keeper.session_id)
        if standing.room <= 0:
            return 0
        resp = await self._aws.poll(
            self._aws.sqs.receive_message,
            on_abandoned=self._give_back,
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=max(1, min(standing.room, standing.hints_per_poll())),
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp", schema.HINT_TRACE_HEADER],
        )
        messages = resp.get("Messages", [])
        if messages:
            self._takeover.note_work()
        left = await asyncio.gather(*(self._on_hint(m) for m in messages))
        if self._acquisition.accepting():
            pause = after_poll_pause_s(
                got=len(messages), left_named=sum(left), expecting=self.expecting(), load=self._holdings.load()
            )
            if any(left):
                # We left hints for the workers they name: let their polls find them
                # instead of ours (any of them) taking them again.
                self.hold_back(pause)
                self._log.info("polls_paused", left=sum(left), of=len(messages), pause_s=pause)
            await asyncio.sleep(pause)
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

    async def _on_hint(self, message: dict[str, Any]) -> bool:
        """Take the hinted connection, or leave it for a peer (:func:`.decide.choose_hint`).
        True if it was a shed connection left for the worker it names (visible again at once)."""
        hint = parse_hint(message.get("Body", ""))
        connection_id = hint.connection_id
        attributes = message.get("Attributes", {})
        age_s = hint_age_s(attributes, self._wall())
        if hint.shed_to:
            self._named_at = self._monotonic()
        choice = choose_hint(
            hint,
            age_s=age_s,
            accepting=self._acquisition.accepting(),
            busy=connection_id is not None and self._holdings.busy(connection_id),
            ending=connection_id is not None and self._holdings.ending(connection_id),
            standing=self._holdings.standing(self._keeper.session_id),
        )
        keep, targeted = choice.action in (HintAction.KEEP, HintAction.PASS_ON), choice.targeted
        if choice.action is HintAction.BAD:
            self._log.warning("bad_hint", body=message.get("Body", "")[:200])
        if choice.declined_shed:
            self._log.info("shed_hint_left", connection_id=connection_id, shed_to=hint.shed_to, age_s=round(age_s, 2))
        if choice.action in (HintAction.PASS_ON, HintAction.TAKE):
            trace = tracing.valid_header(attributes.get(schema.HINT_TRACE_HEADER), where="hint")
        if choice.action is HintAction.PASS_ON:
            # This one goes only once the new hint is sent.
            keep = not await self._hints.hint(
                connection_id, shed_by=hint.shed_by, from_session=hint.from_session, released=_released(message), trace=trace
            )
            targeted = targeted and keep
            self._log.info("shed_hint_passed_on", connection_id=connection_id, sent=not keep)
        elif choice.action is HintAction.TAKE:
            if choice.named_for_me:
                self._ours_at = self._monotonic()  # not one named for a peer that we take (aged, say)
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
        return targeted


def _released(message: dict[str, Any]) -> dict | None:
    """The state a hint's body carries, as sent (a well-formed body: see :func:`.decide.parse_hint`)."""
    released = json.loads(message["Body"]).get(schema.HINT_RELEASED)
    return released if isinstance(released, dict) else None
