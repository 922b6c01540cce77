"""Acquisitions asked for together leave together.

An acquisition is a consistent read of the connection, then a TransactWriteItems that
attaches it to our session together with a ConditionCheck that the session is LIVE
(:meth:`~wsfleet.store.ConnectionsStore.acquire_many`). One connection at a time, a drain
of a dead worker's hundred connections would be two hundred requests, each waiting its
turn at the table, and every acquire transaction of this worker would touch the same
session item at once (on DynamoDB, concurrent transactions on one item conflict). So
:class:`Acquirer` gathers the acquisitions asked for in the same turn of the event loop
(a drain asks for all of its share at once; a START burst for what its polls brought)
into one :meth:`acquire_many` per :data:`~wsfleet.store.MAX_TRANSACTION` connections:
one read and one transaction for up to 25.

An acquisition whose batch failed transiently is failed with that error; its caller
retries it (:func:`~.retry.call_until`), and the retry joins whatever batch is forming
then. A retry of one that landed reads it as ours.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from ..store import MAX_TRANSACTION, Acquired, ConnectionsStore, NotAcquired

Call = Callable[..., Awaitable[Any]]


class Acquirer:
    def __init__(self, *, connections: ConnectionsStore, call: Call, worker_id: str) -> None:
        self.batches = 0
        self._connections = connections
        self._call = call
        self._worker_id = worker_id
        self._waiting: dict[str, list[tuple[str, str, dict | None, asyncio.Future]]] = {}  # by session id
        self._sending: set[asyncio.Task] = set()

    async def acquire(
        self, *, connection_id: str, session_id: str, expected_session: str = "", known: dict | None = None
    ) -> Acquired | NotAcquired:
        """Attach ``connection_id`` to ``session_id`` (see ``acquire_many`` for the
        conditions and ``known``), in one request with the others asked for in this turn
        of the loop. Raises what the batch's request raised (a TransientError: retry it)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send_waiting)
        self._waiting.setdefault(session_id, []).append((connection_id, expected_session, known, answer))
        return await answer

    def _send_waiting(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for session_id, asks in waiting.items():
            for start in range(0, len(asks), MAX_TRANSACTION):
                task = asyncio.ensure_future(self._send(session_id, asks[start : start + MAX_TRANSACTION]))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, session_id: str, asks: list[tuple[str, str, dict | None, asyncio.Future]]) -> None:
        # One connection asked twice in a turn (a hint and a free scan) is sent once.
        wanted = list(dict.fromkeys((cid, expected) for cid, expected, _, _ in asks))
        known = {cid: item for cid, _, item, _ in asks if item is not None}
        try:
            results = await self._call(
                self._connections.acquire_many, wanted, session_id=session_id, worker_id=self._worker_id, known=known
            )
        except asyncio.CancelledError:
            for *_, answer in asks:
                answer.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every asker gets it, and decides
            for *_, answer in asks:
                if not answer.done():
                    answer.set_exception(exc)
            return
        self.batches += 1
        by_key = dict(zip(wanted, results, strict=True))
        for cid, expected, _, answer in asks:
            if not answer.done():
                answer.set_result(by_key[(cid, expected)])
