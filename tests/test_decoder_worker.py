"""An amplifying upstream beside a healthy one, through the whole worker (in-process,
against the emulator and the local upstream): its large frames of tiny objects are given
up in the decoder's child, the worker lives, the neighbour sees no gap, and the hostile
stream's ordinary frames are stored in order around the markers."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.test_worker import config, eventually, running, seqs
from wsfleet import metrics_names as names
from wsfleet import schema

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
        async with running(config(aws_env)) as worker:
            await eventually(lambda: all(len(seqs(msgs, c)) >= LAST for c in ("healthy", "hostile")), timeout=60,
                             what=f"{LAST} stored on each")
            assert not worker.stopping.is_set() and set(worker.holdings.runners) == {"healthy", "hostile"}
            return worker.decoder.describe(), max(worker.report.lag.recent), worker.counters.total(names.MALFORMED_FRAMES)

    decoder, lag_ms, malformed = asyncio.run(scenario())
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
