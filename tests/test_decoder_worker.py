"""An amplifying upstream beside a healthy one, through the whole worker (in-process,
against the emulator and the local upstream): its large frames of tiny objects are given
up in the decoder's child, the worker lives, the neighbour sees no gap, and the hostile
stream's ordinary frames are stored in order around the markers."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pytest

from tests.test_worker import config, eventually, running, seqs
from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.worker.connection import HANDSHAKE_TIMEOUT
from wsfleet.worker.socket_budget import DECODE_BUDGET, DECODE_TEXT

pytestmark = pytest.mark.slow

AMPLIFY = 8 << 20  # bytes: under the 32 MiB frame limit, about 200 MB parsed naively
EVERY = 25  # seqs 25, 50, 75 are amplification frames
LAST = 80  # stored up to here on both, then the worker stops
MAX_GAP_MS = 1000  # the neighbour's longest wait between two frames received


def test_an_amplifying_neighbour_costs_markers_not_the_worker_nor_the_healthy_stream(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("healthy", upstream.url_for("healthy"))
    conns.start("hostile", upstream.url_for("hostile") + f"?amplify={AMPLIFY}&amplify_every={EVERY}")

    async def scenario():
        # Each frame given up closes the hostile socket over the decode budget, which then
        # waits like a refusal: short here, so that it reaches every amplified seq.
        async with running(config(aws_env), refused_retry_s=0.2) as worker:
            await eventually(lambda: all(len(seqs(msgs, c)) >= LAST for c in ("healthy", "hostile")), timeout=60,
                             what=f"{LAST} stored on each")
            assert not worker.stopping.is_set() and set(worker.holdings.runners) == {"healthy", "hostile"}
            closes = worker.holdings.runners["hostile"].budget.decode_closes, worker.counters.total(names.BUDGET_CLOSES)
            return (worker.decoder.describe(), max(worker.report.lag.recent), worker.counters.total(names.MALFORMED_FRAMES),
                    closes)

    decoder, lag_ms, malformed, closes = asyncio.run(scenario())
    assert closes[0] >= len(range(EVERY, LAST + 1, EVERY)) and closes[1] >= closes[0]  # one close per frame given up
    healthy = msgs.read_all("healthy")
    assert [r["sk"] for r in healthy] == list(range(1, len(healthy) + 1))
    received = [int(r["received_at_ms"]) for r in healthy]
    assert max(b - a for a, b in itertools.pairwise(received)) <= MAX_GAP_MS
    assert lag_ms < MAX_GAP_MS

    amplified = list(range(EVERY, LAST + 1, EVERY))
    assert decoder["children_started"] == 1 and decoder["given_up"] >= len(amplified) and decoder["timeouts"] == 0
    assert malformed >= len(amplified)

    hostile = msgs.read_all("hostile")
    assert [r["sk"] for r in hostile] == list(range(1, len(hostile) + 1))  # in order, no hole, no double
    expected = upstream.expected_data("hostile")  # the ordinary frames, as the books keep them
    for row in hostile:
        if row["sk"] % EVERY == 0:
            assert row[schema.SKIPPED] == schema.SKIPPED_OVER_FRAME_LIMIT and schema.MESSAGE_DATA not in row
            assert int(row[schema.DATA_BYTES]) > AMPLIFY - 100
        else:
            assert row[schema.MESSAGE_DATA] == expected[row["sk"]]


def test_a_frame_given_up_closes_the_socket_naming_the_decode_budget_and_resumes_after_its_marker(
    aws_env, stores, upstream
):
    conns, msgs = stores
    conns.start("hostile", upstream.url_for("hostile") + f"?amplify={AMPLIFY}&amplify_every={EVERY}")

    async def scenario():
        async with running(config(aws_env)) as worker:  # the refusal wait: 60 s, longer than this test
            await eventually(lambda: (conns.get("hostile") or {}).get(schema.LAST_ERROR), timeout=60, what="last_error")
            runner = worker.holdings.runners["hostile"]
            # Waiting, past its marker (frames the socket had read already were handed on first).
            assert not runner.connected.is_set() and runner.tracker.next_seq > EVERY
            return conns.get("hostile")[schema.LAST_ERROR]

    last_error = asyncio.run(scenario())
    assert last_error == DECODE_TEXT and last_error.startswith(DECODE_BUDGET + ": ")
    rows = msgs.read_all("hostile")
    assert [r["sk"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= EVERY
    assert rows[EVERY - 1][schema.SKIPPED] == schema.SKIPPED_OVER_FRAME_LIMIT


def test_a_handshake_that_never_completes_is_named_in_last_error(aws_env, stores, upstream):
    conns, _ = stores
    conns.start("slow", upstream.url_for("slow") + "?slow_handshake=3600")

    async def scenario():
        async with running(config(aws_env)) as worker:
            settings = worker.acquisition.settings
            worker.acquisition.settings = replace(settings, connect_timeout_s=0.5)  # (10 s by default)
            await eventually(lambda: (conns.get("slow") or {}).get(schema.LAST_ERROR), timeout=30, what="last_error")
            return conns.get("slow")[schema.LAST_ERROR], worker.counters.total(names.LOOP_ERRORS)

    last_error, loop_errors = asyncio.run(scenario())
    assert last_error.startswith(HANDSHAKE_TIMEOUT + ": ") and loop_errors == 0
