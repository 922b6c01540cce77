"""Upstreams of every kind on the fleet as real processes: kill -9 of their owners.

One connection of each upstream kind (:mod:`sim.kind_streams`: a secret
header from the emulator's Secrets Manager, a subprotocol with a subscribe message that
alone carries the resume point and a nested seq, whole flat frames, and an upstream that
cannot replay) beside a default one, on worker processes. Their owners are killed with
SIGKILL one after another, the secret is rotated with the old credential revoked, and at
the end the audit reads only independent evidence (the upstream's books: what each
socket asked for and was sent; the messages table): the replaying kinds hold every seq
once, from 1 to their checkpoint, with the data the upstream produced in their shape;
the one that cannot replay holds exactly one ``upstream_gap`` marker per reconnect, for
no more than what its dead owner and nobody received. No secret value in any log, item
or GET body.
"""

from __future__ import annotations

import pytest

from sim import kind_streams
from sim.fleet import Fleet
from sim.processes import eventually
from sim.timing import Timing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

TIMING = Timing(lease_s=3.0, heartbeat_s=0.75, reconcile_s=1.0, skew_ms=200, flush_ms=300, shutdown_s=5.0, checkpoint_s=1.0)
RATE = 4.0  # messages per second per stream
DEFAULT_ID = "d-1"


@pytest.fixture
def fleet(emulator, tmp_path):
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=RATE, emulator=emulator, sample_interval=None) as f:  # judged by the books, not samples
        yield f


def owner(fleet: Fleet, cid: str) -> str:
    return fleet.sample().owners().get(cid, "")


def stored_past(fleet: Fleet, ids: list[str], marks: dict[str, int], more: int) -> bool:
    states = fleet.scan()
    return all(states[c].last_seq >= marks.get(c, 0) + more for c in ids)


def kill_owner_and_wait_taken_over(fleet: Fleet, cid: str, ids: list[str], replacement: str) -> str:
    """SIGKILL the worker owning ``cid``, start a replacement, and wait until ``cid`` has
    a live owner that is not the victim and every connection stores again."""
    victim = eventually(lambda: owner(fleet, cid) or None, 15, f"an owner of {cid}", interval=0.25)
    marks = {c: s.last_seq for c, s in fleet.scan().items()}
    fleet.kill(victim)
    fleet.start_worker(replacement, wait=False)
    eventually(lambda: owner(fleet, cid) not in ("", victim), TIMING.crash_bound_s + 15, f"{cid} taken over", interval=0.25)
    eventually(lambda: stored_past(fleet, ids, marks, 3), 30, "every connection storing again", interval=0.25)
    return victim


def test_every_upstream_kind_survives_kill_9_of_its_owners_nothing_lost_doubled_or_invented(fleet):
    for name in ("w1", "w2", "w3"):
        fleet.start_worker(name, wait=False)
    for name in ("w1", "w2", "w3"):
        fleet.wait_started(name)
    kinds = kind_streams.KindStreams(fleet, say=lambda _: None)
    ids = kinds.start()
    assert fleet.start_connection(DEFAULT_ID) == 202
    every = [*ids, DEFAULT_ID]
    fleet.wait_connected(every, timeout=30)
    eventually(lambda: stored_past(fleet, every, {}, 3), 30, "a few frames stored each", interval=0.25)

    # kill -9 of the subscribe kind's owner (its successor resumes by the open message
    # alone), then a rotation with the old credential revoked, then kill -9 of whoever
    # owns the kind that cannot replay.
    first = kill_owner_and_wait_taken_over(fleet, kind_streams.SUBSCRIBE, every, "w4")
    kinds.rotate()
    second = kill_owner_and_wait_taken_over(fleet, kind_streams.NONE, every, "w5")
    assert {first, second} <= {"w1", "w2", "w3", "w4"}

    for cid in every:
        assert fleet.stop_connection(cid) == 202
    fleet.wait_quiet(every, timeout=TIMING.stop_bound_s + TIMING.lease_s + 10)

    audits = {a.connection_id: a for a in kinds.audit()}
    assert [(c, a.problems) for c, a in audits.items() if not a.ok] == []
    assert all(a.checkpoint > 0 for a in audits.values()), audits
    # Each of these lost its socket (a kill -9 of its owner, the rotation's cut) and came back.
    for cid in (kind_streams.SUBSCRIBE, kind_streams.NONE, kind_streams.AUTH):
        assert audits[cid].sockets >= 2, audits[cid]
    none = audits[kind_streams.NONE]
    # It lost its socket with its owner at least once: each reconnect's gap is one marker.
    assert none.gaps and all(g.marker is not None for g in none.gaps), none
    auth = audits[kind_streams.AUTH]
    assert any("secret values found in none" in n for n in auth.notes), auth.notes
    default = fleet.audit([DEFAULT_ID])[0]
    assert default.ok and default.first == 1 and default.rows == default.checkpoint, default
    assert fleet.upstream.overlaps() == []
