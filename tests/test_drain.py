"""``wsfleet drain``, no process started: the one conditional write (a LIVE session only),
the worker's reaction to what its renewal brings (the SIGTERM shutdown, started once), and
the command's arguments, answers and errors against the emulator's tables. The whole of
it, a fleet's worker drained for real, is tests/test_fleet_drain.py."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
from decimal import Decimal

import pytest

from tests.test_cli import URL, acquire, open_session, run, run_json
from wsfleet import schema
from wsfleet.aws import Aws
from wsfleet.cli import drain as drain_cli
from wsfleet.config import WorkerConfig
from wsfleet.leases import SessionTiming
from wsfleet.logs import JsonLogger
from wsfleet.store import ConnectionsStore, SessionsStore, now_ms
from wsfleet.worker.lifecycle import Worker
from wsfleet.worker.session import SessionKeeper

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sessions(ddb, aws_env):
    return SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])


@pytest.fixture
def conns(ddb, aws_env):
    return ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4)


# --- the write ---------------------------------------------------------------------------------


def test_a_drain_request_lands_on_a_live_session_and_a_second_keeps_the_first(ddb, aws_env, sessions):
    sid = open_session(ddb, aws_env, "w1")
    new, old = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"], clock_ms=lambda: 1_000).request_drain(sid, by="alice")
    assert old is None and new[schema.DRAIN_REQUESTED] == {"by": "alice", "at_ms": 1_000}
    assert new[schema.SESSION_STATE] == schema.LIVE  # nothing else changed

    again, _ = sessions.request_drain(sid, by="bob")
    assert again[schema.DRAIN_REQUESTED] == {"by": "alice", "at_ms": 1_000}
    # A renewal leaves it there and returns it: that is how the worker hears of it.
    renewed = sessions.renew(sid, lease_ms=60_000, active=0, max_connections=100)
    assert renewed[schema.DRAIN_REQUESTED] == {"by": "alice", "at_ms": 1_000}


def test_a_drain_request_is_refused_for_an_ended_session_and_writes_no_item_for_an_unknown_one(ddb, aws_env, sessions):
    sid = open_session(ddb, aws_env, "w1")
    assert sessions.end_own(sid, worker_id="w1")
    new, old = sessions.request_drain(sid, by="alice")
    assert new is None and old[schema.SESSION_STATE] == schema.ENDED and schema.DRAIN_REQUESTED not in old

    assert sessions.request_drain("nobody#1", by="alice") == (None, None)
    assert sessions.get("nobody#1") is None  # an UpdateItem whose condition fails creates nothing


def test_a_session_ended_by_its_own_worker_carries_what_it_still_held_for_the_summary(ddb, aws_env, sessions):
    # A clean exit ends holding none: the summary lists it dead with 0, and no worker reads
    # its inbox between renewals for it (worker.assignments); an end after the deadline
    # passed still holds some, as a crash's session does; without a count the last
    # renewal's stands.
    clean, late, bare = (open_session(ddb, aws_env, w) for w in ("w1", "w2", "w3"))
    for sid in (clean, late, bare):
        sessions.renew(sid, lease_ms=60_000, active=7, max_connections=100)
    assert sessions.end_own(clean, worker_id="w1", active=0)
    assert sessions.end_own(late, worker_id="w2", active=5)
    assert sessions.end_own(bare, worker_id="w3")
    assert [sessions.get(sid)[schema.ACTIVE] for sid in (clean, late, bare)] == [0, 5, 7]
    assert {sessions.get(sid)[schema.SESSION_STATE] for sid in (clean, late, bare)} == {schema.ENDED}


# --- the worker's reaction ----------------------------------------------------------------------


class Renewals:
    """A sessions store whose renewals answer the items given, one after the other."""

    def __init__(self, *items: dict) -> None:
        self.items = list(items)

    def renew(self, session_id, **kwargs):
        return self.items.pop(0)


def keeper_of(store, asked: list) -> SessionKeeper:
    async def call(fn, *args, **kwargs):
        return fn(*args, **kwargs)

    keeper = SessionKeeper(
        sessions=store, worker_id="w", timing=SessionTiming(4_000, 1_000, 500), max_connections=1, call=call,
        log=JsonLogger(io.StringIO()), active=lambda: 0, on_stops=lambda s: set(), on_drain=asked.append,
    )
    keeper.session_id = "w#1"
    return keeper


def test_the_keeper_tells_of_a_drain_request_once_however_many_renewals_bring_it():
    request = {"by": "alice", "at_ms": 5}
    item = {schema.SESSION_ID: "w#1", schema.SESSION_STATE: schema.LIVE}
    asked: list = []
    keeper = keeper_of(Renewals(item, {**item, schema.DRAIN_REQUESTED: request}, {**item, schema.DRAIN_REQUESTED: request}), asked)

    async def renewals() -> None:
        from wsfleet import clock

        keeper.deadline_mono = clock.now() + 10
        assert await keeper.renew_once()
        assert asked == []
        assert await keeper.renew_once()
        assert asked == [request]
        assert await keeper.renew_once()

    asyncio.run(renewals())
    keeper.note_drain({**item, schema.DRAIN_REQUESTED: request})  # a read of the item (the assignments' poll)
    assert asked == [request] and keeper.drain_request == request


def test_a_read_of_the_item_tells_of_it_too_and_before_its_assignments_are_taken():
    asked: list = []
    keeper = keeper_of(Renewals(), asked)
    keeper.note_drain({schema.SESSION_ID: "w#1"})
    assert asked == []
    keeper.note_drain({schema.SESSION_ID: "w#1", schema.DRAIN_REQUESTED: {"by": "b", "at_ms": Decimal(7)}})
    assert asked == [{"by": "b", "at_ms": 7}] and type(asked[0]["at_ms"]) is int  # a nested number is read as a Decimal


@contextlib.asynccontextmanager
async def session_open(aws_env, out: io.StringIO):
    """Worker w1 (its lines into ``out``) with its session open, not running its loops."""
    cfg = WorkerConfig.from_env(aws_env)
    aws = Aws(cfg, threads=2)
    worker = Worker(cfg, "w1", aws=aws, log=JsonLogger(out))
    try:
        assert await worker.keeper.open(asyncio.Event())
        yield worker
    finally:
        aws.close()


def test_the_worker_starts_the_sigterm_shutdown_once_when_its_renewal_brings_the_request(aws_env, sessions):
    out = io.StringIO()

    async def scenario() -> Worker:
        async with session_open(aws_env, out) as worker:
            assert await worker.keeper.renew_once()
            assert not worker.stopping.is_set()
            new, _ = sessions.request_drain(worker.keeper.session_id, by="alice")
            assert new is not None
            assert await worker.keeper.renew_once()
            assert worker.stopping.is_set() and worker.keeper.draining
            assert worker.drained_by == {"by": "alice", "at_ms": new[schema.DRAIN_REQUESTED]["at_ms"]}
            assert type(worker.drained_by["at_ms"]) is int  # logged as a number, not as a Decimal's string
            worker.request_shutdown()  # SIGTERM during the requested drain: the same one shutdown
            assert await worker.keeper.renew_once()  # brings the request again: nothing more
            assert worker.drained_by["by"] == "alice"
        return worker

    asyncio.run(scenario())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    requested = [line for line in lines if line["event"] == "shutdown_requested"]
    assert len(requested) == 1, requested
    assert requested[0]["why"] == "drain_requested" and requested[0]["requested"]["by"] == "alice"


def test_sigterm_first_then_the_request_is_still_one_shutdown_and_not_called_a_drain(aws_env, sessions):
    out = io.StringIO()

    async def scenario() -> Worker:
        async with session_open(aws_env, out) as worker:
            worker.request_shutdown()
            sessions.request_drain(worker.keeper.session_id, by="alice")
            assert await worker.keeper.renew_once()
        return worker

    worker = asyncio.run(scenario())
    assert worker.drained_by is None and worker.keeper.drain_request == {"by": "alice", "at_ms": pytest.approx(now_ms(), abs=60_000)}
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert events.count("shutdown_requested") == 1


# --- the command ----------------------------------------------------------------------------------


@pytest.fixture
def fleet(ddb, aws_env, conns, sessions):
    """w1 live holding c1, c2; w2 live holding c3; w3's session ENDED; w4 expired."""
    for cid in ("c1", "c2", "c3"):
        conns.start(cid, URL + cid)
    w1 = open_session(ddb, aws_env, "w1")
    acquire(ddb, aws_env, "c1", w1, "w1")
    acquire(ddb, aws_env, "c2", w1, "w1")
    w2 = open_session(ddb, aws_env, "w2")
    acquire(ddb, aws_env, "c3", w2, "w2")
    w3 = open_session(ddb, aws_env, "w3")
    sessions.end_own(w3, worker_id="w3")
    w4 = open_session(ddb, aws_env, "w4", ago_ms=120_000, lease_ms=10_000)
    return {"w1": w1, "w2": w2, "w3": w3, "w4": w4}


