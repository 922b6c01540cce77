"""What happens to the fleet, and what is measured: a steady run, a crash of 10 %, an
availability zone lost (half the tasks, with two zones), a join, a rolling deploy and a
scale-in. Each starts the fleet, gives it its connections (attached to its sessions, as
a fleet long at work holds them), lets it settle, makes its event, then watches until
the fleet has recovered or the scenario's time is out.

The figures come from the books (sockets opened and closed, :class:`~.runner.Books`),
the table's own index and the capacity counters, never from the workers' claims.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

from wsfleet import schema
from wsfleet.balance import exact_targets

from .fleet import Fleet, Task
from .worker import CONNECTIONS_TABLE, SESSIONS_TABLE

SETTLE_S = 20.0  # after the connections are given out: renewals report them, a summary is written
WATCH_LIMIT_S = 600.0  # a scenario gives up watching after this
AFTER_S = 5.0  # watched on after recovery, so that late trouble shows


@dataclass
class Run:
    """A scenario's measurements (see :mod:`.report`)."""

    scenario: str
    workers: int
    per_worker: int
    seed: int
    event_at: float = 0.0
    recovered_at: float | None = None  # every connection the event closed is open again
    fair_at: float | None = None  # every worker within one of its exact target
    ended_at: float = 0.0
    notes: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def _item(cid: str, task: Task, now_ms: int) -> dict:
    sid = task.worker.keeper.session_id
    return {
        schema.PK: schema.connection_pk(cid), schema.DESIRED_STATE: schema.STARTED, schema.WS_URL: f"wss://feed.example.com/{cid}",
        schema.LEASE_OWNER: task.name, schema.LEASE_SESSION: sid, schema.FENCE_TOKEN: 1,
        schema.OWNER_KEY: schema.owner_key_session(sid), schema.UPDATED_AT_MS: now_ms, schema.CREATED_AT_MS: now_ms,
        schema.LAST_SEQ: 0,
    }


async def populate(fleet: Fleet, per_worker: int) -> None:
    """Attach ``per_worker`` connections to each running worker's session and have each
    pick its own up (the acquisition reads them as its own and writes nothing)."""
    tasks = fleet.running()
    if not await fleet.until(lambda: all(t.worker.session_ready.is_set() for t in tasks), timeout=60, every=0.1):
        raise RuntimeError("workers did not open their sessions")
    items, n = [], 0
    for task in tasks:
        for _ in range(per_worker):
            items.append(_item(f"c{n:07d}", task, fleet.loop.wall_ms()))
            n += 1
    fleet.dynamo.load(CONNECTIONS_TABLE, items)
    pickups = []
    for i, task in enumerate(tasks):
        sid = task.worker.keeper.session_id
        with fleet.owned(task):
            for item in items[i * per_worker : (i + 1) * per_worker]:
                cid = schema.connection_id_from_pk(item[schema.PK])
                pickups.append(asyncio.ensure_future(
                    task.worker.acquisition.try_acquire(cid, source="assigned", expected_session=sid)))
        if i % 50 == 49:
            await asyncio.sleep(0.02)  # the acquisitions of many workers spread a little
    await asyncio.gather(*pickups)
    fleet.freeze_heap()


def spread(fleet: Fleet) -> tuple[int, int]:
    """From the table: (how far the worker furthest from its exact target is from it,
    connections not attached to a LIVE session). Targets as the product defines them
    (:func:`wsfleet.balance.exact_targets`) over the LIVE sessions not draining."""
    sessions = fleet.dynamo.tables[SESSIONS_TABLE].items
    owners = fleet.dynamo.tables[CONNECTIONS_TABLE].indexes[schema.OWNER_INDEX].partitions
    live = {sid: s for sid, s in sessions.items() if s.get(schema.SESSION_STATE) == schema.LIVE and sid != schema.FLEET_SUMMARY_ID}
    held = {sid: len(owners.get(schema.owner_key_session(sid), ())) for sid in live}
    takers = {sid: int(s.get(schema.MAX_CONNECTIONS, 0)) for sid, s in live.items() if not s.get(schema.DRAINING)}
    total = len(fleet.dynamo.tables[CONNECTIONS_TABLE].items)
    targets, _, _ = exact_targets(takers, sum(held.values()))
    worst = max((abs(held[sid] - t) for sid, t in targets.items()), default=0)
    return worst, total - sum(held.values())


