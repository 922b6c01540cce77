"""The worker against real upstream kinds (the local upstream's auth, subscribe, shapes
and no-replay streams) and the emulator's Secrets Manager, in-process: credentials
fetched, rotated and revoked; a refusal is a long wait, not a storm; resume by the open
message and no resume at all; frames of other shapes. Secret values are looked for in
every log line and every item."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from sim import emf as sim_emf
from wsfleet import metrics_names as names
from wsfleet import schema
from sim.secrets import put_secret
from sim.upstream import ThreadedUpstream
from wsfleet.logs import JsonLogger
from wsfleet.store import marshal

from tests.test_worker import config, seqs
from tests.test_worker import running as _running
from tests.test_worker import eventually as _eventually


async def eventually(predicate, timeout: float = 45.0, what: str = "condition"):
    """tests.test_worker's poll with a deadline for a busy machine: these waits span
    handshakes, Secrets Manager calls and the writer's flush, several processes' worth
    of work on two shared cores (no time is asserted)."""
    return await _eventually(predicate, timeout=timeout, what=what)


def running(cfg, log: JsonLogger, worker_id: str = "w1", *, refused_retry_s: float | None = None):
    """tests.test_worker's running worker, logging to ``log`` (the captured lines)."""
    return _running(cfg, worker_id, log=log, refused_retry_s=refused_retry_s)


pytestmark = pytest.mark.slow

AUTH = "X-Api-Key"


@pytest.fixture
def quiet_upstream():
    """An upstream that produces only what the test publishes."""
    with ThreadedUpstream(rate=None) as up:
        yield up


@pytest.fixture
def lively_upstream():
    with ThreadedUpstream(rate=20.0) as up:
        yield up


def start(conns, ddb, aws_env, cid: str, url: str, upstream: dict | None = None) -> None:
    """A START with an upstream object, as the router stores it (Upstream.item())."""
    conns.start(cid, url)
    if upstream:
        ddb.update_item(
            TableName=aws_env["TABLE_NAME"],
            Key=marshal({schema.PK: schema.connection_pk(cid)}),
            UpdateExpression="SET upstream = :u",
            ExpressionAttributeValues=marshal({":u": upstream}),
        )


def every_item(ddb, aws_env) -> str:
    """Every item of the three tables, as text."""
    out = []
    for table in ("TABLE_NAME", "SESSIONS_TABLE_NAME", "MESSAGES_TABLE_NAME"):
        out += ddb.scan(TableName=aws_env[table])["Items"]
    return json.dumps(out)


def secret_arn(emulator, value: str) -> tuple[str, str]:
    name = f"test/{uuid.uuid4().hex[:8]}"
    return name, put_secret(emulator.endpoint_url, name, value)


def test_a_rotated_credential_is_fetched_again_after_one_refusal_and_the_stream_goes_on(
    emulator, aws_env, stores, ddb, lively_upstream, captured
):
    conns, msgs = stores
    up = lively_upstream
    old, new = f"old-{uuid.uuid4().hex}", f"new-{uuid.uuid4().hex}"
    up.set_credentials([old])
    name, arn = secret_arn(emulator, json.dumps({"key": old}))
    start(conns, ddb, aws_env, "a", up.url_for("a") + f"?auth_header={AUTH}", {"secret_headers": {AUTH: f"{arn}#key"}})

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream)) as worker:
            await eventually(lambda: len(seqs(msgs, "a")) >= 5, what="frames with the first credential")
            assert worker.counters.total(names.SECRET_FETCHES) == 1
            put_secret(emulator.endpoint_url, name, json.dumps({"key": new}))  # rotated
            up.set_credentials([new])  # and the old one revoked
            up.drop("a")  # the next handshake uses the cached (old) value: 403
            before = len(up.sockets("a"))
            await eventually(lambda: len(up.sockets("a")) > before, what="connected again")
            stored = len(seqs(msgs, "a"))
            await eventually(lambda: len(seqs(msgs, "a")) >= stored + 5, what="frames with the new credential")
            assert worker.counters.total(names.SECRET_FETCHES) == 2  # one more GetSecretValue, once
            assert worker.counters.total(names.UPSTREAM_REFUSALS) == 0  # the retry at once worked
            assert not worker.holdings.runners["a"].refused

    asyncio.run(scenario())
    assert up.refusals("a") == {403: 1}
    stored = seqs(msgs, "a")
    assert stored == list(range(1, len(stored) + 1))  # nothing missed across the rotation
    assert schema.LAST_ERROR not in conns.get("a")
    text = captured.lines() + every_item(ddb, aws_env)
    assert old not in text and new not in text


