"""Feeds that are not all data: ``ignore`` rules drop heartbeats and acks without a trace,
``max_silence_seconds`` reconnects a socket whose feed stopped, and the gauges the fleet
watches (silent connections, feeds gone mostly malformed) come from worker.feed_health."""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from wsfleet import metrics_names as names
from wsfleet import schema, upstream_spec
from wsfleet.logs import JsonLogger
from wsfleet.pointer import Pointer, canonical
from wsfleet.stream import FrameShape, Problem, Rejected, parse_frame
from wsfleet.validation import Invalid
from wsfleet.worker import feed_health
from wsfleet.worker.feed_health import FeedHealth

from tests.test_worker import config, eventually, running

HEARTBEAT = '{"type":"heartbeat","t":1}'


def rules(*pairs: tuple[str, object]) -> tuple[tuple[Pointer, str], ...]:
    return tuple((Pointer.parse(p), canonical(v)) for p, v in pairs)


# --- ignore rules ------------------------------------------------------------------------------


def test_a_frame_matching_a_rule_is_ignored_before_its_seq_is_looked_for():
    shape = FrameShape(ignore=rules(("/type", "heartbeat"), ("/ack", {"ok": True, "id": 1})))
    assert parse_frame(HEARTBEAT, 1, shape) == Rejected(Problem.IGNORED, len(HEARTBEAT))
    assert parse_frame('{"ack":{"id":1,"ok":true}}', 1, shape).problem is Problem.IGNORED  # key order is not compared
    assert parse_frame('{"ack":{"id":1,"ok":1}}', 1, shape).problem is Problem.BAD_SEQ  # 1 is not true
    assert parse_frame('{"seq":3,"type":"update","data":5}', 1, shape).data_json == "5"
    assert parse_frame(HEARTBEAT, 1, FrameShape()).problem is Problem.BAD_SEQ  # no rule: malformed, as before


def test_an_assigned_seq_feed_spends_no_seq_on_an_ignored_frame():
    shape = FrameShape(data=Pointer.parse(""), assigned=True, ignore=rules(("/type", "heartbeat")))
    assert parse_frame(HEARTBEAT, 1, shape).problem is Problem.IGNORED
    assert parse_frame('{"type":"trade","p":1}', 1, shape).data_json == '{"type":"trade","p":1}'


@pytest.mark.parametrize(
    "value, sentence",
    [
        ([], "must be a list of 1 to 16 rules"),
        ([{"pointer": "/type"}], 'exactly "pointer" and "equals"'),
        ([{"pointer": "", "equals": 1}], "not be the whole frame"),
        ([{"pointer": "type", "equals": 1}], "upstream.ignore: "),
        ([{"pointer": "/t", "equals": "x" * 2000}], "at most 1024 characters"),
        ([{"pointer": "/t", "equals": 1}] * 17, "1 to 16 rules"),
    ],
)
def test_bad_ignore_rules_are_a_400_sentence(value, sentence):
    with pytest.raises(Invalid) as refused:
        upstream_spec.parse({"ignore": value}, secret_prefix="")
    assert refused.value.code == upstream_spec.INVALID and sentence in str(refused.value)


def test_ignore_rules_and_the_silence_limit_are_stored_as_given_and_read_back_the_same():
    given = {"ignore": [{"pointer": "/type", "equals": "heartbeat"}, {"pointer": "/e", "equals": {"b": 1, "a": [2]}}],
             "max_silence_seconds": 30}
    upstream = upstream_spec.parse(given, secret_prefix="")
    assert upstream.item() == given
    assert upstream_spec.parse(upstream.item(), secret_prefix="") == upstream
    assert upstream.shape().ignore == upstream.ignore


@pytest.mark.parametrize("value", [0, 86_401, 2.5, True, "30"])
def test_the_silence_limit_is_a_whole_number_of_seconds_up_to_a_day(value):
    if value == "30":  # the CLI's flag gives text
        assert upstream_spec.parse({"max_silence_seconds": value}, secret_prefix="").max_silence_seconds == 30
        return
    with pytest.raises(Invalid, match="max_silence_seconds: must be a whole number of seconds from 1 to 86400"):
        upstream_spec.parse({"max_silence_seconds": value}, secret_prefix="")


def test_ignore_rules_read_json_frames_only():
    with pytest.raises(Invalid, match="upstream.ignore: reads JSON frames"):
        upstream_spec.parse({"format": "text", "seq": "assigned", "ignore": [{"pointer": "/t", "equals": 1}]},
                            secret_prefix="")


# --- the gauges --------------------------------------------------------------------------------


def test_silent_is_nothing_accepted_for_longer_than_the_limit_across_reconnects():
    health = FeedHealth(30, now=0.0)
    assert not health.silent(30.0) and health.silent(30.5)
    health.connected(40.0)  # a new socket does not make the feed any less silent
    assert health.silent(41.0)
    health.accepted(41.0)
    assert not health.silent(70.0)
    assert not FeedHealth(None, now=0.0).silent(1e9)


