"""Intake of START hints from SQS, and sending hints to peers.

A hint only says "go try to take this one"; the conditional acquire decides. Each worker
keeps ``HINT_POLLERS`` one-message long polls open, so a burst of STARTs is taken in
parallel and a leaving worker's hints spread over every waiting poll in the fleet
instead of all landing in whichever poll returned first; a busier worker pauses a
little before its next poll.

A shed connection named for another worker is left for it (visible again at once). The
queue is shared, so what gets it there fast is the others holding back: a worker whose
poll left one pauses all its polls (:func:`~wsfleet.leases.after_poll_pause_s`): for a
second, or for less when it may be the named worker of other handoffs itself
(:meth:`Intake.expecting`), so that it does not sit out its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from .. import schema, tracing
from ..aws import SQS_WAIT_SECONDS, Aws
from ..balance import SHED_ANYONE_AFTER_S, SHED_TARGET_WAIT_S
from ..leases import after_poll_pause_s
from ..logs import JsonLogger

# Idle, four polls cost 0.4 SQS requests/s per worker.
HINT_POLLERS = 4
SEND_BATCH = 10  # SendMessageBatch's limit


class Intake:
    def __init__(
        self,
        *,
        aws: Aws,
        queue_url: str,
        log: JsonLogger,
        acquire: Callable[..., Awaitable[Any]],
        room: Callable[[], int],
        load: Callable[[], float],
        busy: Callable[[str], bool],
        accepting: Callable[[], bool],
        declines_shed: Callable[[str, str, float, str], bool] = lambda shed_by, shed_to, age_s, from_session: False,
        batch: Callable[[], int] = lambda: 1,
        ending: Callable[[str], bool] = lambda connection_id: False,
        on_hints: Callable[[], None] = lambda: None,
        under_target: Callable[[], bool] = lambda: False,
        me: Callable[[], str] = lambda: "",
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.hints_sent = 0
        self._outbox: list[tuple[dict, str, asyncio.Future]] = []
        self._sending: set[asyncio.Task] = set()
        self._aws = aws
        self._queue_url = queue_url
        self._log = log
        self._acquire = acquire
        self._room = room
        self._load = load
        self._busy = busy
        self._accepting = accepting
        self._declines_shed = declines_shed
        self._batch = batch  # hints per poll
        self._ending = ending  # held here but being released (a STOP, a shed)
        self._on_hints = on_hints  # a poll brought hints: connections are moving (the free scan's backoff resets)
        self._under_target = under_target  # below our exact target (the fleet summary's)
        self._me = me  # our session id
        self._monotonic = monotonic
        self._wall = wall  # epoch seconds, against a hint's SentTimestamp
        self._paused_until = float("-inf")  # no poll of ours starts before (we left a peer's handoff)
        self._named_at = float("-inf")  # when a poll last brought a shed hint naming a worker
        self._ours_at = float("-inf")  # ... and one naming a worker that we took (named for us)

    def held_s(self) -> float:
        """How long before a poll of ours may start (we left a peer's named handoff)."""
        return max(0.0, self._paused_until - self._monotonic())

    def expecting(self) -> bool:
        """Whether handoffs named for us may be in the queue now: named shed hints are on
        the move (a poll of ours saw one lately; after ``SHED_ANYONE_AFTER_S`` anyone
        takes them) and we are under our target, or we took one lately (a crash's
        drainer names survivors from a fresher read than our summary)."""
        now = self._monotonic()
        if now - self._ours_at < SHED_ANYONE_AFTER_S:
            return True
        return now - self._named_at < SHED_ANYONE_AFTER_S and self._under_target()

    async def hint(
        self,
        connection_id: str,
        *,
        shed_by: str = "",
        shed_to: str = "",
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
        continues that trace. Hints asked for in the same turn of the event loop leave
        together, ten to a SendMessageBatch (a drain hints dozens at once). Returns once
        sent (True) or given up (False)."""
        body: dict[str, Any] = {schema.HINT_CONNECTION_ID: connection_id}
        if shed_by:
            body[schema.HINT_SHED_BY] = shed_by
        if shed_to:
            body[schema.HINT_SHED_TO] = shed_to
        if from_session:
            body[schema.HINT_FROM_SESSION] = from_session
        if released:
            body[schema.HINT_RELEASED] = dict(released)
        done = asyncio.get_running_loop().create_future()
        entry = {"MessageBody": json.dumps(body), **schema.hint_trace_attributes(trace or tracing.current_header())}
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
                self.hints_sent += 1
            if not done.done():
                done.set_result(str(n) not in failed)

    async def poll_once(self, *, wait_seconds: int = SQS_WAIT_SECONDS) -> int:
        """One long poll for a START hint; returns how many messages it handled."""
        # Another poll of ours left a peer's handoff. Waited out until none holds us: a
        # poll of ours still in flight may leave another, and hold us back longer, while
        # we wait.
        while (held := self.held_s()) > 0:
            await asyncio.sleep(held)
            if not self._accepting():
                # Stopped meanwhile (SIGTERM): a new long poll would only take our own
                # handoffs' hints, and hold them invisible if we exit while it waits.
                return 0
        room = self._room()
        if room <= 0:
            return 0
        resp = await self._aws.poll(
            self._aws.sqs.receive_message,
            on_abandoned=self._give_back,
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=max(1, min(room, self._batch())),
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp", schema.HINT_TRACE_HEADER],
        )
        messages = resp.get("Messages", [])
        if messages:
            self._on_hints()
        left = await asyncio.gather(*(self._on_hint(m) for m in messages))
        if self._accepting():
            pause = after_poll_pause_s(
                got=len(messages), left_named=sum(left), expecting=self.expecting(), load=self._load()
            )
            if any(left):
                # We left hints for the workers they name: let their polls find them
                # instead of ours (any of them) taking them again.
                self._paused_until = max(self._paused_until, self._monotonic() + pause)
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
        """Take the hinted connection, or leave it for a peer. True if it was a shed
        connection left for the worker it names (visible again at once)."""
        hint = parse_hint(message.get("Body", ""))
        connection_id, shed_by, from_session, shed_to = hint.connection_id, hint.shed_by, hint.from_session, hint.shed_to
        attributes = message.get("Attributes", {})
        receives = int(attributes.get("ApproximateReceiveCount", 1))
        sent_ms = attributes.get("SentTimestamp")
        age_s = max(0.0, self._wall() - int(sent_ms) / 1000) if sent_ms else float(receives - 1)
        keep, later, targeted = False, 0, False
        if shed_to:
            self._named_at = self._monotonic()
        if connection_id is None:
            self._log.warning("bad_hint", body=message.get("Body", "")[:200])
        elif not self._accepting() or (not self._busy(connection_id) and self._room() <= 0):
            keep = True  # no room (or no session) here: give it back to the queue for a peer, now
        elif self._ending(connection_id):
            # A START that came while we release the connection for its STOP (or a shed):
            # it is for whoever takes it once released, us included. Look again shortly.
            keep, later = True, 1
        elif shed_by and not self._busy(connection_id) and self._declines_shed(shed_by, shed_to, age_s, from_session):
            # Shed to rebalance: for the worker it names (SHED_TARGET_WAIT_S), else for one
            # under its share. Past that wait it is no longer left for its named worker: no
            # hold-back of every poll of ours for it, and back in a second like any other.
            keep, targeted = True, bool(shed_to) and age_s < SHED_TARGET_WAIT_S
            later = 0 if targeted else 1
            self._log.info("shed_hint_left", connection_id=connection_id, shed_to=shed_to, age_s=round(age_s, 2))
            if shed_to and shed_to == self._me() and age_s < SHED_TARGET_WAIT_S:
                # Named for us, but we are at our target already (its shedder planned from
                # an older summary): hinted again for nobody in particular, a worker under
                # its share takes it now, instead of after every peer has left it for us
                # SHED_TARGET_WAIT_S. This one goes only once that hint is sent. Not past
                # that wait: it is any under-share worker's already, and a new hint would
                # only start its age again, SHED_ANYONE_AFTER_S later for anyone, past the
                # shedder's claim (worker.handoffs.HANDOFF_CLAIM_S).
                keep = not await self.hint(
                    connection_id,
                    shed_by=shed_by,
                    from_session=from_session,
                    released=_released(message),
                    trace=tracing.valid_header(attributes.get(schema.HINT_TRACE_HEADER), where="hint"),
                )
                targeted = targeted and keep
                self._log.info("shed_hint_passed_on", connection_id=connection_id, sent=not keep)
        elif not self._busy(connection_id):
            # A crash's connection named for a survivor by its drainer is an orphan, not a move.
            source = "orphan" if from_session else "rebalance" if shed_by else "hint"
            trace = tracing.valid_header(attributes.get(schema.HINT_TRACE_HEADER), where="hint")
            if shed_to and shed_to == self._me():
                self._ours_at = self._monotonic()  # not one named for a peer that we take (aged, say)
            await self._acquire(
                connection_id, source=source, expected_session=from_session, known=hint.released, trace_parent=trace
            )
        try:
            if keep:
                await self._aws.call(
                    self._aws.sqs.change_message_visibility,
                    QueueUrl=self._queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=later,
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
    """The state a hint's body carries, as sent (a well-formed body: see :func:`parse_hint`)."""
    released = json.loads(message["Body"]).get(schema.HINT_RELEASED)
    return released if isinstance(released, dict) else None


@dataclass(frozen=True)
class Hint:
    connection_id: str | None  # None when the body is malformed
    shed_by: str = ""  # the shedding session
    from_session: str = ""  # the ENDED session it is still attached to
    shed_to: str = ""  # the session a shed one is meant for
    released: dict | None = None  # the connection item as its clean release left it


def parse_hint(body: str) -> Hint:
    """A hint's body, read leniently: anything malformed beyond the connection id is
    left out (a hint is only ever a suggestion; the conditional acquire decides)."""
    try:
        obj = json.loads(body)
        value = obj.get(schema.HINT_CONNECTION_ID)
        fields = [obj.get(name, "") for name in (schema.HINT_SHED_BY, schema.HINT_FROM_SESSION, schema.HINT_SHED_TO)]
        released = obj.get(schema.HINT_RELEASED)
    except (ValueError, AttributeError):
        return Hint(None)
    if not isinstance(value, str) or not value:
        return Hint(None)
    shed_by, from_session, shed_to = (f if isinstance(f, str) else "" for f in fields)
    return Hint(value, shed_by, from_session, shed_to, schema.item_from_released(value, released))
