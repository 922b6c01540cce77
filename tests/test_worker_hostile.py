"""The worker against a hostile upstream beside a healthy one (CONTRACT.md section 3, "One
connection never takes down its worker"), in-process, with the emulator and the local
upstream: the hostile connection is closed over its budget with a ``last_error`` naming
it and waits like a refusal, holding its lease; the worker lives; the neighbour's frames
keep coming. What is asserted comes from the upstream's books, the tables and what the
worker measured, never from timing the machine (polls with deadlines, no sleeps)."""

from __future__ import annotations

import asyncio
import io
import itertools
import json

import pytest

from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.logs import JsonLogger
from wsfleet.worker.socket_budget import CONTROL_FLOOD, FLOOD_TEXT, WRITE_LIMIT_BYTES

from tests.test_worker import config, eventually, running

pytestmark = pytest.mark.slow

READ_CHUNK = 256 * 1024  # the most one asyncio read hands over (selector transports)
FLOOD_RATE = 20_000  # pings a second: our answers outrun what the kernel buffers in seconds
NEIGHBOUR_GAP_MS = 1000


def test_a_ping_flood_that_never_reads_is_closed_as_control_flood_and_its_neighbour_never_stalls(
    aws_env, stores, upstream
):
    conns, msgs = stores
    conns.start("ok", upstream.url_for("ok"))
    log = io.StringIO()

    async def scenario():
        async with running(config(aws_env), log=JsonLogger(log)) as worker:  # the refusal wait: 60 s
            await eventually(lambda: len(msgs.read_all("ok")) >= 10, 30, "the neighbour storing")
            await asyncio.to_thread(conns.start, "flood", upstream.url_for("flood") + f"?ping_flood={FLOOD_RATE}")
            await eventually(lambda: upstream.sockets("flood"), 30, "the flood connected")
            # Its last_error names the flood. (On a loaded machine a socket before it may
            # have ended otherwise, a handshake past its timeout, say: what follows is
            # asserted of the socket closed as a flood, the last one.)
            await eventually(lambda: (conns.get("flood") or {}).get(schema.LAST_ERROR) == FLOOD_TEXT, 40,
                             "the flood's last_error")
            # Closed and waiting like a refused connection: held, by the neighbour's session.
            flood, ok = await asyncio.to_thread(conns.get, "flood"), await asyncio.to_thread(conns.get, "ok")
            assert flood["lease_session"] and flood["lease_session"] == ok["lease_session"]
            runner = worker.holdings.runners["flood"]
            assert not runner.connected.is_set() and not runner.refused, events()  # not gauged as a refused handshake
            opened = len(upstream.sockets("flood"))
            stored = len(msgs.read_all("ok"))
            await eventually(lambda: len(msgs.read_all("ok")) >= stored + 20, 30, "the neighbour storing on")
            assert len(upstream.sockets("flood")) == opened, events()  # the refusal wait: not tried again yet
            return runner.budget, worker.report.stats()

    def events() -> list[dict]:
        """The worker's log of the flood connection, for a failure's message."""
        return [e for e in map(json.loads, log.getvalue().splitlines()) if e.get("connection_id") == "flood"]

    budget, stats = asyncio.run(scenario())
    assert FLOOD_TEXT.startswith(CONTROL_FLOOD)
    *before, socket = upstream.sockets("flood")
    assert all(s.closed_at is not None and s.closed_at <= socket.opened_at for s in before), events()
    assert socket.closed_at is not None and socket.pings_sent > 0
    assert socket.closed_at - socket.opened_at < 30  # closed within 30 s by the upstream's own books
    assert stats[names.BUDGET_CLOSES] == 1 and budget.flood_closes == 1
    assert stats[names.LOOP_ERRORS] == 0 and stats[names.UPSTREAM_REFUSALS] == 0
    assert stats[names.LEASES_LOST] == 0  # the worker kept its session throughout
    # Our answers to the pings stopped at the mark (and one read's worth past it).
    assert budget.write_pauses >= 1 and stats["unsent_max"] == budget.unsent_max
    assert budget.unsent_max <= WRITE_LIMIT_BYTES + 2 * READ_CHUNK
    closed = [json.loads(line) for line in log.getvalue().splitlines() if '"closed_over_budget"' in line]
    assert [e["connection_id"] for e in closed] == ["flood"]
    # The neighbour: every frame stored, in order, none received more than a second
    # after the one before it, from before the flood began until after it was closed.
    rows = msgs.read_all("ok")
    assert [r["sk"] for r in rows] == list(range(1, len(rows) + 1))
    received = [r[schema.RECEIVED_AT_MS] for r in rows]
    assert received[0] < socket.opened_at * 1000 and received[-1] > socket.closed_at * 1000
    gaps = [b - a for a, b in itertools.pairwise(received)]
    assert max(gaps) <= NEIGHBOUR_GAP_MS, f"the neighbour stalled {max(gaps)} ms"
