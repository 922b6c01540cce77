"""The worker's side of a handoff to a named peer (a STOP that finds it handed off, an
unclaimed one given back to the free pool, a shed taken by a peer in one transaction)
and the free scan's backoff, in-process against the emulator."""

from __future__ import annotations

import asyncio
import io
import json
import time
from types import SimpleNamespace

import pytest

from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.logs import JsonLogger
from wsfleet.store import ConnectionsStore

from wsfleet.router import Router

from tests.conftest import open_sessions
from tests.test_worker import config, eventually, post, running, seqs

pytestmark = pytest.mark.slow


@pytest.fixture
def events(aws_env, ddb, sqs):
    """The event router (POST /events), as tests.test_worker's ``router``."""
    return Router.from_env({**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"}, ddb=ddb, sqs=sqs)


async def _holding(worker, conns: ConnectionsStore, msgs, cid: str, url: str) -> None:
    """``cid`` started with no hint, taken by ``worker``'s own free scan, storing."""
    conns.start(cid, url)
    await worker.takeover.reconcile_once()
    await eventually(lambda: len(seqs(msgs, cid)) >= 3, what="storing")


def _handed_by(conns: ConnectionsStore, cid: str, session_id: str) -> bool:
    item = conns.get(cid)
    return bool(item) and item.get("lease_session") == session_id and item.get("released_fence") == item["fence_token"]


def test_a_stop_for_a_connection_handed_off_and_not_yet_taken_ends_it_stopped_and_free(
    aws_env, stores, sessions, upstream, events
):
    conns, msgs = stores

    async def scenario():
        # RECONCILE_SECONDS 60: the owner-index audit (every 3 of them) cannot be what frees it
        async with running(config(aws_env, RECONCILE_SECONDS="60")) as worker:
            await _holding(worker, conns, msgs, "c1", upstream.url_for("c1"))
            session_id = worker.keeper.session_id
            # Nobody else runs to claim it: a long claim window keeps it pending however slow
            # the machine (at the default 8 s a loaded machine saw it given up before the STOP).
            worker.handoffs._claim_s = 120.0
            worker.holdings.runners["c1"].request_shed()
            # Handed off in the table, then in its books: the release's answer is read after
            # it lands, so a poll may see the one before the other.
            await eventually(
                lambda: _handed_by(conns, "c1", session_id) and worker.handoffs.pending("c1"), what="handed off"
            )
            # our owner-index audit sees it attached to us and leaves it for its taker
            assert await worker.acquisition.audit_once() == 0 and _handed_by(conns, "c1", session_id)
            assert await asyncio.to_thread(post, events, {"event_type": "STOP", "connection_id": "c1"}) == 202
            # Freed in the table, then forgotten here: the releaser's write lands before it
            # drops the handoff from its books, so a poll may see the one and not yet the other.
            item = await eventually(
                lambda: (i := conns.get("c1"))["lease_session"] == "" and not worker.handoffs.pending("c1") and i,
                timeout=5, what="freed by its releaser and forgotten",
            )
            assert item["desired_state"] == schema.STOPPED and "owner_key" not in item
            assert "c1" not in worker.holdings.runners

    asyncio.run(scenario())


def test_a_handoff_nobody_claims_is_freed_into_the_free_pool_and_hinted_then_taken(aws_env, stores, upstream):
    conns, msgs = stores

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60")) as worker:
            await _holding(worker, conns, msgs, "c1", upstream.url_for("c1"))
            worker.handoffs._claim_s = 0.5  # nobody else runs: a shed of ours is never claimed
            worker.holdings.runners["c1"].request_shed()
            # Freed and hinted as free after the claim time; this worker then takes it back
            # itself (its shed hint it declined, the free one it may take).
            await eventually(lambda: worker.counters.total(names.HANDOFFS_UNCLAIMED) == 1, what="given up")
            await eventually(lambda: "c1" in worker.holdings.runners, what="taken again from the free hint")
            assert conns.get("c1")["fence_token"] == 2

    asyncio.run(scenario())


def test_a_leaving_workers_connection_is_taken_by_a_peer_from_the_hint_pinned_to_its_handoff(
    aws_env, stores, upstream
):
    conns, msgs = stores
    cfg = config(aws_env, RECONCILE_SECONDS="60", REBALANCE="false")

    async def scenario():
        async with running(cfg, "w1") as w1, running(cfg, "w2") as w2:
            await eventually(lambda: w1.takeover.idle_scans and w2.takeover.idle_scans, what="first scans done")
            await _holding(w1, conns, msgs, "c1", upstream.url_for("c1"))  # w2 has scanned already
            released_by = w1.keeper.session_id
            w1.request_shutdown()  # SIGTERM: handed off to a peer, its session ended after
            await eventually(lambda: "c1" in w2.holdings.runners, timeout=10, what="taken by w2")
            item = conns.get("c1")
            assert item["lease_session"] == w2.keeper.session_id and item["fence_token"] == 2
            assert "released_fence" not in item and item["last_seq"] >= 3
            assert w2.holdings.runners["c1"].fence_token == 2
            assert released_by != item["lease_session"]

    asyncio.run(scenario())


def test_the_free_scan_backs_off_while_it_finds_nothing_and_a_hint_cuts_its_pause_short(
    aws_env, stores, sqs
):
    conns, _ = stores
    cfg = config(aws_env, RECONCILE_SECONDS="1")

    async def scenario():
        async with running(cfg) as worker:
            # Empty scans at about 0, 1, 3 s: the pause after the third is 6-8 s.
            await eventually(lambda: worker.takeover.idle_scans >= 3, timeout=10, what="three empty scans")
            conns.start("lost", "ws://127.0.0.1:9/quiet")  # a START whose hint was lost
            await asyncio.sleep(0.3)
            assert "lost" not in worker.holdings.runners and worker.takeover.idle_scans >= 3  # still backing off
            # A hint (for another connection) says there is work: the pause is cut to one
            # RECONCILE_SECONDS at most, and the scan finds the lost one.
            hinted = time.monotonic()
            await asyncio.to_thread(
                sqs.send_message, QueueUrl=aws_env["QUEUE_URL"], MessageBody=json.dumps({"connection_id": "nope"})
            )
            await eventually(lambda: "lost" in worker.holdings.runners, timeout=10, what="found by the scan")
            took = time.monotonic() - hinted
            assert took < 4.0, took  # not the 6-8 s left of the backed-off pause
            assert worker.takeover.idle_scans == 0

    asyncio.run(scenario())


def test_a_free_scan_starts_after_an_id_seen_before(aws_env, stores):
    conns, _ = stores
    cids = [f"p{i:02d}" for i in range(30)]
    for cid in cids:
        conns.start(cid, "ws://127.0.0.1:9/quiet")

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60", MAX_CONNECTIONS="2")) as worker:
            await eventually(lambda: worker.holdings.taken() >= 1, what="a first scan")
            points = set(worker.takeover._scan_points)
            assert points and points <= set(cids)
            assert {worker.takeover._start_point() for _ in range(50)} <= points | set(worker.holdings.runners)

    asyncio.run(scenario())


def test_a_sigterm_whose_last_handoffs_are_not_taken_yet_leaves_its_session_for_them_without_a_warning(
    aws_env, stores, sessions, upstream
):
    conns, msgs = stores
    out = io.StringIO()

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60"), log=JsonLogger(out)) as worker:
            await _holding(worker, conns, msgs, "c1", upstream.url_for("c1"))
            return worker.keeper.session_id

    session_id = asyncio.run(scenario())  # nobody else runs: nobody takes its handoff
    events = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    (left,) = [e for e in events if e["event"].startswith("session_left_in_ring")]
    assert (left["event"], left["level"], left["handed"]) == ("session_left_in_ring_for_its_handoffs", "info", 1)
    assert sessions.get(session_id)["ring"] == schema.RING_VALUE and _handed_by(conns, "c1", session_id)


def test_a_shed_taken_by_a_peer_or_given_back_is_forgotten_by_the_releasers_attachments(
    aws_env, ddb, stores, upstream
):
    """A handoff stays attached to our session until someone takes it, so the release
    does not settle it; once the handoffs see it taken (or give it back), nothing of our
    session's is left to check for it: a long-lived worker's every shed must not pile up
    in what its exit reads."""
    conns, msgs = stores
    open_sessions(ddb, aws_env, "peer#1")

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60", REBALANCE="false")) as worker:
            worker.handoffs._hints = SimpleNamespace(hint=_no_hint)  # what it gives back is not hinted, so not taken again here
            for cid in ("c1", "c2"):
                await _holding(worker, conns, msgs, cid, upstream.url_for(cid))
                worker.holdings.runners[cid].request_shed()
            session_id = worker.keeper.session_id
            await eventually(lambda: _handed_by(conns, "c1", session_id) and _handed_by(conns, "c2", session_id), what="handed")
            assert all(worker.attachments.maybe_attached(c) for c in ("c1", "c2"))  # still attached to us: checked at exit
            conns.acquire("c1", session_id="peer#1", worker_id="peer")  # c1 taken by a peer
            worker.handoffs._claim_s = 0.0  # c2 given back to the free pool
            await worker.handoffs.check_once()
            # The worker's own handoffs loop may be in a check of its own meanwhile (the
            # give-back is conditional: one of the two lands): wait for it, not for ours.
            await eventually(
                lambda: conns.get("c2")["lease_session"] == "" and not len(worker.handoffs), what="c2 given back"
            )
            assert not any(worker.attachments.maybe_attached(c) for c in ("c1", "c2"))

    asyncio.run(scenario())


async def _no_hint(*_args, **_kwargs) -> None:
    return None