def test_a_revoked_credential_is_refused_twice_then_waited_out_not_stormed(
    emulator, aws_env, stores, sessions, ddb, lively_upstream, captured
):
    conns, msgs = stores
    up = lively_upstream
    revoked = f"revoked-{uuid.uuid4().hex}"
    up.set_credentials(["something-else"])
    _, arn = secret_arn(emulator, revoked)
    start(conns, ddb, aws_env, "r", up.url_for("r") + f"?auth_header={AUTH}", {"secret_headers": {AUTH: arn}})
    start(conns, ddb, aws_env, "ok", up.url_for("ok"))  # a stream beside it: the test's clock

    async def scenario():
        # The default wait (60 s): while another stream stores 40 frames (2 s at 20/s),
        # the refused one tries once (two handshakes: the refusal and the retry after
        # fetching again), not the 13-17 of a reconnect backoff.
        async with running(config(aws_env), JsonLogger(captured.stream)) as worker:
            await eventually(lambda: schema.LAST_ERROR in (conns.get("r") or {}), what="last_error")
            first = len(seqs(msgs, "ok"))
            await eventually(lambda: len(seqs(msgs, "ok")) >= first + 40, timeout=30, what="40 more frames beside")
            assert up.refusals("r") == {403: 2}
            assert worker.counters.total(names.UPSTREAM_REFUSALS) == 1
            assert worker.counters.total(names.SECRET_FETCHES) == 2  # the first fetch and the one after the 403
            assert worker.holdings.runners["r"].refused and not worker.holdings.runners["r"].connected.is_set()
            # A STOP cuts the wait short: released at once, not after 60 s.
            await asyncio.to_thread(conns.stop, "r", sessions=sessions)
            await eventually(lambda: "r" not in worker.holdings.runners, timeout=10, what="the STOP during the wait")

    asyncio.run(scenario())
    item = conns.get("r")
    assert item[schema.LAST_ERROR] == "the upstream refused the handshake: HTTP 403"
    assert item[schema.LAST_ERROR_AT_MS] > 0 and item["lease_session"] == ""
    assert seqs(msgs, "r") == []
    refused = captured.events("upstream_refused")
    assert len(refused) == 1 and refused[0]["connection_id"] == "r"
    assert revoked not in captured.lines() + every_item(ddb, aws_env)


def test_refused_connections_try_again_once_per_wait_and_are_gauged(
    emulator, aws_env, stores, ddb, lively_upstream, captured
):
    conns, _ = stores
    up = lively_upstream
    up.set_credentials(["accepted"])
    start(conns, ddb, aws_env, "n", up.url_for("n") + f"?auth_header={AUTH}")  # no credential at all: 401

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream), refused_retry_s=0.3) as worker:
            await eventually(lambda: worker.counters.total(names.UPSTREAM_REFUSALS) >= 4, what="four refusals")
            await worker.report.publish_metrics_once(count_unowned=False)
            tries = sum(up.refusals("n").values())
            refusals = worker.counters.total(names.UPSTREAM_REFUSALS)
            # Nothing to fetch again: each try is one handshake, then the wait.
            assert refusals <= tries <= refusals + 1
            assert worker.counters.total(names.SECRET_FETCHES) == 0
        points = sim_emf.from_log(captured.events("metrics"))
        gauges = [p.value for p in points if p.name == names.REFUSED_CONNECTIONS]
        assert gauges and gauges[0] == 1.0

    asyncio.run(scenario())
    assert set(up.refusals("n")) == {401}
    assert conns.get("n")[schema.LAST_ERROR] == "the upstream refused the handshake: HTTP 401"


