"""Taking a connection and holding it in a runner; the audit of what we hold.

:meth:`Acquisition.try_acquire` attaches a connection to our session (a conditional
write, batched with the others asked for in the same turn: :class:`~.acquirer.Acquirer`),
finds where its stored messages end, and holds it in a task of its own for as long as its
:class:`~.connection.ConnectionRunner` runs; at the runner's end the task hints what it
released (a STOP's, a shutdown's, a shed's), or moves a shed meant for one worker to
that worker's session (:mod:`.moves`). :meth:`Acquisition.audit_once` compares what
the owner index says our session holds with what we hold. Both are run-once steps tests
can drive; what is held is :class:`~.holdings.Holdings`'.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .. import clock, schema, tracing
from .. import metrics_names as names
from ..aws import Aws
from ..leases import AcquireFailure
from ..logs import JsonLogger
from ..metrics import Counters
from ..sinks import Sink
from ..store import MAX_TRANSACTION, Acquired, ConnectionsStore, NotAcquired, TransientError
from .acquirer import Acquirer
from .attached import Attachments
from .checkpoints import Checkpoints
from .connection import ConnectionRunner, EndReason, Settings
from .handoffs import Handoffs
from .hints import Hints
from .holdings import Holdings
from .moves import Mover
from .retry import LeaseExpired, call_until
from .secrets import Secrets
from .session import SessionKeeper
from .writer import Writer

AUDIT_GRACE_S = 15.0  # a connection acquired this recently may not be in the index yet
# Acquisitions in flight at once: a burst of thousands (a START storm, a big takeover) is
# taken at the pace the table answers instead of flooding the request pool. Those asked
# for together leave in transactions of MAX_TRANSACTION (worker.acquirer): four of them.
ACQUIRE_CONCURRENCY = 4 * MAX_TRANSACTION


class Acquisition:
    def __init__(
        self,
        *,
        settings: Settings,
        holdings: Holdings,
        keeper: SessionKeeper,
        stopping: asyncio.Event,
        acquirer: Acquirer,
        attachments: Attachments,
        handoffs: Handoffs,
        hints: Hints,
        mover: Mover,
        connections: ConnectionsStore,
        messages: Sink,
        writer: Writer,
        checkpoints: Checkpoints,
        secrets: Secrets,
        aws: Aws,
        counters: Counters,
        log: JsonLogger,
        runner: Callable[..., ConnectionRunner] = ConnectionRunner,
    ) -> None:
        """``stopping``: set once the worker shuts down (it takes nothing more);
        ``runner``: what holds a connection once acquired (the virtual-time simulator
        gives one that opens no socket)."""
        self.settings = settings
        self._holdings = holdings
        self._keeper = keeper
        self._stopping = stopping
        self._acquirer = acquirer
        self._attachments = attachments
        self._handoffs = handoffs
        self._hints = hints
        self._mover = mover
        self._connections = connections
        self._messages = messages
        self._writer = writer
        self._checkpoints = checkpoints
        self._secrets = secrets
        self._aws = aws
        self._counters = counters
        self._log = log
        self._slots = asyncio.Semaphore(ACQUIRE_CONCURRENCY)
        self._runner = runner

    async def _set_aside(self, connection_id: str, holder: str) -> None:
        """Best effort: one left in place is refused again by the next taker, who tries again."""
        try:
            await self._aws.call(self._connections.set_aside, connection_id, holder=holder)
        except TransientError as exc:
            self._log.warning("set_aside_failed", connection_id=connection_id, error=str(exc))

    def accepting(self) -> bool:
        """Taking connections: not shutting down, and our session is live."""
        return not self._stopping.is_set() and self._keeper.live()

    async def try_acquire(
        self,
        connection_id: str,
        *,
        source: str,
        expected_session: str = "",
        known: dict | None = None,
        trace_parent: str | None = None,
    ) -> ConnectionRunner | None:
        """Attach the connection to our session if we have room (conditional on it being
        free, or on the ENDED session ``expected_session`` it is attached to), find where
        its stored messages end, then hold it in a task of its own. Returns the runner,
        or None if we lost the race, had no room or no live session. ``trace_parent``:
        the checked trace header of what asked for it (a hint's, a drain's): the acquire
        span, and the runner's first connect span, continue that trace."""
        if not self.accepting() or self._holdings.busy(connection_id) or self._holdings.free() <= 0:
            return None
        session_id = self._keeper.session_id
        deadline = lambda: self._keeper.deadline_for(session_id)  # noqa: E731
        self._holdings.begin_acquiring(connection_id)
        self._attachments.trying(connection_id)
        try:
            async with self._slots:
                result, checkpoint, stored_end, sent, trace = await self._acquire(
                    connection_id, session_id, expected_session, source, known, trace_parent
                )
        except LeaseExpired:
            self._log.warning("acquire_gave_up", connection_id=connection_id, source=source)
            return None
        finally:
            self._holdings.end_acquiring(connection_id)
        if isinstance(result, NotAcquired):
            if sent == 1:  # refused by the only request sent: none can land later
                self._attachments.settled(connection_id)
            self._log.info("acquire_lost", connection_id=connection_id, source=source, why=result.reason.value)
            if result.reason is AcquireFailure.QUARANTINED and result.lease_session in ("", expected_session):
                # Free, or left on the ENDED session we drain: out of every taker's way until a START.
                await self._set_aside(connection_id, result.lease_session)
            return None
        item = result.item
        if not self.accepting() or self._keeper.session_id != session_id:
            # Won a race that finished after shutdown began or the session was lost.
            await self._release_unheld(connection_id, item, session_id)
            return None
        runner = self._runner(
            connection_id=connection_id,
            ws_url=item[schema.WS_URL],
            session_id=session_id,
            fence_token=int(item[schema.FENCE_TOKEN]),
            checkpoint=checkpoint,
            stored_end=stored_end,
            reserved=0 if result.checkpoint_is_end else int(item.get(schema.SEQ_RESERVED, 0)),
            deadline=deadline,
            settings=self.settings,
            call=self._aws.call,
            connections=self._connections,
            writer=self._writer,
            checkpoints=self._checkpoints,
            counters=self._counters,
            log=self._log,
            secrets=self._secrets,
            upstream=item.get(schema.UPSTREAM),
            last_error=item.get(schema.LAST_ERROR),
            trace_parent=trace,
        )
        # Its life is its own: none of it in the trace of what took it (a drain's, say).
        task = asyncio.create_task(self._hold(runner), name=f"hold:{connection_id}", context=tracing.untraced())
        self._holdings.hold(runner, task)
        self._counters.add(names.LEASES_ACQUIRED)
        if source in ("orphan", "unowned"):
            self._counters.add(names.ORPHANS_RECOVERED)
        self._log.info(
            "lease_acquired",
            connection_id=connection_id,
            source=source,
            fence_token=runner.fence_token,
            checkpoint=checkpoint,
            from_seq=runner.tracker.next_seq,
            active=self._holdings.count(),
            **tracing.log_fields(trace),
        )
        return runner

    async def _acquire(
        self,
        connection_id: str,
        session_id: str,
        expected_session: str,
        source: str,
        known: dict | None = None,
        trace_parent: str | None = None,
    ) -> tuple[Acquired | NotAcquired, int, int, int, str | None]:
        """The conditional acquire, then where the stored messages end: past its last
        checkpoint for a connection taken from a crashed owner; no read when its last
        owner released it cleanly (a handoff, a shed, a STOP then START). Also returns
        how many acquire requests were sent (a retry follows an answer that was lost,
        whose request may yet land), and the acquire span's trace header."""
        deadline = lambda: self._keeper.deadline_for(session_id)  # noqa: E731
        checkpoint = stored_end = sent = 0

        async def acquire(**kwargs: Any) -> Acquired | NotAcquired:
            nonlocal sent
            sent += 1
            return await self._acquirer.acquire(**kwargs)

        with tracing.segment(
            "acquire", parent=trace_parent, connection_id=connection_id, source=source, session=session_id
        ) as span:
            result = await call_until(
                _direct,
                deadline,
                acquire,
                log=self._log,
                connection_id=connection_id,
                session_id=session_id,
                expected_session=expected_session,
                known=known,
            )
            span.annotate(outcome=result.reason.value if isinstance(result, NotAcquired) else "acquired")
            if isinstance(result, Acquired):
                checkpoint = stored_end = int(result.item.get(schema.LAST_SEQ, 0))
                span.annotate(fence=int(result.item.get(schema.FENCE_TOKEN, 0)))
            # A stream's tail is not read (Sink.reads_tail): from a crashed owner, the
            # frames since its checkpoint are delivered again, with our higher fence.
            if isinstance(result, Acquired) and not result.checkpoint_is_end and self._messages.reads_tail:
                stored_end = await call_until(
                    self._aws.call,
                    deadline,
                    self._messages.stored_end,
                    log=self._log,
                    connection_id=connection_id,
                    checkpoint=checkpoint,
                )
        return result, checkpoint, stored_end, sent, span.header

    async def _release_unheld(self, connection_id: str, item: dict, session_id: str) -> None:
        if self._keeper.deadline_for(session_id) > clock.now():
            try:
                if await self._aws.call(
                    self._connections.release,
                    connection_id=connection_id,
                    session_id=session_id,
                    fence_token=int(item[schema.FENCE_TOKEN]),
                    last_seq=int(item.get(schema.LAST_SEQ, 0)),
                ):
                    self._attachments.settled(connection_id)
            except TransientError:
                pass  # still attached: freed at our exit, or taken with the session when that ends
        await self._hints.hint(connection_id)

    async def _hold(self, runner: ConnectionRunner) -> None:
        try:
            reason = await runner.run()
        finally:
            self._holdings.let_go(runner)
            if runner.detached:
                self._attachments.detached(runner.connection_id, runner.session_id)
        self._log.info(
            "connection_ended", connection_id=runner.connection_id, why=reason.value, active=self._holdings.count()
        )
        # The state the release left it in, when it landed free or handed off (attached
        # to our session, released at our fence): the taker needs no read.
        released = (
            schema.released_state(
                runner.fence_token,
                runner.ws_url,
                runner.tracker.checkpoint,
                runner.upstream_item,
                runner.last_error,
                session_id=runner.session_id if runner.handed else "",
            )
            if runner.freed or runner.handed
            else None
        )
        if runner.handed:
            self._handoffs.handed(
                runner.connection_id, session_id=runner.session_id, fence_token=runner.fence_token, released=released
            )
        # A STOP's release that landed free: a START came meanwhile, and its hint found us holding it.
        # The hints carry the release span's trace: the taker's acquire continues it.
        if reason is EndReason.SHUTDOWN or (reason is EndReason.STOPPED and runner.freed):
            await self._hints.hint(runner.connection_id, released=released, trace=runner.release_trace)
        elif reason is EndReason.SHED and runner.handed and runner.shed_to:
            # Meant for one worker: moved to its session, which picks it up (worker.moves).
            await self._mover.move_handed(
                runner.connection_id,
                session_id=runner.session_id,
                fence_token=runner.fence_token,
                to=runner.shed_to,
                released=released,
                trace=runner.release_trace,
            )
        elif reason is EndReason.SHED:
            await self._hints.hint(
                runner.connection_id,
                shed_by=runner.session_id,
                released=released,
                trace=runner.release_trace,
            )

    async def audit_once(self) -> int:
        """Compare what the owner index says our session holds with what we hold: a
        STOP we missed is acted on, a connection attached to us that we do not hold
        (an acquire whose answer was lost) is adopted if STARTED and freed if STOPPED,
        one we hold that is no longer ours (checked with a read) is dropped. Returns how
        many it corrected."""
        session_id = self._keeper.session_id
        if not self._keeper.live():
            return 0
        rows = await self._aws.call(self._connections.owned_by, session_id)
        listed = {r.connection_id: r.desired_state for r in rows}
        fixed = 0
        for connection_id, state in listed.items():
            runner = self._holdings.runners.get(connection_id)
            if runner is not None and state == schema.STOPPED:
                self._log.warning("stop_found_by_audit", connection_id=connection_id)
                runner.request_stop()
                fixed += 1
            elif runner is None and not self._holdings.acquiring(connection_id) and state == schema.STARTED:
                if self._handoffs.pending(connection_id):
                    continue  # handed off: for the peer its hint names (worker.handoffs)
                self._log.warning("adopting_attached_connection", connection_id=connection_id)
                await self.try_acquire(connection_id, source="audit", expected_session=session_id)
                fixed += 1
            elif runner is None and not self._holdings.acquiring(connection_id):
                # STOPPED and attached to us with no runner (an acquisition whose answer
                # was lost, then its STOP): nobody holds a socket, so free it, as its
                # release would have (conditional on it still being attached to us).
                self._log.warning("freeing_stopped_attached_connection", connection_id=connection_id)
                if await self._aws.call(self._connections.free_orphan, connection_id, dead_session=session_id):
                    self._attachments.settled(connection_id)
                fixed += 1
        now = clock.now()
        for connection_id, runner in list(self._holdings.runners.items()):
            if connection_id in listed or now - runner.acquired_mono < AUDIT_GRACE_S or runner.session_id != session_id:
                continue
            item = await self._aws.call(self._connections.get, connection_id)
            if item is None or item.get(schema.LEASE_SESSION) != session_id:
                self._log.warning("connection_no_longer_ours", connection_id=connection_id)
                self._attachments.settled(connection_id)
                runner.drop(EndReason.LOST)
                fixed += 1
        return fixed


def _direct(fn: Callable[..., Awaitable[Any]], /, **kwargs: Any) -> Awaitable[Any]:
    """``call_until``'s ``call`` for a step that is already async (no thread)."""
    return fn(**kwargs)

