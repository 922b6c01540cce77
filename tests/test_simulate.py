"""The virtual-time simulator (sim.virtual) at a smoke size: a crash recovered within
the lease and a few seconds by the workers' own roles, a seed that replays a run, and
the in-memory table and queue keeping DynamoDB's and SQS's rules (a partition's limit, a
condition, the dead-letter rule). No process starts and no Worker.run runs: each worker
is the product's roles on a virtual clock."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from bench.simulate import PLAN_SCENARIO
from sim.virtual import Settings, scenarios, simulate
from sim.virtual.capacity import WCU_PER_S, Partitions
from sim.virtual.dynamo import Dynamo
from sim.virtual.fleet import Fleet
from sim.virtual.loop import VirtualLoop
from sim.virtual.scenarios import Run
from sim.virtual.sqs import Queue
from wsfleet import schema
from wsfleet.plan import environments as plan_environments
from wsfleet.plan.bursts import bursts, inbox_fill_units
from wsfleet.store import ConnectionsStore, Moved, SessionsStore, TransientError


PROD = plan_environments.load("prod")


@pytest.fixture(scope="module")
def crash() -> dict:
    return simulate("crash10", workers=20, per_worker=10, seed=1)


def test_a_crash_is_recovered_by_the_survivors_within_a_lease_and_five_seconds(crash):
    recovery = crash["crash_recovery"]
    assert crash["killed"] == 2 and recovery["count"] == 20 and recovery["not_reopened"] == 0
    # A lease (10 s) from the session's last renewal before anyone may take them, and that
    # renewal was at most a heartbeat (2.5 s) before the kill.
    assert 10 - 2.5 <= recovery["p50_s"] <= recovery["p99_s"] <= 15
    assert crash["double_owners"] == 0 and crash["dead_letters"] == 0 and not crash["throttled_requests"]
    assert all(crash["bounds"].values()), crash["bounds"]


def test_a_session_whose_two_watchers_died_with_it_is_taken_over_within_a_lease_and_five_seconds():
    # Three sessions in a row of the ring killed at once: the third's watchers are the
    # first two. The live session before them reads past its dead successors to it.
    fleet = Fleet(Settings(), seed=5)
    run = Run("crash10", 8, 5, 5)

    async def main() -> None:
        await scenarios._start(fleet, run)
        ring = sorted(fleet.running(), key=lambda t: t.worker.keeper.session_id)
        fleet.kill([t.name for t in ring[2:5]])
        await fleet.until(lambda: not fleet.books.closed, timeout=60, every=0.25)

    try:
        fleet.run(main)
        gaps = [g.opened_at - g.closed_at for g in fleet.books.gaps if g.reason == "crash"]
        assert len(gaps) == 15 and not fleet.books.closed
        assert max(gaps) <= 15  # was about 25 s: once the two watchers had left the ring
    finally:
        fleet.close()


def _plan(workers: int, per_worker: int, *, tasks_quota: int = 5000) -> dict:
    return bursts(workers=workers, per_worker=per_worker, settings=PROD, tasks_quota=tasks_quota, launches_per_minute=500)


@pytest.mark.parametrize("scenario", ["crash10", "az", "join", "scalein", "deploy"])
def test_the_plans_ring_writes_are_what_the_simulator_measures_within_25_percent(scenario):
    # 60 workers: the plan's rate is what the sessions changing within a heartbeat or two
    # write, and at 20 one second's peak is mostly chance. A join's writes are a steady
    # stream over half a minute: its busiest two heartbeats (a few writes a second here),
    # a maximum that varies from seed to seed (4.0 to 6.2 over eight): the mean of three.
    planned = _plan(60, 10)[PLAN_SCENARIO[scenario]]["ring_writes_per_s"]
    if scenario == "join":
        measured = sum(simulate(scenario, workers=60, per_worker=10, seed=s)["ring_writes_busiest_5s"] for s in (1, 2, 3)) / 3
    else:
        measured = simulate(scenario, workers=60, per_worker=10, seed=1)["peak_by_partition_kind"]["ring"]["write"]
    assert measured == pytest.approx(planned, rel=0.25)


def test_a_join_far_larger_than_an_inbox_ends_within_one_of_every_target_with_few_second_moves():
    # 2 newcomers into 20 workers of 700: each 636 under, more than a newcomer's inbox
    # takes between two passes of a shedder (288), so the sheds are paced. Before: never
    # within one in the 600 s watched (a worker 2 over stays in the tolerance band), 1,573
    # handoffs for the 1,272 needed, 768 moves refused at a full inbox and hinted for anyone.
    f = simulate("join", workers=20, per_worker=700, seed=1)
    assert f["fair_after_s"] is not None and f["fair_after_s"] <= 300
    assert f["handoff_gaps"]["count"] <= 1.1 * 2 * 636 and f["hints_sent"] <= 0.1 * 2 * 636
    assert f["dead_letters"] == 0 and f["double_owners"] == 0


def test_a_deploy_past_ecs_tasks_per_service_goes_in_the_rounds_the_plan_says():
    quota = 6  # 4 tasks and room for 2 more at once: two rounds
    f = simulate("deploy", workers=4, per_worker=3, seed=2, settings=Settings(max_tasks=quota))
    planned = _plan(4, 3, tasks_quota=quota)["deploy"]
    assert (f["rounds"], f["peak_tasks"]) == (planned["rounds"], planned["tasks_at_once"]) == (2, 6)
    # every connection handed over at least once (some twice: to an old task the second round stops)
    assert f["handoff_gaps"]["count"] >= 12 and f["handoff_gaps"]["not_reopened"] == 0 and f["dead_letters"] == 0


def test_the_same_seed_replays_the_same_run_and_another_seed_does_not():
    def figures(seed: int) -> dict:
        f = simulate("scalein", workers=3, per_worker=6, seed=seed)
        return {k: v for k, v in f.items() if k not in ("wall_s", "max_rss_mb")}

    first = figures(3)
    assert first["handoff_gaps"]["count"] == 6
    assert figures(3) == first
    assert figures(4) != first


def _sessions() -> tuple[Dynamo, SessionsStore, VirtualLoop]:
    loop = VirtualLoop()
    dynamo = Dynamo(Partitions(loop.time))
    dynamo.create_table(**schema.sessions_table_spec("sessions"))
    return dynamo, SessionsStore(dynamo, "sessions", clock_ms=lambda: 1000), loop


def test_the_table_refuses_what_passes_a_partitions_write_limit_in_a_second_as_a_transient_fault():
    dynamo, store, loop = _sessions()
    store.open("w#1", worker_id="w", lease_ms=10_000, max_connections=10)
    for _ in range(WCU_PER_S - 1):  # the open wrote one unit; each announce writes one more
        assert store.announce("w#1")
    with pytest.raises(TransientError):
        store.announce("w#1")
    loop.now = 1.0  # the next second has its full allowance again
    assert store.announce("w#1")
    assert dynamo.partitions.throttled == {"write": 1}
    assert dict(dynamo.partitions.throttled_at) == {0: 1}  # when: the report tells the fleet's start from the event


def test_the_tables_conditions_are_the_stores_a_renewal_of_an_ended_session_is_refused():
    _, store, _ = _sessions()
    store.open("w#1", worker_id="w", lease_ms=10_000, max_connections=10)
    assert store.end_own("w#1", worker_id="w")
    assert store.renew("w#1", lease_ms=10_000, active=0, max_connections=10).value == "ended"
    assert store.leave_ring("w#1") and store.ring_page(limit=10)[0] == []
    with pytest.raises(ClientError):
        store.open("w#1", worker_id="other", lease_ms=10_000, max_connections=10)


def _moved_to_one_session(n: int) -> tuple[list, Dynamo]:
    """``n`` connections of the longest id moved to one session within a second (a
    newcomer named by many shedders): each move rewrites the growing session item in a
    transaction."""
    dynamo, sessions, _ = _sessions()
    dynamo.create_table(**schema.connections_table_spec("connections"))
    connections = ConnectionsStore(dynamo, "connections", state_shards=16, sessions_table_name="sessions", clock_ms=lambda: 1000)
    for sid in ("a#1", "b#1"):
        sessions.open(sid, worker_id=sid[0], lease_ms=10_000, max_connections=500)
    ids = [f"{i:03d}".ljust(128, "x") for i in range(n)]
    dynamo.load("connections", [{
        schema.PK: schema.connection_pk(cid), schema.DESIRED_STATE: schema.STARTED, schema.WS_URL: "wss://x",
        schema.LEASE_OWNER: "a", schema.LEASE_SESSION: "a#1", schema.FENCE_TOKEN: 1,
        schema.OWNER_KEY: schema.owner_key_session("a#1"), schema.UPDATED_AT_MS: 0, schema.CREATED_AT_MS: 0,
    } for cid in ids])
    return [connections.move(cid, from_session="a#1", fence_token=1, to_session="b#1", released=False) for cid in ids], dynamo


def test_moves_to_one_session_stop_at_its_inbox_before_its_partitions_write_limit():
    # Its inbox takes ASSIGNED_MAX; the rest are refused (they go the anonymous way), and
    # the item's partition stays within the plan's bound for a full inbox, under its limit.
    landed, dynamo = _moved_to_one_session(120)
    assert landed.count(Moved.MOVED) == schema.ASSIGNED_MAX and set(landed[schema.ASSIGNED_MAX:]) == {Moved.REFUSED}
    (_, hottest), units = dynamo.partitions.peak("write")
    assert not dynamo.partitions.throttled
    assert hottest == "b#1" and units <= inbox_fill_units(schema.ASSIGNED_MAX) < WCU_PER_S


def test_an_inbox_of_500_let_the_same_moves_pass_the_partitions_write_limit(monkeypatch):
    monkeypatch.setattr(schema, "ASSIGNED_MAX", 500)
    with pytest.raises(TransientError):  # the store's answer to ProvisionedThroughputExceeded
        _moved_to_one_session(120)


def test_the_queue_moves_a_hint_to_the_dead_letter_queue_at_its_sixth_receive():
    loop = VirtualLoop()

    async def main() -> tuple[int, int]:
        q = Queue(now=loop.time, wall_ms=lambda: 0, visibility_s=20)
        q.send_message_batch(QueueUrl="q", Entries=[{"Id": "0", "MessageBody": "{}"}])
        for _ in range(schema.MAX_HINT_RECEIVES):
            (m,) = q.receive_message(QueueUrl="q")["Messages"]
            q.change_message_visibility(QueueUrl="q", ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        return len(q.receive_message(QueueUrl="q").get("Messages", [])), len(q.dead)

    assert loop.run_until_complete(main()) == (0, 1)
    loop.close()


def test_a_long_poll_waits_in_virtual_time_for_a_message_sent_later():
    loop = VirtualLoop()

    async def main() -> float:
        q = Queue(now=loop.time, wall_ms=lambda: 0, visibility_s=20)
        loop.call_later(3.0, lambda: q.send_message_batch(QueueUrl="q", Entries=[{"Id": "0", "MessageBody": "{}"}]))
        await q.wait(10.0)
        assert q.receive_message(QueueUrl="q")["Messages"]
        return loop.time()

    assert loop.run_until_complete(main()) == pytest.approx(3.0)
    loop.close()


def test_the_partition_bound_holds_the_scenario_not_the_simulators_two_second_start():
    from types import SimpleNamespace

    from sim.virtual.report import bounds

    fleet = SimpleNamespace(settings=SimpleNamespace(lease_s=10.0))
    f = {"scenario": "steady", "dead_letters": 0, "double_owners": 0, "crash_recovery": {}, "handoff_gaps": {},
         "throttled_requests": {"write": 4238}, "throttled_before_event": 4238}
    assert bounds(f, fleet)["no partition over its limit"]
    assert not bounds({**f, "throttled_before_event": 4237}, fleet)["no partition over its limit"]


def test_a_handoff_in_flight_when_the_watch_ends_counts_with_its_age_and_a_crash_left_open_fails():
    from types import SimpleNamespace

    from sim.virtual.report import bounds, _gaps

    gaps = [SimpleNamespace(reason="shed", closed_at=10.0 + i, opened_at=10.2 + i) for i in range(200)]
    books = SimpleNamespace(gaps=gaps, closed={"c1": ("shed", 599.6)})
    run = SimpleNamespace(event_at=0.0, ended_at=600.0)
    g = _gaps(SimpleNamespace(books=books), run, ("shed",))  # one of 201 still open, 0.4 s old
    assert (g["p99_s"], g["max_s"], g["not_reopened"], g["oldest_open_s"]) == (0.2, None, 1, 0.4)
    f = {"scenario": "deploy", "throttled_requests": {}, "throttled_before_event": 0, "dead_letters": 0,
         "double_owners": 0, "crash_recovery": {"p99_s": None, "not_reopened": 0}, "handoff_gaps": g}
    fleet = SimpleNamespace(settings=SimpleNamespace(lease_s=10.0))
    assert bounds(f, fleet)["handoff gap p99 <= 1 s"]
    f["handoff_gaps"] = {**g, "oldest_open_s": 1.5}  # open longer than the bound: failed, whatever the p99
    assert not bounds(f, fleet)["handoff gap p99 <= 1 s"]
    crash = {"p99_s": 11.0, "not_reopened": 1}  # a crashed connection never reopened fails the crash bound
    f = {**f, "scenario": "crash10", "crash_recovery": crash}
    assert not bounds(f, fleet)["crash recovered p99 <= lease + 5 s (15 s)"]