def test_drain_asks_the_workers_live_session_and_says_what_happens_next(capsys, aws_env, sessions, fleet):
    code, out, err = run(capsys, aws_env, "drain", "w1")
    assert (code, err) == (0, "")
    assert out.startswith(f"asked w1 (session {fleet['w1']}) to drain: its 2 connections move to its 1 live peer")
    assert "within about a heartbeat" in out and "ECS starts a replacement" in out
    request = sessions.get(fleet["w1"])[schema.DRAIN_REQUESTED]
    assert request["by"] and abs(request["at_ms"] - now_ms()) < 30_000
    assert schema.DRAIN_REQUESTED not in sessions.get(fleet["w2"])

    again = run_json(capsys, aws_env, "drain", fleet["w1"])  # by its session id; asked before
    assert (again["worker_id"], again["session_id"], again["connections"]) == ("w1", fleet["w1"], 2)
    assert again["already_asked"] is True and again["requested_at_ms"] == request["at_ms"]
    assert again["connection_ids"] == ["c1", "c2"] and again["live_peers"] == ["w2"]


def test_drain_dry_run_writes_nothing_and_output_json_is_json(capsys, aws_env, sessions, fleet):
    code, out, err = run(capsys, aws_env, "drain", "w2", "--dry-run")
    assert (code, err) == (0, "") and out.startswith(f"would ask w2 (session {fleet['w2']}) to drain (dry run: nothing written)")
    got = run_json(capsys, aws_env, "drain", "w2", "--dry-run", "--output", "json")
    assert got["dry_run"] is True and got["connections"] == 1 and "requested_by" not in got
    assert schema.DRAIN_REQUESTED not in sessions.get(fleet["w2"])


