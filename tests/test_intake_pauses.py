"""The hint intake's pauses around shed connections named for another worker (issue 22's
socket gap in a join): a poll that left one holds back every poll of its worker, less
when the worker may be named itself, and one named for a worker already at its target is
hinted again for anyone. Against the emulator
queue, with the real :class:`Intake` and :class:`Aws`; the pause rule itself is pure."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

from wsfleet import schema
from wsfleet.aws import Aws
from wsfleet.balance import SHED_ANYONE_AFTER_S, SHED_TARGET_WAIT_S
from wsfleet.config import WorkerConfig
from wsfleet.leases import (
    NAMED_DECLINE_PAUSE_EXPECTING_S,
    NAMED_DECLINE_PAUSE_S,
    after_poll_pause_s,
)
from wsfleet.logs import JsonLogger
from wsfleet.worker.hints import Hints
from wsfleet.worker.holdings import Holdings
from wsfleet.worker.intake import Intake
from wsfleet.worker.summary import FleetSummary


def named(connection_id: str, to: str = "other#1") -> str:
    return json.dumps({schema.HINT_CONNECTION_ID: connection_id, schema.HINT_SHED_BY: "shedder#1", schema.HINT_SHED_TO: to})


class _Standing:
    """Where the worker stands, as each test has it: which shed hints it declines, and
    whether it is under its target."""

    def __init__(self, declines, under: bool, batch: int) -> None:
        self._declines, self._under, self._batch = declines, under, batch
        self.room, self.me = 10, "me#1"

    def declines_shed(self, shed_by: str, shed_to: str = "", age_s: float = 0.0, from_session: str = "") -> bool:
        return self._declines(shed_by, shed_to, age_s, from_session)

    def under_target(self) -> bool:
        return self._under

    def hints_per_poll(self) -> int:
        return self._batch


class _Holdings(Holdings):
    """Nothing held (room for 10), standing as the test says."""

    def __init__(self, standing: _Standing) -> None:
        super().__init__(max_connections=10, summary=FleetSummary())
        self._standing = standing

    def standing(self, me: str) -> _Standing:
        return self._standing


def intake(
    aws: Aws,
    cfg: WorkerConfig,
    taken: list[str],
    *,
    under: bool = False,
    clock=time.monotonic,
    wall=time.time,
    # a named one is its target's (us only if named so), any other ours
    declines=lambda shed_by, shed_to, age_s, from_session: bool(shed_to) and shed_to != "me#1",
    batch: int = 10,
    accepting=lambda: True,
    hints: Hints | None = None,
) -> Intake:
    async def acquire(connection_id: str, **_) -> None:
        taken.append(connection_id)

    return Intake(
        aws=aws,
        queue_url=cfg.queue_url,
        log=JsonLogger(),
        hints=hints or Hints(aws=aws, queue_url=cfg.queue_url, log=JsonLogger()),
        holdings=_Holdings(_Standing(declines, under, batch)),
        acquisition=SimpleNamespace(try_acquire=acquire, accepting=accepting),
        keeper=SimpleNamespace(session_id="me#1"),
        takeover=SimpleNamespace(note_work=lambda: None),
        monotonic=clock,
        wall=wall,
    )


def test_the_pause_after_a_poll_that_left_a_named_handoff():
    assert after_poll_pause_s(got=3, left_named=1, expecting=False, load=0.0) == NAMED_DECLINE_PAUSE_S
    assert after_poll_pause_s(got=3, left_named=1, expecting=True, load=0.0) == NAMED_DECLINE_PAUSE_EXPECTING_S
    assert after_poll_pause_s(got=0, left_named=0, expecting=False, load=1.0) == 0.0
    assert 0 <= after_poll_pause_s(got=2, left_named=0, expecting=False, load=1.0) <= 0.5  # took them: the load's
    assert NAMED_DECLINE_PAUSE_EXPECTING_S < NAMED_DECLINE_PAUSE_S <= 1.0  # a START elsewhere waits at most ~1 s


def test_a_poll_that_left_a_named_handoff_holds_back_every_poll_of_its_worker(aws_env, sqs):
    """Regression: only the poll that left it paused (and only when it left everything it
    got), so the worker's other polls took the handoff again at once, in batches of ten,
    for ~1.3 s before its named worker's poll got it."""
    cfg = WorkerConfig.from_env(aws_env)
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("n1"))
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=json.dumps({schema.HINT_CONNECTION_ID: "s1"}))

    async def scenario():
        aws = Aws(cfg, threads=4)
        taken: list[str] = []
        me = intake(aws, cfg, taken)
        try:
            first = asyncio.create_task(me.poll_once(wait_seconds=1))
            deadline = time.monotonic() + 10
            while me.held_s() <= 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert taken == ["s1"] and me.held_s() > 0
            # The first poll took the START, left n1 for other#1 and is pausing. Another
            # poller of ours starting now must not receive until the pause ends.
            began = time.monotonic()
            second = asyncio.create_task(me.poll_once(wait_seconds=0))
            # meanwhile the named worker's poll finds it visible again at once
            got = await asyncio.to_thread(sqs.receive_message, QueueUrl=cfg.queue_url, WaitTimeSeconds=1)
            assert [json.loads(m["Body"])[schema.HINT_CONNECTION_ID] for m in got.get("Messages", [])] == ["n1"]
            assert aws.requests["sqs.ReceiveMessage"] == 1  # our second poll has not polled yet
            await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
            assert time.monotonic() - began >= NAMED_DECLINE_PAUSE_S * 0.8
            assert aws.requests["sqs.ReceiveMessage"] == 2 and taken == ["s1"]
        finally:
            aws.close()

    asyncio.run(scenario())


