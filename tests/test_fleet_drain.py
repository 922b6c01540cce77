"""``wsfleet drain`` against a fleet of real worker processes on the emulator: the CLI's
own code path (``wsfleet.cli.main``, pointed at the fleet's tables as an operator's shell
would be) asks one worker to leave; it hands every connection to its live peers, ends its
session, logs that it was drained by request and exits 0, and nothing is lost or doubled.
The last live worker drains too: its connections wait, free, for the next worker.

The fleet's timings are tests/test_fleet.py's (lease 3 s, heartbeat 0.75 s, shutdown 5 s)."""

from __future__ import annotations

import json
import time

import pytest

from sim.processes import eventually
from sim.fleet import Fleet
from tests.test_fleet import RATE, TIMING, busiest, start_connections, start_workers, stop_all_and_audit
from wsfleet.cli import main as cli_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture
def fleet(emulator, tmp_path):
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=RATE, emulator=emulator, sample_interval=None) as f:
        yield f


def drain(capsys, fleet, *argv: str) -> dict:
    """``wsfleet drain ... --json`` with the fleet's environment; its answer."""
    capsys.readouterr()
    code = cli_main(["drain", *argv, "--json"], env=fleet.aws_env)
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), (code, err, out)
    return json.loads(out)


def exited(fleet, name: str, timeout: float) -> int:
    """The worker's exit status, once it has exited by itself (polled: never killed)."""
    proc = fleet.workers[name]
    eventually(lambda: proc.popen.poll() is not None, timeout, f"{name} to exit", interval=0.1)
    return proc.popen.returncode


def test_a_drained_worker_hands_every_connection_to_a_live_peer_ends_its_session_and_exits_0(fleet, capsys):
    start_workers(fleet, "w1", "w2", "w3")
    ids = start_connections(fleet, 6)
    victim, _ = busiest(fleet)
    peers = {"w1", "w2", "w3"} - {victim}

    started = time.monotonic()
    answer = drain(capsys, fleet, victim, "--wait", "--timeout", "60", "--interval", "0.5")
    took = time.monotonic() - started

    assert answer["worker_id"] == victim and answer["already_asked"] is False
    assert sorted(answer["live_peers"]) == sorted(peers)
    affected = set(answer["connection_ids"])  # what it held when asked (a rebalance may have moved one since busiest)
    assert affected
    drained = answer["drained"]
    assert drained["done"] and drained["session_state"] == "ENDED" and drained["waiting"] == {}
    assert set(drained["owners"]) <= peers and sum(drained["owners"].values()) >= len(affected), drained
    print(f"drain of {victim} ({len(affected)} connections): {took:.1f} s until --wait returned")

    assert exited(fleet, victim, TIMING.shutdown_s + 10) == 0
    events = fleet.events(victim)
    [line] = [e for e in events if e["event"] == "drained_by_request"]
    assert (line["requested_by"], line["requested_at_ms"]) == (answer["requested_by"], answer["requested_at_ms"])
    assert line["session_id"] == answer["session_id"] and line["left"] == 0
    assert [e["event"] for e in events].count("shutdown_requested") == 1
    # Handed over, not taken over: it released every one itself, then ended its own session.
    asked_s = answer["requested_at_ms"] / 1000 - 1
    assert affected <= {e["connection_id"] for e in events if e["event"] == "lease_released" and e["ts"] >= asked_s}
    assert {(s.state, s.ended_by) for s in fleet.sessions_of(victim).values()} == {("ENDED", victim)}
    now = int(time.time() * 1000)
    states = fleet.scan()
    assert {cid: states[cid].owned_at(now) in peers for cid in affected} == dict.fromkeys(affected, True)
    assert fleet.upstream.overlaps() == []  # never two sockets for one stream
    stop_all_and_audit(fleet, ids)


def test_the_last_live_worker_drains_too_and_its_connections_wait_free_for_the_next(fleet, capsys):
    start_workers(fleet, "w1")
    ids = start_connections(fleet, 2)

    answer = drain(capsys, fleet, "w1")
    assert answer["live_peers"] == [] and answer["connections"] == 2

    assert exited(fleet, "w1", TIMING.shutdown_s + 10) == 0
    assert any(e["event"] == "drained_by_request" for e in fleet.events("w1"))
    assert {s.state for s in fleet.sessions_of("w1").values()} == {"ENDED"}
    # Nobody to hand them to: released and hinted as at SIGTERM, owned by nobody until a
    # worker takes their hints (or its free scan finds them).
    now = int(time.time() * 1000)
    assert {cid: c.owned_at(now) for cid, c in fleet.scan().items()} == dict.fromkeys(ids, "")
    start_workers(fleet, "w2")  # ECS's replacement
    fleet.wait_connected(ids, timeout=TIMING.lease_s + 4 * TIMING.reconcile_s + 15)
    assert fleet.upstream.overlaps() == []
    stop_all_and_audit(fleet, ids)