def test_a_secret_that_cannot_be_read_is_a_refusal_naming_the_arn(emulator, aws_env, stores, ddb, lively_upstream, captured):
    conns, _ = stores
    _, arn = secret_arn(emulator, "not json at all")
    start(conns, ddb, aws_env, "k", lively_upstream.url_for("k") + f"?auth_header={AUTH}", {"secret_headers": {AUTH: f"{arn}#key"}})

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream), refused_retry_s=30) as worker:
            await eventually(lambda: schema.LAST_ERROR in (conns.get("k") or {}), what="last_error")
            assert worker.counters.total(names.UPSTREAM_REFUSALS) == 1

    asyncio.run(scenario())
    error = conns.get("k")[schema.LAST_ERROR]
    assert arn in error and "'key'" in error and "not json at all" not in error
    assert lively_upstream.sockets("k") == [] and lively_upstream.refusals("k") == {}  # never sent a handshake


def test_open_message_resume_continues_with_no_gap_and_no_double_across_a_reconnect_and_a_takeover(
    aws_env, stores, ddb, lively_upstream, captured
):
    """subscribe=1, nested frames, resume only in the open message: after a drop and
    after a takeover by another worker, each socket subscribes from the next seq."""
    conns, msgs = stores
    up = lively_upstream
    url = up.url_for("s") + "?subscribe=1&shape=nested&subprotocol=feed.v1"
    upstream = {
        "subprotocols": ["feed.v1"],
        "open_message": '{"op":"subscribe","stream":"s","from_seq":{from_seq}}',
        "resume": "open_message",
        "seq_pointer": "/meta/sequence",
        "data_pointer": "/payload",
    }
    start(conns, ddb, aws_env, "s", url, upstream)

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream), "w1"):
            await eventually(lambda: len(seqs(msgs, "s")) >= 10, what="frames")
            up.drop("s")
            await eventually(lambda: len(up.sockets("s")) >= 2, what="the reconnect")
            n = len(seqs(msgs, "s"))
            await eventually(lambda: len(seqs(msgs, "s")) >= n + 10, what="frames after the reconnect")
        async with running(config(aws_env), JsonLogger(captured.stream), "w2"):
            n = len(seqs(msgs, "s"))
            await eventually(lambda: len(seqs(msgs, "s")) >= n + 10, what="frames after the takeover")

    asyncio.run(scenario())
    rows = msgs.read_all("s")
    assert [r["sk"] for r in rows] == list(range(1, len(rows) + 1))
    assert not any(schema.SKIPPED in r for r in rows)  # no gap, nothing skipped
    expected = up.expected_data("s")
    assert all(r[schema.MESSAGE_DATA] == expected[r["sk"]] for r in rows)  # the payload, not the envelope
    sockets = up.sockets("s")
    assert len(sockets) >= 3 and all(s.subprotocol == "feed.v1" for s in sockets)
    for before, after in zip(sockets, sockets[1:], strict=False):
        # Each socket subscribed right after what the one before had delivered: no double.
        assert after.subscribed_from == before.last_seq_sent + 1
        assert "from_seq" not in after.path  # the resume point only in the open message