def test_a_worker_that_may_be_named_itself_holds_its_polls_back_less(aws_env, sqs):
    """Regression: every poll that left a peer's handoff sat out a whole second, the
    named workers' own polls included: in a join of 4, each new worker left the others'
    handoffs and sat out its own, and one shedder's 12 waited ~1 s for their target."""
    cfg = WorkerConfig.from_env(aws_env)
    now = [1000.0]

    async def scenario():
        aws = Aws(cfg, threads=4)
        taken: list[str] = []
        under = intake(aws, cfg, taken, under=True, clock=lambda: now[0])
        at_target = intake(aws, cfg, taken, under=False, clock=lambda: now[0])
        try:
            assert not under.expecting()  # no named hint seen: nothing on the move for us
            sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("n1", to="other#1"))
            assert await under.poll_once(wait_seconds=1) == 1 and not taken
            assert under.expecting() and under.held_s() == pytest.approx(NAMED_DECLINE_PAUSE_EXPECTING_S)
            sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("n2", to="other#1"))
            got = await at_target.poll_once(wait_seconds=1)
            assert got >= 1 and not taken and not at_target.expecting()  # not under its target
            assert at_target.held_s() == pytest.approx(NAMED_DECLINE_PAUSE_S)
            now[0] += SHED_ANYONE_AFTER_S  # named hints are anyone's after this: nothing to expect
            assert not under.expecting()
            # Not under target by our summary, but we took one named for us (a crash's
            # drainer names survivors from a fresher read): more may be named for us.
            sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("n3", to="me#1"))
            while "n3" not in taken:
                await at_target.poll_once(wait_seconds=1)
            assert at_target.expecting()
            now[0] += SHED_ANYONE_AFTER_S
            assert not at_target.expecting()
        finally:
            aws.close()

    asyncio.run(scenario())


