"""Picking up what was moved to this worker's session: the renewal brings the
assignments (before the STOPs) and the next removes those acted on; the pickup acquires
each as already ours, gives back what it has no room for, and picks nothing up while
the worker shuts down."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from wsfleet import clock, schema
from wsfleet.leases import SessionTiming
from wsfleet.logs import JsonLogger
from wsfleet.store import Released, SessionsStore
from wsfleet.worker import assignments as assignments_module
from wsfleet.worker.assignments import EXPECT_AFTER_SUSPECT_S, IDLE_POLL_S, POLL_S, Assignments
from wsfleet.worker.session import SessionKeeper

from tests.conftest import open_sessions

URL = "ws://127.0.0.1:9/s"


async def call(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def test_a_renewal_hands_over_the_assignments_before_the_stops_and_the_next_removes_those_acted_on(ddb, aws_env, stores):
    conns, _ = stores
    sessions = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])
    open_sessions(ddb, aws_env, "a#1")
    seen: list[tuple[str, set[str]]] = []

    def on(kind):
        def acted(entries: set[str]) -> set[str]:
            seen.append((kind, set(entries)))
            return set(entries)

        return acted

    keeper = SessionKeeper(
        sessions=sessions, worker_id="b", timing=SessionTiming(10_000, 2_500, 1_000), max_connections=10, call=call,
        log=JsonLogger(), active=lambda: 0, on_stops=on("stops"), on_assigned=on("assigned"),
    )

    async def scenario():
        assert await keeper.open(asyncio.Event())
        conns.start("c1", URL)
        conns.acquire("c1", session_id="a#1", worker_id="a")
        assert conns.release("c1", session_id="a#1", fence_token=1, last_seq=3, handoff=True) is Released.HANDED
        conns.move("c1", from_session="a#1", fence_token=1, to_session=keeper.session_id, released=True)
        conns.stop("c1", sessions=sessions)  # posted to the session it is attached to now: ours

        assert await keeper.renew_once()
        assert seen == [("assigned", {"c1#2"}), ("stops", {"c1#2"})]
        assert await keeper.renew_once()
        assert seen == [("assigned", {"c1#2"}), ("stops", {"c1#2"})]  # nothing handed over twice
        item = sessions.get(keeper.session_id)
        assert not item.get(schema.ASSIGNED) and not item.get(schema.STOP_INBOX)

    asyncio.run(scenario())


def pickup(*, accepting: bool = True, free: int = 5, busy: tuple[str, ...] = ()):
    done = {"acquired": [], "freed": [], "hinted": []}

    async def try_acquire(cid, **kwargs):
        done["acquired"].append((cid, kwargs["expected_session"]))
        return object()

    async def hint(cid, **kwargs):
        done["hinted"].append(cid)
        return True

    def free_orphan(cid, *, dead_session):
        done["freed"].append((cid, dead_session))
        return True

    assignments = Assignments(
        acquisition=SimpleNamespace(accepting=lambda: accepting, try_acquire=try_acquire),
        holdings=SimpleNamespace(busy=lambda cid: cid in busy, free=lambda: free),
        keeper=SimpleNamespace(session_id="me#1"),
        connections=SimpleNamespace(free_orphan=free_orphan),
        sessions=None,
        attachments=SimpleNamespace(trying=lambda cid: None, settled=lambda cid: None),
        hints=SimpleNamespace(hint=hint),
        call=call,
        log=JsonLogger(),
    )
    return assignments, done


def run(assignments: Assignments, entries: set[str]) -> set[str]:
    async def scenario():
        acted = assignments.on_assigned(entries)
        while assignments._tasks:
            await asyncio.sleep(0.01)
        return acted

    return asyncio.run(scenario())


def test_each_assignment_is_acquired_as_already_ours_and_one_held_already_is_just_acknowledged():
    assignments, done = pickup(busy=("c2",))
    assert run(assignments, {"c1#2", "c2#5"}) == {"c1#2", "c2#5"}
    assert done == {"acquired": [("c1", "me#1")], "freed": [], "hinted": []}
    assert assignments.picked_up == 1


def test_an_assignment_with_no_room_here_is_freed_from_our_session_and_hinted_for_anyone():
    assignments, done = pickup(free=0)
    assert run(assignments, {"c1#2"}) == {"c1#2"}
    assert done == {"acquired": [], "freed": [("c1", "me#1")], "hinted": ["c1"]}


def test_while_the_worker_shuts_down_no_assignment_is_acted_on():
    assignments, done = pickup(accepting=False)
    assert run(assignments, {"c1#2"}) == set()  # left in the inbox, for the leaving worker's last step
    assert done == {"acquired": [], "freed": [], "hinted": []}


def test_a_leaving_worker_frees_what_was_moved_to_it_and_never_picked_up_though_the_index_lags(ddb, aws_env, stores):
    from wsfleet.worker.attached import Attachments

    conns, _ = stores
    sessions = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])
    open_sessions(ddb, aws_env, "a#1", "b#1")
    conns.start("c1", URL)
    conns.acquire("c1", session_id="a#1", worker_id="a")
    conns.release("c1", session_id="a#1", fence_token=1, last_seq=3, handoff=True)
    conns.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=True)
    sessions.end_own("b#1", worker_id="b")  # b shut down before its next renewal
    hinted: list[str] = []

    async def hint(cid, **kwargs):
        hinted.append(cid)
        return True

    lagging = SimpleNamespace(get_many=conns.get_many, free_orphan=conns.free_orphan, owned_by=lambda sid: [])
    attachments = Attachments(connections=lagging, sessions=sessions, call=call, hints=SimpleNamespace(hint=hint), log=JsonLogger())
    attachments.reset("b#1")

    assert asyncio.run(attachments.leave_ring_when_clear("b#1", held=lambda cid: False))
    item = conns.get("c1")
    assert item["lease_session"] == "" and item["owner_key"].startswith(schema.OWNER_KEY_FREE_PREFIX)
    assert hinted == ["c1"]


def test_between_renewals_the_session_item_is_read_at_every_turn_while_moves_are_expected(monkeypatch):
    monkeypatch.setattr(assignments_module, "IDLE_POLL_S", float("inf"))  # the idle reads: the next test
    reads: list[str] = []
    taken: list[set[str]] = []
    under = [False]

    def get(session_id):
        reads.append(session_id)
        return {schema.SESSION_STATE: schema.LIVE, schema.ASSIGNED: {"c1#2"}}

    fleet = [None]  # no fresh summary
    suspect_at = [float("-inf")]
    assignments, _ = pickup()
    assignments._holdings.standing = lambda me: SimpleNamespace(under_target=lambda: under[0], fleet=fleet[0])
    assignments._suspect_at = lambda: suspect_at[0]
    noted: list[dict] = []  # the keeper reads a drain request (wsfleet drain) from the item too
    assignments._keeper = SimpleNamespace(session_id="me#1", live=lambda: True, take_assigned=taken.append,
                                          note_drain=noted.append, read_at=clock.now())
    assignments._sessions = SimpleNamespace(get=get)

    assert asyncio.run(assignments.poll_once()) == 0 and reads == []  # at its target, nothing picked up lately
    under[0] = True  # a newcomer, or a survivor of a crash, by the summary
    assert asyncio.run(assignments.poll_once()) == 1
    assert reads == ["me#1"] and taken == [{"c1#2"}] and noted == [get("me#1")]

    # At its target, but a session it watches looked dead lately: its watchers' drain
    # names targets in the fleet, this worker among them
    under[0] = False
    reads.clear()
    suspect_at[0] = clock.now() - (EXPECT_AFTER_SUSPECT_S - 1)
    assert asyncio.run(assignments.poll_once()) == 1
    suspect_at[0] = clock.now() - (EXPECT_AFTER_SUSPECT_S + 1)
    assert asyncio.run(assignments.poll_once()) == 0 and len(reads) == 1
    # ... or the fleet summary lists a dead session; not one slow to renew (a suspect: in
    # a fleet of thousands there often is one, and every worker would read 4 times a second)
    fleet[0] = SimpleNamespace(suspects=0, dead={"w9#1": 12})
    assert asyncio.run(assignments.poll_once()) == 1
    fleet[0] = SimpleNamespace(suspects=1, dead={})
    assert asyncio.run(assignments.poll_once()) == 0 and len(reads) == 2
    # ... nor a graceful leaver's, ended holding none (its handoffs go by anonymous hints)
    fleet[0] = SimpleNamespace(suspects=0, dead={"w8#1": 0})
    assert asyncio.run(assignments.poll_once()) == 0 and len(reads) == 2


def test_otherwise_the_session_item_is_read_once_a_second_has_passed_since_it_was_last_seen(monkeypatch):
    # A drain names its survivors by load: one that expects nothing (its summary does not
    # list the dead session yet) reads its inbox within about a second, not a heartbeat.
    now = [1000.0]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    reads: list[str] = []
    taken: list[set[str]] = []

    def get(session_id):
        reads.append(session_id)
        return {schema.SESSION_STATE: schema.LIVE, schema.ASSIGNED: {"c1#2"}}

    assignments, _ = pickup()
    assignments._holdings.standing = lambda me: SimpleNamespace(under_target=lambda: False, fleet=None)
    keeper = SimpleNamespace(session_id="me#1", live=lambda: True, take_assigned=taken.append,
                             note_drain=lambda item: None, read_at=now[0])  # a renewal answered just now
    assignments._keeper = keeper
    assignments._sessions = SimpleNamespace(get=get)

    def turn(dt: float) -> int:  # the loop's next turn, dt later
        now[0] += dt
        return asyncio.run(assignments.poll_once())

    assert POLL_S < IDLE_POLL_S == 1.0
    assert turn(0.0) == 0 and turn(0.9) == 0 and reads == []  # expecting nothing, seen 0.9 s ago
    assert turn(0.2) == 1 and reads == ["me#1"] and taken == [{"c1#2"}]  # 1.1 s: read
    assert turn(0.5) == 0 and turn(0.4) == 0 and len(reads) == 1  # 0.9 s after that read
    assert turn(0.25) == 1 and len(reads) == 2
    keeper.read_at = now[0] + 0.5  # a renewal sent half a second on, and answered
    assert turn(1.0) == 0 and turn(0.4) == 0 and len(reads) == 2
    assert turn(0.2) == 1 and len(reads) == 3