def test_mostly_malformed_needs_enough_frames_over_the_window_and_forgets_old_ones():
    health = FeedHealth(None, now=0.0)
    for i in range(feed_health.MIN_FRAMES - 1):
        health.received(float(i), malformed=True)
    assert not health.mostly_malformed(10.0)  # too few to say
    health.received(10.0, malformed=True)
    assert health.mostly_malformed(10.0)
    for i in range(20):
        health.received(20.0 + i, malformed=False)
    assert not health.mostly_malformed(40.0)
    assert not health.mostly_malformed(10.0 + feed_health.WINDOW_S + feed_health.BUCKET_S)  # all of it gone by


# --- the worker ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_feed_that_goes_silent_is_reconnected_and_resumes_without_a_gap(aws_env, stores, upstream):
    conns, msgs = stores
    limit = 2
    start = upstream_spec.parse({"max_silence_seconds": limit}, secret_prefix="")
    conns.start("quiet", upstream.url_for("quiet"), start.item())
    log = io.StringIO()

    async def scenario():
        async with running(config(aws_env), log=JsonLogger(log)) as worker:
            await eventually(lambda: len(msgs.read_all("quiet")) >= 5, 30, "frames stored")
            stalled_at = time.time()
            upstream.stall("quiet")  # the socket stays open; no frame comes
            await eventually(lambda: worker.counters.total(names.SILENCE_RECONNECTS) >= 1, 30, "a reconnect for silence")
            await eventually(lambda: len(upstream.sockets("quiet")) >= 2, 30, "a new socket")
            # The new socket within the limit and a little (the bound: limit + 3 s),
            # with room for a busy machine: what it took is printed (pytest -s).
            reopened = upstream.sockets("quiet")[1].opened_at - stalled_at
            print(f"silent feed reopened {reopened:.2f} s after it went silent (limit {limit} s)")
            assert reopened <= limit + 10
            upstream.stall("quiet", on=False)
            stored = len(msgs.read_all("quiet"))
            await eventually(lambda: len(msgs.read_all("quiet")) >= stored + 5, 30, "frames stored again")
            return worker.report.stats()

    stats = asyncio.run(scenario())
    seqs = [int(item[schema.MSG_SK]) for item in msgs.read_all("quiet")]
    assert seqs == list(range(1, len(seqs) + 1))  # resumed where it was: no gap, no marker
    assert not [item for item in msgs.read_all("quiet") if schema.SKIPPED in item]
    assert stats[names.SILENCE_RECONNECTS] >= 1 and stats[names.LOOP_ERRORS] == 0
    assert '"event":"silent_reconnect"' in log.getvalue()


def test_the_cli_flags_build_the_rules_and_the_limit():
    from wsfleet.cli import build_parser
    from wsfleet.cli.upstream_flags import upstream_of

    args = build_parser().parse_args([
        "start", "c", "wss://x.example.com/feed", "--api", "http://127.0.0.1:1",
        "--ignore", "/type=heartbeat", "--ignore", '/ack={"ok": true}', "--max-silence-seconds", "30",
    ])
    upstream = upstream_of(args)
    assert upstream == {"ignore": [{"pointer": "/type", "equals": "heartbeat"}, {"pointer": "/ack", "equals": {"ok": True}}],
                        "max_silence_seconds": "30"}
    assert upstream_spec.parse(upstream, secret_prefix="").max_silence_seconds == 30


@pytest.mark.slow
def test_heartbeats_matched_by_an_ignore_rule_leave_no_trace_in_the_table_or_the_malformed_count(
    aws_env, stores, upstream
):
    conns, msgs = stores
    given = upstream_spec.parse({"ignore": [{"pointer": "/type", "equals": "heartbeat"}]}, secret_prefix="")
    conns.start("beats", upstream.url_for("beats"), given.item())

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: len(msgs.read_all("beats")) >= 3, 30, "frames stored")
            for _ in range(5):
                upstream.inject("beats", HEARTBEAT)  # between numbered frames, taking no seq
                stored = len(msgs.read_all("beats"))
                await eventually(lambda n=stored: len(msgs.read_all("beats")) > n, 30, "the next frame")
            await eventually(lambda: worker.counters.total(names.IGNORED_FRAMES) >= 5, 30, "five heartbeats ignored")
            return worker.counters.total(names.MALFORMED_FRAMES), worker.counters.total(names.SKIPPED_FRAMES)

    malformed, skipped = asyncio.run(scenario())
    rows = msgs.read_all("beats")
    assert [int(r[schema.MSG_SK]) for r in rows] == list(range(1, len(rows) + 1))  # every seq, in order
    assert not [r for r in rows if schema.SKIPPED in r] and malformed == 0 and skipped == 0