def test_a_handoff_named_for_a_worker_already_at_its_target_is_hinted_again_for_anyone(aws_env, sqs):
    """Regression: a shedder planning from an older summary named a worker that had
    filled up meanwhile; it left the handoff, and so did every peer (named for another)
    for SHED_TARGET_WAIT_S, before one under its share took it: a 2.4 s socket gap."""
    cfg = WorkerConfig.from_env(aws_env)
    released = {schema.FENCE_TOKEN: 3, schema.WS_URL: "ws://u/n1", schema.LAST_SEQ: 7, schema.LEASE_SESSION: "shedder#1"}
    body = json.loads(named("n1", to="me#1"))
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=json.dumps({**body, schema.HINT_RELEASED: released}))

    async def scenario():
        aws = Aws(cfg, threads=4)
        taken: list[str] = []
        # at our target: we leave every shed one
        full = intake(aws, cfg, taken, declines=lambda shed_by, shed_to, age_s, from_session: True, batch=1)
        try:
            assert await full.poll_once(wait_seconds=1) == 1 and not taken
            assert full.held_s() == 0  # nothing left named for a peer: no pause
        finally:
            aws.close()

    asyncio.run(scenario())
    got = sqs.receive_message(QueueUrl=cfg.queue_url, WaitTimeSeconds=1, MaxNumberOfMessages=10).get("Messages", [])
    assert [json.loads(m["Body"]) for m in got] == [
        {schema.HINT_CONNECTION_ID: "n1", schema.HINT_SHED_BY: "shedder#1", schema.HINT_RELEASED: released}
    ]  # the named one gone, the same handoff hinted for anyone under its share


def test_a_held_poll_waits_out_a_hold_back_lengthened_while_it_waited(aws_env, sqs):
    """Regression: a poll that started while held slept once, for the hold as it stood
    then, and polled when that ended although another poll of ours (one in flight when
    the hold began) had left a peer's handoff meanwhile and held the worker longer."""
    cfg = WorkerConfig.from_env(aws_env)
    now = [1000.0]

    async def scenario():
        aws = Aws(cfg, threads=4)
        me = intake(aws, cfg, [], clock=lambda: now[0])
        try:
            me.hold_back(0.2)  # a poll of ours left a peer's handoff
            held = asyncio.create_task(me.poll_once(wait_seconds=0))
            await asyncio.sleep(0.05)
            me.hold_back(1.0)  # ... and another, still in flight then
            await asyncio.sleep(0.6)  # past the first hold's end, well before the second's
            assert aws.requests["sqs.ReceiveMessage"] == 0 and not held.done()
            now[0] += 1.0  # the second hold is over
            assert await asyncio.wait_for(held, timeout=10) == 0
            assert aws.requests["sqs.ReceiveMessage"] == 1
        finally:
            aws.close()

    asyncio.run(scenario())


def test_a_poll_held_back_when_the_worker_stops_does_not_poll(aws_env, sqs):
    """Regression: a poll held back when SIGTERM came polled once its hold ended (a long
    poll begun after the stop), taking the leaving worker's own handoff hints, which a
    poll in flight when the process exits leaves invisible for the visibility timeout."""
    cfg = WorkerConfig.from_env(aws_env)
    accepting = [True]

    async def scenario():
        aws = Aws(cfg, threads=4)
        me = intake(aws, cfg, [], declines=lambda *_: False, batch=1, accepting=lambda: accepting[0])
        try:
            me.hold_back(0.2)  # a poll of ours left a peer's handoff
            held = asyncio.create_task(me.poll_once(wait_seconds=1))
            await asyncio.sleep(0.05)
            accepting[0] = False  # SIGTERM
            assert await asyncio.wait_for(held, timeout=10) == 0
            assert aws.requests["sqs.ReceiveMessage"] == 0
        finally:
            aws.close()

    asyncio.run(scenario())


def test_taking_a_handoff_named_for_a_peer_does_not_make_us_expect_our_own(aws_env, sqs):
    """Regression: any named hint we took counted as one named for us, so a worker at its
    target that took a peer's (past SHED_ANYONE_AFTER_S, when anyone does) expected
    handoffs of its own for SHED_ANYONE_AFTER_S and held its polls back 0.3 s instead of
    a second after leaving a peer's."""
    cfg = WorkerConfig.from_env(aws_env)
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("n1", to="other#1"))

    async def scenario():
        aws = Aws(cfg, threads=4)
        taken: list[str] = []
        # anyone's by now: we take it
        me = intake(aws, cfg, taken, declines=lambda shed_by, shed_to, age_s, from_session: False, batch=1)
        try:
            assert await me.poll_once(wait_seconds=1) == 1 and taken == ["n1"]
            assert not me.expecting()
        finally:
            aws.close()

    asyncio.run(scenario())