async def _observe(fleet: Fleet, run: Run, done: Callable[[], bool], *, fair: bool) -> None:
    """Sample every second until ``done()`` (then :data:`AFTER_S` more) or the limit."""
    finish = None
    while fleet.now() - run.event_at < WATCH_LIMIT_S:
        worst, unattached = spread(fleet)
        recovered = not fleet.books.closed
        run.samples.append({
            "t": round(fleet.now() - run.event_at, 1), "spread": worst, "unattached": unattached,
            "closed": len(fleet.books.closed), "queue": fleet.queue.depth(), "dead_letters": len(fleet.queue.dead),
            "sent": fleet.queue.sent, "workers": len(fleet.running()),
        })
        if recovered and run.recovered_at is None and fleet.now() > run.event_at:
            run.recovered_at = fleet.now()
        if fair and worst <= 1 and not unattached and recovered and fleet.now() > run.event_at:
            run.fair_at = run.fair_at or fleet.now()
        else:
            run.fair_at = None  # the last time it became fair and stayed so
        if finish is None and done():
            finish = fleet.now() + AFTER_S
        if finish is not None and fleet.now() >= finish and (not fleet.books.closed or fleet.now() >= finish + SETTLE_S):
            break  # (a move begun in the last seconds is let finish)
        await asyncio.sleep(1.0)
    run.ended_at = fleet.now()


async def _start(fleet: Fleet, run: Run) -> None:
    for _ in range(run.workers):
        fleet.start()
        await asyncio.sleep(2.0 / run.workers)  # started over two seconds, not in lockstep
    await populate(fleet, run.per_worker)
    await asyncio.sleep(SETTLE_S)
    run.event_at = fleet.now()


def _victims(fleet: Fleet, share: float, *, zone: int | None = None) -> list[str]:
    names = sorted(t.name for t in fleet.running())
    if zone is not None:
        # ECS spreads the tasks over two zones evenly, and a session's place in the ring is
        # its task id's (random hex in ECS, where here it is the launch order): which zone
        # a task is in has nothing to do with its neighbours in the ring. Half at random
        # (taking every other one of the ring spared every dead session a live watcher).
        return sorted(fleet.rng.sample(names, len(names) // 2))
    return fleet.rng.sample(names, max(1, round(share * len(names))))


async def steady(fleet: Fleet, run: Run) -> None:
    await _start(fleet, run)
    await _observe(fleet, run, lambda: fleet.now() - run.event_at >= 30, fair=True)


async def crash(fleet: Fleet, run: Run, *, zone: bool = False) -> None:
    await _start(fleet, run)
    victims = _victims(fleet, 0.1, zone=0 if zone else None)
    run.extra["killed"] = len(victims)
    fleet.kill(victims)
    replacements = asyncio.ensure_future(fleet.launch(len(victims)))  # ECS keeps the service's count
    await _observe(fleet, run, lambda: not fleet.books.closed and replacements.done(), fair=True)


async def join(fleet: Fleet, run: Run) -> None:
    await _start(fleet, run)
    joining = max(1, run.workers // 10)
    run.extra["joined"] = joining
    started = asyncio.ensure_future(fleet.launch(joining))  # as ECS starts them, over its launch times
    await _observe(fleet, run, lambda: started.done() and run.fair_at is not None, fair=True)


async def scale_in(fleet: Fleet, run: Run) -> None:
    await _start(fleet, run)
    leaving = _victims(fleet, 0.1)
    run.extra["stopped"] = len(leaving)
    stops = asyncio.gather(*(fleet.stop(n) for n in leaving))
    await _observe(fleet, run, lambda: stops.done() and not fleet.books.closed, fair=True)


async def deploy(fleet: Fleet, run: Run) -> None:
    """A rolling deploy at ECS's minimumHealthyPercent 100, maximumPercent 200: new tasks
    start, as many as the service's limit lets alongside the old; as each new one runs,
    ECS stops an old one (so old tasks stop at the pace the new ones start, not all at
    once); again until no old task is left."""
    await _start(fleet, run)
    old = sorted(t.name for t in fleet.running())
    rounds, stopping, finished = 0, [], []
    watch = asyncio.ensure_future(_observe(fleet, run, lambda: bool(finished) and not fleet.books.closed, fair=True))

    async def replace(name: str) -> None:
        await fleet.launch(1)
        await fleet.stop(name)

    while old:
        room = min(len(old), fleet.settings.max_tasks - len(fleet.alive()), run.workers)
        if room <= 0:
            await asyncio.sleep(1.0)
            continue
        rounds += 1
        batch, old = old[:room], old[room:]
        stopping.append(asyncio.gather(*(replace(n) for n in batch)))
        if old:
            await stopping[-1]  # the next round once this one's old tasks are gone
    await asyncio.gather(*stopping)
    run.extra["rounds"] = rounds
    run.extra["deploy_s"] = round(fleet.now() - run.event_at, 1)
    finished.append(True)
    await watch


SCENARIOS: dict[str, Callable[..., Any]] = {
    "steady": steady,
    "crash10": crash,
    "az": lambda fleet, run: crash(fleet, run, zone=True),
    "join": join,
    "deploy": deploy,
    "scalein": scale_in,
}