def test_resume_none_stores_exactly_the_missed_range_as_one_gap_marker_and_starts_where_the_upstream_is(
    aws_env, stores, ddb, quiet_upstream, captured
):
    conns, msgs = stores
    up = quiet_upstream
    up.create_stream("x", shape="flat")
    for _ in range(3):
        up.publish("x")  # before anyone listens: never asked for, no marker
    start(conns, ddb, aws_env, "x", up.url_for("x") + "?replay=none&shape=flat", {
        "resume": "none", "seq_pointer": "/u", "data_pointer": "",
    })

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream)) as worker:
            await eventually(lambda: up.open_sockets("x"), what="connected")
            for _ in range(4):
                up.publish("x")  # 4..7
            await eventually(lambda: seqs(msgs, "x")[-1:] == [7], what="4..7 stored")
            assert conns.get("x")["last_seq"] >= 3  # the start, checkpointed before 4 was queued
            up.drop("x")
            await eventually(lambda: not up.open_sockets("x"), what="dropped")
            for _ in range(5):
                up.publish("x")  # 8..12, unless the worker is back already
            await eventually(lambda: up.open_sockets("x"), what="connected again")
            for _ in range(3):
                up.publish("x")
            await eventually(lambda: seqs(msgs, "x")[-1:] == [15], what="all stored")
            missed = worker.counters.total(names.MISSED_SEQS)
        return missed

    missed = asyncio.run(scenario())
    first, second = up.sockets("x")[:2]
    assert first.first_seq_sent == 4 and first.last_seq_sent == 7
    gap = range(first.last_seq_sent + 1, second.first_seq_sent)  # what nobody was sent, from the books
    rows = {r["sk"]: r for r in msgs.read_all("x")}
    assert min(rows) == 4  # 1..3 were before the stream started for us: no marker
    markers = [r for r in rows.values() if schema.SKIPPED in r]
    if gap:
        assert [(m["sk"], m[schema.SKIP_TO], m[schema.SKIPPED]) for m in markers] == [
            (gap[0], gap[-1], schema.SKIPPED_UPSTREAM_GAP)
        ]
    else:
        assert markers == []
    assert missed == len(gap)
    expected = up.expected_data("x")
    assert all(rows[s][schema.MESSAGE_DATA] == expected[s] for s in rows if schema.SKIPPED not in rows[s])
    assert json.loads(rows[4][schema.MESSAGE_DATA])["u"] == 4  # the whole frame is the data


def test_a_nested_seq_pointer_and_a_whole_frame_data_pointer(aws_env, stores, ddb, lively_upstream, captured):
    conns, msgs = stores
    up = lively_upstream
    start(conns, ddb, aws_env, "nest", up.url_for("nest") + "?shape=nested",
          {"seq_pointer": "/meta/sequence", "data_pointer": "/payload"})
    start(conns, ddb, aws_env, "flat", up.url_for("flat") + "?shape=flat", {"seq_pointer": "/u", "data_pointer": ""})

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream)) as worker:
            await eventually(lambda: all(len(seqs(msgs, c)) >= 10 for c in ("nest", "flat")), what="frames")
            assert worker.counters.total(names.MALFORMED_FRAMES) == 0

    asyncio.run(scenario())
    for cid in ("nest", "flat"):
        rows = msgs.read_all(cid)
        expected = up.expected_data(cid)
        assert [r["sk"] for r in rows] == list(range(1, len(rows) + 1))
        assert all(r[schema.MESSAGE_DATA] == expected[r["sk"]] for r in rows)


def test_resume_none_after_a_takeover_marks_what_the_dead_owner_and_nobody_received(
    aws_env, stores, sessions, ddb, quiet_upstream, captured
):
    """Taken from a dead owner: the one that had stored up to 3 gets the seqs it missed
    as one marker; so does the one that had stored nothing: its dead owner may have been
    sent frames it never stored (only a first ownership starts where the upstream is)."""
    from tests.test_worker import dead_session

    conns, msgs = stores
    up = quiet_upstream
    none = {"resume": "none"}
    for cid in ("had", "never"):
        start(conns, ddb, aws_env, cid, up.url_for(cid) + "?replay=none", none)
        for _ in range(6):
            up.publish(cid)  # 1..6 while its owner is dead
    cfg = config(aws_env)
    dead_session(sessions, conns, "dead#1", "had", "never", lease_ms=cfg.lease_ms)
    assert conns.checkpoint("had", session_id="dead#1", fence_token=1, last_seq=3)

    async def scenario():
        async with running(cfg, JsonLogger(captured.stream)) as worker:
            await eventually(lambda: up.open_sockets("had") and up.open_sockets("never"), timeout=15, what="taken")
            for cid in ("had", "never"):
                up.publish(cid)  # 7
                up.publish(cid)  # 8
            await eventually(lambda: all(seqs(msgs, c)[-1:] == [8] for c in ("had", "never")), what="stored")
            return worker.counters.total(names.MISSED_SEQS)

    missed = asyncio.run(scenario())
    had = msgs.read_all("had")
    assert [(r["sk"], r.get(schema.SKIP_TO), r.get(schema.SKIPPED)) for r in had] == [
        (4, 6, schema.SKIPPED_UPSTREAM_GAP), (7, None, None), (8, None, None)
    ]
    never = msgs.read_all("never")
    assert [(r["sk"], r.get(schema.SKIP_TO), r.get(schema.SKIPPED)) for r in never] == [
        (1, 6, schema.SKIPPED_UPSTREAM_GAP), (7, None, None), (8, None, None)
    ]
    assert conns.get("never")["last_seq"] == 8
    assert missed == 3 + 6


