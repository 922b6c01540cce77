"""The simulated fleet and ECS around it: a virtual-time loop, one table pair and one
queue, and workers started, killed and stopped the way an ECS service does.

* **start**: a task takes :data:`Ecs.launch_s` (Fargate's provisioning, image pull and
  start, jittered) before its worker runs;
* **kill** (a crash, an AZ lost): the process is gone at once, its sockets with it, and
  nothing it had in flight lands; ECS launches a replacement;
* **stop** (a deploy, a scale-in): SIGTERM, the worker's own shutdown, SIGKILL at the
  stop timeout;
* **ECS's limit**: at most :data:`Ecs.max_tasks` tasks of one service at once (5,000), so
  a rolling deploy at ``maximumPercent`` 200 starts only as many new tasks as fit.

Every task a worker's code creates is its worker's (a task factory tags it through a
context variable), so a kill cancels exactly that worker's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from wsfleet import schema

from .aws import SimAws
from .capacity import Partitions
from .dynamo import Dynamo
from .loop import VirtualLoop, virtual_clock
from .runner import Books, SimRunner
from .sqs import Queue
from .worker import CONNECTIONS_TABLE, SESSIONS_TABLE, SimWorker, config

GC_THRESHOLDS = gc.get_threshold()  # the collector's own, given back at close
_OWNER: contextvars.ContextVar["Task | None"] = contextvars.ContextVar("sim_worker", default=None)


@dataclass(frozen=True)
class Settings:
    """The worker and ECS settings a run uses. The defaults are the sizing the 2,000-task
    targets were set at (350 per worker at most, prod before its task-size pick), not
    environments/prod.toml read afresh."""

    max_connections: int = 350
    lease_s: float = 10.0
    heartbeat_s: float = 2.5
    skew_ms: int = 1000
    reconcile_s: float = 10.0
    shards: int = 16
    sweep_s: float = 600.0
    shutdown_s: float = 25.0
    stop_timeout_s: float = 60.0
    launch_s: tuple[float, float] = (30.0, 50.0)  # a Fargate task's start, uniform
    launches_per_minute: float = 500.0  # the service scheduler's launch rate
    max_tasks: int = 5000  # ECS's tasks per service
    enforce_limits: bool = True  # refuse what passes a partition's limit


@dataclass
class Task:
    """One ECS task: its worker, its own AWS lane, and every asyncio task it made."""

    name: str
    worker: SimWorker
    aws: SimAws
    # Every asyncio task it made, in the order made: a dict, not a set, whose order would
    # follow the tasks' addresses, so a kill would cancel them in another order each process.
    tasks: dict = field(default_factory=dict)
    main: asyncio.Task | None = None
    state: str = "running"  # running, stopping, gone


class Fleet:
    def __init__(self, settings: Settings, *, seed: int) -> None:
        self.settings = settings
        self.seed = seed
        random.seed(seed)  # the product's roles draw from the module's generator
        self.rng = random.Random(seed + 1)
        self.loop = VirtualLoop()
        self.loop.set_task_factory(self._task_factory)
        self.loop.set_exception_handler(self._on_loop_error)
        self.loop_errors: list[str] = []
        self.partitions = Partitions(self.loop.time, enforce=settings.enforce_limits)
        self.dynamo = Dynamo(self.partitions)
        self.dynamo.create_table(**schema.connections_table_spec(CONNECTIONS_TABLE))
        self.dynamo.create_table(**schema.sessions_table_spec(SESSIONS_TABLE))
        self.queue = Queue(now=self.loop.time, wall_ms=self.loop.wall_ms, visibility_s=2 * settings.lease_s)
        self.books = Books()
        SimRunner.books, SimRunner.rng = self.books, random.Random(seed + 2)
        self.tasks: dict[str, Task] = {}
        self.peak_tasks = 0  # the most tasks of the service at once
        self._next_launch = 0.0  # when the service scheduler may launch its next task
        self._names = 0
        self._config = config(
            max_connections=settings.max_connections, lease_s=settings.lease_s, heartbeat_s=settings.heartbeat_s,
            skew_ms=settings.skew_ms, reconcile_s=settings.reconcile_s, shards=settings.shards,
            sweep_s=settings.sweep_s, shutdown_s=settings.shutdown_s,
        )

    # --- the loop ----------------------------------------------------------------------------

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, *, context: Any = None, **kw: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, context=context, **kw)
        owner = (context or contextvars.copy_context()).get(_OWNER)
        if owner is not None:
            owner.tasks[task] = None
            task.add_done_callback(lambda done, made=owner.tasks: made.pop(done, None))
        return task

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if not isinstance(exc, asyncio.CancelledError):
            self.loop_errors.append(f"{context.get('message')}: {exc!r}")

    def now(self) -> float:
        return self.loop.time()

    async def until(self, condition: Callable[[], bool], *, timeout: float, every: float = 0.5) -> bool:
        deadline = self.now() + timeout
        while not condition():
            if self.now() >= deadline:
                return False
            await asyncio.sleep(every)
        return True

    # --- ECS ---------------------------------------------------------------------------------------

    def running(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.state == "running"]

    def alive(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.state != "gone"]

    def start(self) -> Task:
        """Start a task's worker now (launch delays are the caller's: :meth:`launch`)."""
        if len(self.alive()) >= self.settings.max_tasks:
            raise RuntimeError(f"ECS refuses a task past {self.settings.max_tasks} per service")
        self._names += 1
        name = f"w{self._names:05d}"
        aws = SimAws(self.dynamo, self.queue)
        worker = SimWorker(self._config, name, aws=aws, clock_ms=self.loop.wall_ms)
        task = Task(name, worker, aws)
        self.tasks[name] = task
        self.peak_tasks = max(self.peak_tasks, len(self.alive()))
        with self.owned(task):
            task.main = asyncio.ensure_future(worker.run())
        task.main.add_done_callback(lambda _: self._gone(task))
        return task

    def _gone(self, task: Task) -> None:
        if task.state != "gone":
            task.state = "gone"
            task.aws.kill()

    async def launch(self, n: int) -> list[Task]:
        """``n`` tasks as ECS starts them: each after its launch time, no faster than the
        service's launch rate; returns once all of them started."""
        async def one(slot: float) -> Task:
            await asyncio.sleep(max(slot, self.now()) - self.now() + self.rng.uniform(*self.settings.launch_s))
            return self.start()

        slots = []
        for _ in range(n):
            self._next_launch = max(self._next_launch, self.now()) + 60 / self.settings.launches_per_minute
            slots.append(self._next_launch)
        return list(await asyncio.gather(*(one(slot) for slot in slots)))


    def owned(self, task: Task) -> contextlib.AbstractContextManager:
        """Tasks created inside are ``task``'s (killed with it)."""
        @contextlib.contextmanager
        def inside():
            token = _OWNER.set(task)
            try:
                yield
            finally:
                _OWNER.reset(token)

        return inside()

    def kill(self, names: list[str]) -> None:
        """The processes die at once: sockets closed, nothing in flight lands."""
        dead = set(names)
        now = self.now()
        for name in names:
            task = self.tasks[name]
            task.state = "gone"
            task.aws.kill()
            task.worker.takeover.cancel()
            for t in list(task.tasks):
                t.cancel()
        for cid, worker in list(self.books.open.items()):
            if worker in dead:
                self.books.close(cid, worker, "crash", now)

    async def stop(self, name: str) -> None:
        """SIGTERM, then SIGKILL at the stop timeout."""
        task = self.tasks[name]
        if task.state != "running":
            return
        task.state = "stopping"
        task.worker.request_shutdown()
        try:
            await asyncio.wait_for(asyncio.shield(task.main), timeout=self.settings.stop_timeout_s)
        except TimeoutError:
            self.kill([name])

    def freeze_heap(self) -> None:
        """The fleet as given its connections lives to the end of the run: once, collected
        and kept out of the collector's later passes. Until then (:meth:`run` starts with
        the collector off) the workers' start and the connections given out build the
        heap with nothing to collect, where the collector's passes, each walking the
        objects of every connection given out so far, took two thirds of the CPU at 2,000
        x 250, and a full pass after it walked every runner, task and item each time a
        quarter as many objects had lived a while. Only memory is at stake: what the run
        decides does not depend on when the collector runs. :meth:`close` thaws it."""
        gc.collect()
        gc.freeze()
        # Young objects collected 100 times less often, old ones hardly at all: a crash's
        # takeovers make tasks and futures by the dozen per connection. Cycles of garbage
        # that live that long wait for close (peak memory shows it).
        gc.set_threshold(70_000, 50, 1000)
        gc.enable()

    def run(self, main: Callable[[], Awaitable[Any]]) -> Any:
        with virtual_clock(self.loop):
            gc.disable()  # until the fleet holds its connections (freeze_heap)
            try:
                return self.loop.run_until_complete(main())
            finally:
                gc.enable()
                self.partitions.finish()

    def close(self) -> None:
        """End the run: every worker's requests refused, every task cancelled and let
        finish (in virtual time, so a pause in a cleanup costs nothing), the loop closed."""
        for task in self.tasks.values():
            task.aws.kill()
        with virtual_clock(self.loop):
            for _ in range(3):  # a cancelled task's cleanup may start another
                pending = asyncio.all_tasks(self.loop)
                if not pending:
                    break
                for t in pending:
                    t.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()
        gc.unfreeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.collect()