def test_a_peer_s_handoff_past_its_target_wait_is_left_like_any_shed_one(aws_env, sqs):
    """Regression: a handoff named for a peer was left for it (visible again at once, every
    poll of ours held back a second) for as long as we declined it, also past
    SHED_TARGET_WAIT_S, when it is for any worker under its share: one named for a
    worker that went away bounced through the fleet's polls at once, holding each poll
    that met it back, until SHED_ANYONE_AFTER_S."""
    cfg = WorkerConfig.from_env(aws_env)
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("young", to="other#1"))

    async def scenario(age_s: float) -> tuple[float, list]:
        aws = Aws(cfg, threads=4)
        # at our target: we decline every peer's handoff; the hint seen age_s after it was sent
        me = intake(aws, cfg, [], clock=lambda: 1000.0, wall=lambda: time.time() + age_s)
        try:
            assert await asyncio.wait_for(me.poll_once(wait_seconds=1), timeout=10) == 1
            again = await asyncio.to_thread(sqs.receive_message, QueueUrl=cfg.queue_url, WaitTimeSeconds=0)
            return me.held_s(), again.get("Messages", [])
        finally:
            aws.close()

    held, again = asyncio.run(scenario(0.0))
    assert held == NAMED_DECLINE_PAUSE_S and [json.loads(m["Body"])[schema.HINT_CONNECTION_ID] for m in again] == ["young"]
    sqs.delete_message(QueueUrl=cfg.queue_url, ReceiptHandle=again[0]["ReceiptHandle"])
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=named("aged", to="other#1"))
    held, again = asyncio.run(scenario(SHED_TARGET_WAIT_S + 0.5))
    assert held == 0 and again == []  # not held back, and not visible again at once
    got = sqs.receive_message(QueueUrl=cfg.queue_url, WaitTimeSeconds=3).get("Messages", [])
    assert [json.loads(m["Body"])[schema.HINT_CONNECTION_ID] for m in got] == ["aged"]  # a second later


def test_a_handoff_named_for_us_at_our_target_is_not_hinted_again_past_its_target_wait(aws_env, sqs):
    """Regression: the handoff was hinted again for anyone whatever its age. Past
    SHED_TARGET_WAIT_S it is any under-share worker's already, and the new hint only
    started its age again: anyone took it SHED_ANYONE_AFTER_S after the pass-on, up to
    ~8 s after the release, when the shedder frees what is unclaimed (HANDOFF_CLAIM_S)."""
    cfg = WorkerConfig.from_env(aws_env)
    body = named("n1", to="me#1")
    sqs.send_message(QueueUrl=cfg.queue_url, MessageBody=body)

    async def scenario() -> int:
        aws = Aws(cfg, threads=4)
        hints = Hints(aws=aws, queue_url=cfg.queue_url, log=JsonLogger())
        full = intake(  # at our target: we leave every shed one
            aws, cfg, [], declines=lambda shed_by, shed_to, age_s, from_session: True, batch=1,
            wall=lambda: time.time() + SHED_TARGET_WAIT_S + 0.5, hints=hints,
        )
        try:
            assert await full.poll_once(wait_seconds=1) == 1
            return hints.sent
        finally:
            aws.close()

    assert asyncio.run(scenario()) == 0  # not hinted again
    got = sqs.receive_message(QueueUrl=cfg.queue_url, WaitTimeSeconds=3, MaxNumberOfMessages=10).get("Messages", [])
    assert [m["Body"] for m in got] == [body]  # the named one left (back in a second), as a peer would
