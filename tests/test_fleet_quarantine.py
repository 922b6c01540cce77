"""The crash-loop breaker in a fleet of real worker processes: a forced crash loop (the
harness kills, as an OOM kill would, whichever worker holds the culprit once its session
has named the culprit its prime suspect) quarantines the culprit after
QUARANTINE_AFTER deaths, and nothing else; a START runs it again.

The culprit's upstream sends it the most bytes by far (``amplify``: every frame 64 KiB
of zeros), so each worker that holds it names it. Its neighbours, ordinary small feeds,
share the dead workers and are never struck. Fast timings as in test_fleet.py.
"""

from __future__ import annotations

import pytest

from sim.fleet import Fleet
from sim.processes import eventually
from sim.timing import Timing
from wsfleet import schema
from wsfleet.crash_loop import Suspect
from wsfleet.store import ConnectionsStore, SessionsStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

TIMING = Timing(lease_s=3.0, heartbeat_s=0.75, reconcile_s=1.0, skew_ms=200, flush_ms=500, shutdown_s=5.0, checkpoint_s=1.0)
WORKERS = ("w1", "w2", "w3")
AFTER = 3  # QUARANTINE_AFTER, the default
CULPRIT = "culprit"
NEIGHBOURS = [f"n{i}" for i in range(6)]
POLL_S = 0.25


@pytest.fixture(scope="module")
def backend(emulator):
    return emulator


@pytest.fixture
def fleet(backend, tmp_path):
    with Fleet(run_dir=tmp_path, timing=TIMING, rate=5.0, emulator=backend, sample_interval=None) as f:
        yield f


def stores(fleet: Fleet, ddb) -> tuple[ConnectionsStore, SessionsStore]:
    env = fleet.aws_env
    return (
        ConnectionsStore(ddb, env["TABLE_NAME"], state_shards=int(env.get("STATE_SHARDS", "4"))),
        SessionsStore(ddb, env["SESSIONS_TABLE_NAME"]),
    )


def named_holder(connections: ConnectionsStore, sessions: SessionsStore) -> tuple[str, str] | None:
    """(worker, session) holding the culprit whose latest renewal named it the prime suspect
    at its own fence, or None yet."""
    item = connections.get(CULPRIT) or {}
    session_id = item.get(schema.LEASE_SESSION, "")
    session = sessions.get(session_id) if session_id else None
    if not session or session.get(schema.SESSION_STATE) != schema.LIVE:
        return None
    suspect = Suspect.from_item(session.get(schema.SUSPECT))
    if suspect is None or (suspect.connection_id, suspect.fence_token) != (CULPRIT, int(item[schema.FENCE_TOKEN])):
        return None
    return session[schema.SESSION_WORKER_ID], session_id


def test_a_forced_crash_loop_quarantines_the_culprit_and_nothing_else(fleet, ddb):
    for name in WORKERS:
        fleet.start_worker(name)
    connections, sessions = stores(fleet, ddb)
    fleet.start_connection(CULPRIT, fleet.ws_url(CULPRIT) + "?amplify=65536&amplify_every=1&amplify_with=zeros")
    for cid in NEIGHBOURS:
        fleet.start_connection(cid)

    for death in range(1, AFTER + 1):
        holder, session_id = eventually(
            lambda: named_holder(connections, sessions), 30, f"a holder of {CULPRIT} that names it (death {death})", interval=POLL_S
        )
        fleet.kill(holder)
        fleet.start_worker(holder, wait=False)  # back as a new session: the fleet stays three
        if death < AFTER:
            eventually(
                lambda dead=session_id: (connections.get(CULPRIT) or {}).get(schema.LEASE_SESSION) not in ("", dead) or None,
                30, f"{CULPRIT} taken again after death {death}", interval=POLL_S,
            )
            eventually(
                lambda n=death: int((connections.get(CULPRIT) or {}).get(schema.STRIKES, 0)) == n,
                10, f"strike {death} against {CULPRIT}", interval=POLL_S,
            )

    status, body = eventually(
        lambda: (got := fleet.get_connection(CULPRIT))[1].get(schema.QUARANTINED) and got, 30, f"{CULPRIT} quarantined",
        interval=POLL_S,
    )
    assert status == 200 and body[schema.QUARANTINED]["reason"].startswith(f"crash_loop: the prime suspect of {AFTER}")
    assert body[schema.LEASE_OWNER] == "" and body[schema.LEASE_EXPIRES_AT_MS] == 0

    # Nothing else: every neighbour shared dead workers, none was struck, all are owned.
    def neighbours_owned():
        items = {cid: connections.get(cid) for cid in NEIGHBOURS}
        return all(i.get(schema.LEASE_SESSION) for i in items.values()) and items

    items = eventually(neighbours_owned, 30, "every neighbour owned again", interval=POLL_S)
    for cid, item in items.items():
        assert not {schema.QUARANTINED, schema.STRIKES, schema.STRIKE_FENCE} & set(item), (cid, item)
    # The culprit stays set aside: no hint, scan or drain takes it.
    assert connections.get(CULPRIT).get(schema.LEASE_SESSION) == "" and schema.OWNER_KEY not in connections.get(CULPRIT)

    # A new START (what `wsfleet retry` sends) runs it again.
    status, _ = fleet.request(
        "POST", "/events", {"event_type": "START", "connection_id": CULPRIT, "ws_url": body[schema.WS_URL]}
    )
    assert status == 202
    eventually(lambda: (connections.get(CULPRIT) or {}).get(schema.LEASE_SESSION) or None, 30, f"{CULPRIT} taken again", interval=POLL_S)
    assert schema.QUARANTINED not in fleet.get_connection(CULPRIT)[1]
