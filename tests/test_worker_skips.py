"""No silent holes, end to end: the worker against the emulator and a real local upstream
(sim/upstream.py). Seqs the upstream jumps over become one range
marker; a frame over the socket's limit, sent again at every resume, costs a bounded
number of sockets and becomes a marker; a new owner resumes past markers without a
loop, a gap or a double; whatever mix comes, the connection keeps its socket's owner
and fence."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from tests import test_worker
from tests.test_worker import dead_session, eventually, running
from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.config import WorkerConfig
from sim.upstream import ThreadedUpstream
from wsfleet.stream import OVER_LIMIT_TRIES, Frame, Problem, contiguous_end, upstream_gap

pytestmark = pytest.mark.slow

LIMIT = 4096  # MAX_FRAME_BYTES: its minimum, so that a frame over it is cheap to make


def config(aws_env) -> WorkerConfig:
    return test_worker.config(aws_env, MAX_FRAME_BYTES=str(LIMIT))


def big(seq: int) -> bytes:
    """A well-formed frame over LIMIT."""
    return json.dumps({"seq": seq, "data": "x" * (2 * LIMIT)}).encode()


def rows(msgs, cid: str) -> dict[int, dict]:
    return {int(r["sk"]): r for r in msgs.read_all(cid)}


def covered_end(msgs, cid: str) -> int:
    """The end of what is stored gap-free from 0, ranges included (independent of the
    worker: read from the table)."""
    items = sorted(rows(msgs, cid).items())
    end, _ = contiguous_end(0, ((s, int(r.get("skip_to", s))) for s, r in items))
    return end


def run_until(cfg: WorkerConfig, predicate, what: str, timeout: float = 10.0) -> dict[str, int]:
    """Runs a worker until ``predicate`` holds; its counters' totals once it has stopped
    (then every count of what it stored is in)."""

    async def scenario():
        async with running(cfg) as worker:
            await eventually(predicate, timeout=timeout, what=what)
        return worker.counters.totals()

    return asyncio.run(scenario())


def logged(capsys, event: str) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if f'"{event}"' in line]


def test_a_frame_over_the_limit_costs_a_few_sockets_then_a_marker_at_its_seq_and_the_stream_goes_on(
    aws_env, stores, capsys
):
    conns, msgs = stores
    with ThreadedUpstream(rate=None) as up:
        for _ in range(5):
            up.publish("a")
        up.publish_raw("a", big)  # seq 6, sent again to every socket that asks for it
        conns.start("a", up.url_for("a"))

        async def scenario():
            async with running(config(aws_env)) as worker:
                await eventually(lambda: 6 in rows(msgs, "a"), timeout=30, what="the marker at 6")
                for _ in range(4):
                    up.publish("a")
                await eventually(lambda: covered_end(msgs, "a") == 10, what="later frames stored")
            return worker.counters.totals()  # once stopped: every count of what it stored is in

        totals = asyncio.run(scenario())
        sockets = up.sockets("a")
        frames = up.frames("a")
    # The first socket sent 1..5, then 6 closed it; 6 closed two more; then 7 on.
    assert [s.from_seq for s in sockets] == [1] + [6] * (OVER_LIMIT_TRIES - 1) + [7]
    stored = rows(msgs, "a")
    assert sorted(stored) == list(range(1, 11))
    marker = stored[6]
    assert marker["skipped"] == schema.SKIPPED_OVER_FRAME_LIMIT and "message_data" not in marker
    assert marker["data_bytes"] == len(frames[6])  # the size websockets read from the frame's header
    assert all("message_data" in stored[s] for s in (*range(1, 6), *range(7, 11)))
    assert totals[names.SKIPPED_FRAMES] == 1 and totals[names.MALFORMED_FRAMES] == 0
    assert totals[names.RECONNECTS] == OVER_LIMIT_TRIES and totals[names.LOOP_ERRORS] == 0
    assert conns.get("a")["last_seq"] == 10 and conns.get("a")["fence_token"] == 1
    out = capsys.readouterr().out.splitlines()
    connects = [json.loads(line)["attempt"] for line in out if '"connected"' in line]
    # The backoff grew at each connect that found the same frame, the marker included:
    # only an accepted frame resets it.
    assert connects == list(range(OVER_LIMIT_TRIES + 1))
    skips = [json.loads(line) for line in out if '"skip_marker"' in line]
    assert [(s["reason"], s["seq"], s["size"]) for s in skips] == [("over_frame_limit", 6, len(frames[6]))]


def test_a_frame_over_the_limit_right_after_an_upstream_gap_still_converges(aws_env, stores):
    conns, msgs = stores
    with ThreadedUpstream(rate=None) as up:
        up.publish("a")
        up.skip("a", 1)  # seq 2 never produced
        up.publish_raw("a", big)  # 3
        up.publish("a")  # 4
        conns.start("a", up.url_for("a"))

        totals = run_until(config(aws_env), lambda: covered_end(msgs, "a") == 4, timeout=60, what="past the big frame")
        sockets = up.sockets("a")
    stored = rows(msgs, "a")
    # The socket never reads the big frame's seq: seq 2 is given up first (it holds
    # nothing storable), then 3. Each costs the tries; nothing that exists is hidden.
    assert [(s, r.get("skipped")) for s, r in sorted(stored.items())] == [
        (1, None), (2, "over_frame_limit"), (3, "over_frame_limit"), (4, None)
    ]
    assert len(sockets) == 2 * OVER_LIMIT_TRIES + 1 and sockets[-1].from_seq == 4
    assert totals[names.SKIPPED_FRAMES] == 2


def test_an_upstream_gap_is_stored_as_one_range_marker_and_the_checkpoint_and_stored_end_go_past_it(
    aws_env, stores, capsys
):
    conns, msgs = stores
    with ThreadedUpstream(rate=None) as up:
        for _ in range(3):
            up.publish("a")
        up.skip("a", 1000)  # 4..1003 never produced
        for _ in range(3):
            up.publish("a")
        conns.start("a", up.url_for("a"))

        totals = run_until(config(aws_env), lambda: covered_end(msgs, "a") == 1006, what="past the gap")
        assert len(up.sockets("a")) == 1  # a gap never costs the socket
    stored = rows(msgs, "a")
    assert sorted(stored) == [1, 2, 3, 4, 1004, 1005, 1006]  # one item for 1,000 seqs
    assert stored[4]["skipped"] == schema.SKIPPED_UPSTREAM_GAP and stored[4]["skip_to"] == 1003
    assert "message_data" not in stored[4] and "data_bytes" not in stored[4]
    assert conns.get("a")["last_seq"] == 1006  # released past the range
    assert msgs.stored_end("a", 3) == 1006
    assert totals[names.SKIPPED_FRAMES] == 1 and totals[names.MALFORMED_FRAMES] == 0
    skips = logged(capsys, "skip_marker")
    assert [(s["reason"], s["seq"], s["skip_to"]) for s in skips] == [("upstream_gap", 4, 1003)]


@pytest.mark.parametrize(
    ("dead_stored", "from_seqs"),
    [
        ("both markers", [11]),  # neither the range nor the big frame asked for again
        ("the gap marker", [10] * OVER_LIMIT_TRIES + [11]),  # died before giving up 10: the new owner does
    ],
)
def test_a_new_owner_after_a_crash_right_after_markers_resumes_past_them_without_a_loop_gap_or_double(
    aws_env, stores, sessions, dead_stored, from_seqs
):
    conns, msgs = stores
    cfg = config(aws_env)
    with ThreadedUpstream(rate=None) as up:
        for _ in range(5):
            up.publish("a")
        up.skip("a", 4)  # 6..9
        up.publish_raw("a", big)  # 10
        for _ in range(5):
            up.publish("a")  # 11..15
        conns.start("a", up.url_for("a"))
        dead_session(sessions, conns, "dead#1", "a", lease_ms=cfg.lease_ms)
        # The dead owner stored past its checkpoint (3), its markers too, then died.
        conns.checkpoint("a", session_id="dead#1", fence_token=1, last_seq=3)
        sent = up.frames("a")
        dead = [
            *(Frame(n, json.dumps(json.loads(sent[n])["data"], separators=(",", ":")), 1) for n in range(1, 6)),
            upstream_gap(6, 9, 1),
            Frame(10, None, 1, Problem.OVER_FRAME_LIMIT, data_bytes=len(sent[10])),
        ]
        msgs.put("a", dead if dead_stored == "both markers" else dead[:-1], fence_token=1, worker_id="dead")

        async def scenario():
            async with running(cfg) as worker:
                await eventually(lambda: "a" in worker.holdings.runners, timeout=cfg.lease_ms / 1000 + 5, what="takeover")
                await eventually(lambda: covered_end(msgs, "a") == 15, timeout=30, what="frames past the markers")
            return worker.counters.totals()  # once stopped: every count of what it stored is in

        totals = asyncio.run(scenario())
        sockets = up.sockets("a")
    assert [s.from_seq for s in sockets] == from_seqs
    stored = rows(msgs, "a")
    assert sorted(stored) == [*range(1, 7), *range(10, 16)]  # no double: one item per seq, the range one item
    assert {stored[s]["fence_token"] for s in range(1, 7)} == {1}  # the dead owner's, never rewritten
    assert stored[10]["skipped"] == schema.SKIPPED_OVER_FRAME_LIMIT
    assert stored[10]["fence_token"] == (1 if dead_stored == "both markers" else 2)
    assert {stored[s]["fence_token"] for s in range(11, 16)} == {2}
    assert totals[names.SKIPPED_FRAMES] == (0 if dead_stored == "both markers" else 1)
    assert conns.get("a")["last_seq"] == 15


def test_a_seeded_hostile_mix_never_fails_the_connection_and_leaves_no_hole(aws_env, stores):
    """Numbered frames, raw hostile frames that take a seq, seq-less junk, jumps ahead
    and frames over the limit, in a seeded order: every seq up to the head is stored
    once (as data or inside a marker), data where the upstream sent a storable frame,
    one owner and fence throughout, no loop error."""
    seed = 19
    rng = random.Random(seed)
    hostile = [
        lambda s: b'{"seq": %d, "data": "\xff"}' % s,
        lambda s: b'{"seq": %d, "data": %s}' % (s, b"[" * 1500 + b"]" * 1500),  # too deep, under LIMIT
        lambda s: b'{"seq": %d, "data": NaN}' % s,
        lambda s: b'{"seq": %d, "data": "\\ud83d"}' % s,
    ]
    conns, msgs = stores
    with ThreadedUpstream(rate=None) as up:
        up.publish("a")
        storable: set[int] = {1}
        made: list[str] = []
        for _ in range(60):
            kind = rng.choices(["frame", "hostile", "junk", "jump", "big"], weights=[55, 15, 10, 13, 7])[0]
            if kind == "big" and (made.count("big") == 2 or made[-1:] == ["jump"]):
                continue  # (past a gap of k, a big frame costs k + 1 markers: tested above)
            made.append(kind)
            if kind == "frame":
                storable.add(up.publish("a"))
            elif kind == "hostile":
                seq = up.publish_raw("a", rng.choice(hostile))
                if b"ud83d" in up.frames("a")[seq]:
                    storable.add(seq)  # stored escaped
            elif kind == "junk":
                up.inject("a", rng.choice(["not json", '{"data": 1}', b"\xff\xfe", '{"seq": -1}']))
            elif kind == "jump":
                up.skip("a", rng.choice((1, 2, 50, 500)))  # (the local upstream walks a gap seq by seq)
            else:
                up.publish_raw("a", big)
        storable.add(up.publish("a"))  # the head: a frame, not a gap
        assert set(made) == {"frame", "hostile", "junk", "jump", "big"}  # this seed's mix has every kind
        head = up.produced("a")
        conns.start("a", up.url_for("a"))

        totals = run_until(
            config(aws_env), lambda: covered_end(msgs, "a") == head, timeout=90, what=f"the head {head} (seed {seed})"
        )
        frames = up.frames("a")
    stored = rows(msgs, "a")
    assert {s for s, r in stored.items() if "message_data" in r} == storable
    for s, r in stored.items():
        if "message_data" not in r:
            assert r["skipped"] in schema.SKIPPED_REASONS
            assert (r["skipped"] == schema.SKIPPED_UPSTREAM_GAP) == ("skip_to" in r)
            if r["skipped"] == schema.SKIPPED_UPSTREAM_GAP:
                assert not any(s <= x <= r["skip_to"] for x in frames)  # only seqs never produced
    assert {r["fence_token"] for r in stored.values()} == {1} and conns.get("a")["fence_token"] == 1
    assert totals[names.LOOP_ERRORS] == 0 and totals[names.LEASES_LOST] == 0
    assert totals[names.SKIPPED_FRAMES] == sum(1 for r in stored.values() if "skipped" in r)