def test_the_last_live_worker_is_asked_too_and_told_its_connections_wait_unowned(capsys, ddb, aws_env, sessions):
    sid = open_session(ddb, aws_env, "solo")
    code, out, _ = run(capsys, aws_env, "drain", "solo")
    assert code == 0 and "it is the only live worker: its 0 connections are released unowned" in out
    assert schema.DRAIN_REQUESTED in sessions.get(sid)


@pytest.mark.parametrize(
    "worker, sentence",
    [
        ("wl", "no worker 'wl' in the sessions table: give a worker id or a session id as `wsfleet status` lists them (live workers: w1, w2)"),
        ("w3", "worker w3 has no live session (its newest, {w3}, is ENDED): only a live worker can be drained"),
        ("{w3}", "session {w3} (worker w3) is ENDED: only a live session can be drained"),
        ("w4", "worker w4 has no live session (its newest, {w4}, is LIVE, expired): only a live worker can be drained"),
    ],
)
def test_an_unknown_or_not_live_worker_is_one_sentence_and_exit_1(capsys, aws_env, sessions, fleet, worker, sentence):
    code, out, err = run(capsys, aws_env, "drain", worker.format(**fleet))
    assert (code, out) == (1, "")
    assert err == f"wsfleet: {sentence.format(**fleet)}.\n"
    assert all(schema.DRAIN_REQUESTED not in sessions.get(sid) for sid in fleet.values())


def test_a_session_ended_between_the_read_and_the_write_is_refused_by_the_write(capsys, aws_env, sessions, fleet, monkeypatch):
    real = drain_cli.attached

    def ended_meanwhile(reader, session_id):
        sessions.end_own(session_id, worker_id="w1")
        return real(reader, session_id)

    monkeypatch.setattr(drain_cli, "attached", ended_meanwhile)
    code, _, err = run(capsys, aws_env, "drain", "w1")
    assert code == 1 and err == f"wsfleet: session {fleet['w1']} (worker w1) is no longer live (ENDED): nothing was written.\n"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["drain"], "the following arguments are required: WORKER"),
        (["drain", "w1", "--wait", "--dry-run"], "not allowed with argument"),
        (["drain", "w1", "--timeout", "abc"], "--timeout: must be a number of seconds"),
        (["drain", "w1", "--interval", "0"], "--interval: must be more than 0 seconds"),
    ],
)
def test_bad_usage_is_exit_2_saying_why(capsys, argv, says):
    code, _, err = run(capsys, {}, *argv)
    assert code == 2 and says in err


def test_wait_reads_until_the_session_ended_and_its_connections_are_held_by_a_peer(
    capsys, ddb, aws_env, sessions, conns, fleet, monkeypatch
):
    naps = []

    def worker_leaves(seconds):  # what the drained worker and its peer do meanwhile
        naps.append(seconds)
        if len(naps) == 1:
            for cid in ("c1", "c2"):
                assert conns.release(cid, session_id=fleet["w1"], fence_token=1, last_seq=0, handoff=True)
            sessions.end_own(fleet["w1"], worker_id="w1")
        elif len(naps) == 2:
            for cid in ("c1", "c2"):
                acquire(ddb, aws_env, cid, fleet["w2"], "w2")

    monkeypatch.setattr(drain_cli, "wait", functools.partial(drain_cli.wait, sleep=worker_leaves))
    code, out, err = run(capsys, aws_env, "drain", "w1", "--wait", "--interval", "0.01")
    assert (code, err) == (0, ""), err
    assert len(naps) == 2
    first, last = out.strip().splitlines()
    assert first.startswith("asked w1")
    assert last.startswith("w1 drained in ") and last.endswith(": session ENDED; held now by w2 (2)")


def test_wait_past_its_timeout_names_what_is_not_held_yet_and_exits_1(capsys, aws_env, conns, fleet):
    assert conns.release("c2", session_id=fleet["w1"], fence_token=1, last_seq=0, handoff=True)
    code, out, err = run(capsys, aws_env, "drain", "w1", "--wait", "--timeout", "0.3", "--interval", "0.1", "--json")
    assert code == 1
    got = json.loads(out)["drained"]
    assert got["done"] is False and got["session_state"] == "LIVE"
    assert got["waiting"] == {"c1": "held by w1 (live)", "c2": "handed off by w1, not taken yet"}
    assert err == (
        f"wsfleet: w1 not drained after 0.3s: session {fleet['w1']} is LIVE; 2 of its connections not held by a live "
        "peer yet: c1 (held by w1 (live)), c2 (handed off by w1, not taken yet).\n"
    )
