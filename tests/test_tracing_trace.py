"""One trace from a START to its socket, and from a dead session's end to every new
socket (TRACING=otel, an in-memory exporter): the router, the emulator's SQS and tables,
a worker in this process and a real local upstream. The spans carry connection, session
and fence, never a secret, a header value, a URL's query string or a frame's data."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid

import pytest

from wsfleet import schema, tracing
from sim.secrets import SECRET_PREFIX, put_secret
from wsfleet.logs import JsonLogger
from wsfleet.router import Router

from tests.test_worker import config, dead_session, eventually, post, running

pytestmark = pytest.mark.slow

LAMBDA_TRACE = "Root=1-6565e1a0-0123456789abcdef01234567;Parent=1111111111111111;Sampled=1"
LAMBDA_TRACE_ID = 0x6565E1A00123456789ABCDEF01234567


@pytest.fixture
def spans(otel_spans):
    return otel_spans


def children(spans, parent) -> list:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def only(spans, name: str, **attributes) -> object:
    (span,) = [s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())]
    return span


def test_a_start_is_one_trace_from_the_api_through_the_hint_to_the_upstream_socket(
    monkeypatch, emulator, aws_env, ddb, sqs, upstream, spans
):
    secret_value, header_value, query_token = (f"{what}-{uuid.uuid4().hex}" for what in ("secret", "header", "token"))
    arn = put_secret(emulator.endpoint_url, f"{SECRET_PREFIX}trace-{uuid.uuid4().hex[:8]}", secret_value)
    token_arn = put_secret(emulator.endpoint_url, f"{SECRET_PREFIX}token-{uuid.uuid4().hex[:8]}", query_token)
    env = {**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1", "UPSTREAM_SECRET_PREFIX": SECRET_PREFIX}
    router = Router.from_env(env, ddb=ddb, sqs=sqs)
    monkeypatch.setenv("_X_AMZN_TRACE_ID", LAMBDA_TRACE)  # as Lambda sets it for the invocation

    async def scenario():
        async with running(config(env, RECONCILE_SECONDS="60")) as worker:  # only the hint brings it in time
            start = {
                "event_type": "START",
                "connection_id": "t1",
                "ws_url": upstream.url_for("t1"),
                "upstream": {
                    "headers": {"X-Plain": header_value},
                    "secret_headers": {"X-Secret": arn},
                    "secret_query": {"token": token_arn},
                },
            }
            assert await asyncio.to_thread(post, router, start) == 202
            await eventually(lambda: upstream.open_sockets("t1"), what="the START connected")
            await eventually(lambda: any(s.name == "connect" for s in spans()), what="the connect span")
            return worker.keeper.session_id

    session_id = asyncio.run(scenario())
    finished = spans()
    routed = only(finished, "router")
    acquire = only(finished, "acquire", connection_id="t1")
    connect = only(finished, "connect", connection_id="t1")
    # API Gateway -> Lambda (its trace header) -> router -> SQS hint -> acquire -> connect
    assert routed.context.trace_id == acquire.context.trace_id == connect.context.trace_id == LAMBDA_TRACE_ID
    assert routed.parent.span_id == 0x1111111111111111
    assert acquire.parent.span_id == routed.context.span_id and acquire.parent.is_remote  # across SQS
    assert connect.parent.span_id == acquire.context.span_id
    assert dict(routed.attributes) == {
        "method": "POST", "event_type": "START", "connection_id": "t1", "outcome": "created", "status": 202
    }
    assert dict(acquire.attributes) == {
        "connection_id": "t1", "source": "hint", "session": session_id, "outcome": "acquired", "fence": 1
    }
    assert dict(connect.attributes) == {"connection_id": "t1", "session": session_id, "fence": 1, "from_seq": 1}
    # The AWS calls made under acquire are its children, in the same trace.
    assert any(s.name.startswith("ConnectionsStore.acquire") for s in children(finished, acquire))
    # Nothing exported says a secret, a header's value, the URL's query or its token.
    exported = json.dumps([[s.name, dict(s.attributes), [dict(e.attributes) for e in s.events]] for s in finished])
    for never in (secret_value, header_value, query_token, "token=", "ws://", "X-Plain"):
        assert never not in exported


def test_a_takeover_is_one_trace_from_the_sessions_end_to_every_new_socket(aws_env, stores, sessions, upstream, spans):
    conns, _ = stores
    for cid in ("k1", "k2"):
        conns.start(cid, upstream.url_for(cid))
    dead_session(sessions, conns, "dead#1", "k1", "k2", lease_ms=300)

    out = io.StringIO()

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60"), log=JsonLogger(out)) as worker:
            await eventually(lambda: all(upstream.open_sockets(c) for c in ("k1", "k2")), what="both taken over")
            await eventually(
                lambda: len([s for s in spans() if s.name == "connect"]) == 2, what="both connect spans"
            )
            return worker.keeper.session_id

    session_id = asyncio.run(scenario())
    finished = spans()
    end = only(finished, "end_session", session="dead#1")
    assert end.parent is None and end.attributes["outcome"] == "ended"
    drain = only(finished, "drain", session="dead#1")
    assert drain.parent.span_id == end.context.span_id
    for cid in ("k1", "k2"):
        acquire = only(finished, "acquire", connection_id=cid)
        connect = only(finished, "connect", connection_id=cid)
        assert acquire.context.trace_id == connect.context.trace_id == end.context.trace_id
        # Taken here by the drain (its own part) or through its hint (the rest): either
        # way under the drain's span.
        assert acquire.parent.span_id == drain.context.span_id
        assert (acquire.attributes["source"], acquire.attributes["fence"], acquire.attributes["session"]) == (
            "orphan", 2, session_id
        )
        assert connect.parent.span_id == acquire.context.span_id
    # The lines written under the spans lead to the trace; a connection's later life,
    # in a task of its own, is not in it.
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    ended = f"1-{end.context.trace_id:032x}"
    ended = f"{ended[:10]}-{ended[10:]}"
    assert {e["trace_id"] for e in lines if e["event"] in ("session_ended_dead", "lease_acquired", "session_drain")} == {ended}
    assert {e["trace_id"] for e in lines if e["event"] == "connected"} == {ended}  # the connect span's
    assert [e for e in lines if e["event"] in ("socket_closed", "connection_ended") and "trace_id" in e] == []
    # The ending write stored the end_session span's header on the session.
    stored = sessions.get("dead#1", consistent=True)
    trace_id = f"{end.context.trace_id:032x}"
    assert stored[schema.END_TRACE] == f"Root=1-{trace_id[:8]}-{trace_id[8:]};Parent={end.context.span_id:016x};Sampled=1"


def test_a_session_ended_by_another_is_drained_in_the_trace_its_end_recorded(aws_env, stores, sessions, upstream, spans):
    conns, _ = stores
    conns.start("e1", upstream.url_for("e1"))
    dead_session(sessions, conns, "gone#1", "e1", lease_ms=200)
    time.sleep(0.4)
    # Its ender crashed right after the ending write: the session is still in the ring.
    assert isinstance(
        sessions.end_expired("gone#1", ended_by="crashed#1", max_clock_skew_ms=100, trace_header=LAMBDA_TRACE), dict
    )

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60")):
            await eventually(lambda: upstream.open_sockets("e1"), what="drained by a watcher")
            await eventually(lambda: any(s.name == "connect" for s in spans()), what="the connect span")

    asyncio.run(scenario())
    finished = spans()
    drain = only(finished, "drain", session="gone#1")
    acquire = only(finished, "acquire", connection_id="e1")
    connect = only(finished, "connect", connection_id="e1")
    assert drain.parent.span_id == 0x1111111111111111
    assert drain.context.trace_id == acquire.context.trace_id == connect.context.trace_id == LAMBDA_TRACE_ID
    assert connect.parent.span_id == acquire.context.span_id


def test_a_workers_own_hints_carry_the_trace_of_the_span_that_sent_them(aws_env, stores, upstream, spans):
    conns, _ = stores
    cfg = config(aws_env, RECONCILE_SECONDS="60")  # only the hints bring them in time

    async def scenario():
        async with running(cfg, "w1") as first:
            # After its first free scan (at start-up; the next in 60 s), so that only the
            # hint brings h1 in (a scan late on a loaded machine took it first).
            await eventually(lambda: first.takeover.idle_scans >= 1, what="w1's first free scan, empty")
            await asyncio.to_thread(conns.start, "h1", upstream.url_for("h1"))
            # A hint sent under a span (as a drain's are): batched, through the queue.
            with tracing.segment("drain", session="test") as sent:
                await first.hints.hint("h1")
            await eventually(lambda: "h1" in first.holdings.runners, what="w1 took its own hint")
            async with running(cfg, "w2") as second:
                await asyncio.sleep(0.2)
                await first.shutdown(budget_s=5)  # its handoff hint carries the release's trace
                await eventually(lambda: "h1" in second.holdings.runners, what="w2 took the handoff")
                await eventually(lambda: len([s for s in spans() if s.name == "connect"]) == 2, what="the connects")
                return sent, first.keeper.session_id, second.keeper.session_id

    sent, giver, taker = asyncio.run(scenario())
    finished = spans()
    drain = only(finished, "drain", session="test")
    taken = only(finished, "acquire", connection_id="h1", session=giver)
    assert taken.parent.span_id == drain.context.span_id and taken.context.trace_id == drain.context.trace_id
    release = only(finished, "release", connection_id="h1", session=giver)
    handed = only(finished, "acquire", connection_id="h1", session=taker)
    assert release.attributes["why"] == "shutdown"
    assert handed.parent.span_id == release.context.span_id and handed.context.trace_id == release.context.trace_id
    assert only(finished, "connect", session=taker).parent.span_id == handed.context.span_id