def test_a_stored_upstream_this_worker_refuses_is_a_refusal_not_a_crash(
    emulator, aws_env, stores, ddb, lively_upstream, captured
):
    conns, _ = stores
    outside = "arn:aws:secretsmanager:us-east-1:123456789012:secret:elsewhere/key-AbCdEf"
    start(conns, ddb, aws_env, "o", lively_upstream.url_for("o"), {"secret_headers": {AUTH: outside}})

    async def scenario():
        async with running(config(aws_env), JsonLogger(captured.stream), refused_retry_s=30) as worker:
            await eventually(lambda: schema.LAST_ERROR in (conns.get("o") or {}), what="last_error")
            assert "o" in worker.holdings.runners and worker.counters.total(names.LOOP_ERRORS) == 0

    asyncio.run(scenario())
    error = conns.get("o")[schema.LAST_ERROR]
    assert error.startswith("the stored upstream is refused by this worker") and "wsfleet/local/" in error
    assert lively_upstream.sockets("o") == []


def test_a_clean_handoffs_hint_carries_the_upstream_so_the_taker_opens_it_the_same_way(
    aws_env, stores, ddb, sqs, lively_upstream, captured
):
    conns, msgs = stores
    nested = {"seq_pointer": "/meta/sequence", "data_pointer": "/payload"}
    start(conns, ddb, aws_env, "h", lively_upstream.url_for("h") + "?shape=nested", nested)

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60"), JsonLogger(captured.stream)) as worker:
            await worker.takeover.reconcile_once()
            await eventually(lambda: len(seqs(msgs, "h")) >= 5, what="storing")

    asyncio.run(scenario())  # a clean exit: handed off, then hinted (and, untaken, hinted again)
    resp = sqs.receive_message(QueueUrl=aws_env["QUEUE_URL"], MaxNumberOfMessages=10, WaitTimeSeconds=5)
    bodies = [json.loads(m["Body"]) for m in resp.get("Messages", [])]
    item = conns.get("h")
    released = [b[schema.HINT_RELEASED] for b in bodies if b["connection_id"] == "h"]
    expected = schema.released_state(
        item["fence_token"], item["ws_url"], item["last_seq"], nested, session_id=item["lease_session"]
    )
    assert released and all(r == expected for r in released), released


def test_a_secrets_manager_outage_is_a_fault_that_passes_not_a_refusal(
    emulator, aws_env, stores, ddb, lively_upstream, captured
):
    from sim.emulator import set_faults

    conns, msgs = stores
    up = lively_upstream
    value = f"key-{uuid.uuid4().hex}"
    up.set_credentials([value])
    _, arn = secret_arn(emulator, value)
    start(conns, ddb, aws_env, "o", up.url_for("o") + f"?auth_header={AUTH}", {"secret_headers": {AUTH: arn}})
    set_faults(emulator.endpoint_url, outage={"secretsmanager": 600})  # seconds: until switched off
    try:

        async def scenario():
            async with running(config(aws_env), JsonLogger(captured.stream), refused_retry_s=60) as worker:
                # Each try is GetSecretValue with botocore's own retries and backoff
                # against the outage, then the reconnect backoff: seconds each, more on a
                # busy machine, so the deadline is generous (no time is asserted).
                await eventually(
                    lambda: len([e for e in captured.events("socket_error") if "could not be read" in e["error"]]) >= 2,
                    timeout=90,
                    what="retried with the reconnect backoff",
                )
                assert worker.counters.total(names.UPSTREAM_REFUSALS) == 0
                set_faults(emulator.endpoint_url)
                await eventually(lambda: len(seqs(msgs, "o")) >= 5, timeout=60, what="frames once Secrets Manager is back")

        asyncio.run(scenario())
    finally:
        set_faults(emulator.endpoint_url)
    assert schema.LAST_ERROR not in conns.get("o") and up.refusals("o") == {}
    assert value not in captured.lines() + every_item(ddb, aws_env)
