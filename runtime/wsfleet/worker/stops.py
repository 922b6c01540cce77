"""Acting on the STOPs posted to this worker's session.

The router posts a STOP to the inbox of the session a connection is attached to, for one
ownership (fence) of it; each renewal brings back those not yet acted on
(:class:`~.session.SessionKeeper`). What each asks is :func:`.decide.choose_stop`'s: a
held connection is released STOPPED by its runner; a handoff of ours nobody has taken yet
is freed STOPPED (:meth:`.handoffs.Handoffs.stop`); one still being acquired, or being
handed off, stays in the inbox for the next renewal.
"""

from __future__ import annotations

import asyncio

from .. import schema
from ..logs import JsonLogger
from .connection import EndReason
from .decide import StopAction, choose_stop
from .handoffs import Handoffs
from .holdings import Holdings

HANDING_OFF = (EndReason.SHUTDOWN, EndReason.SHED)  # a release that leaves it attached to us (worker.handoffs)


class Stops:
    def __init__(self, *, holdings: Holdings, handoffs: Handoffs, log: JsonLogger) -> None:
        self._holdings = holdings
        self._handoffs = handoffs
        self._log = log
        self._handoff_stops: set[asyncio.Task] = set()  # STOPs of connections we handed off

    def on_stops(self, stops: set[str]) -> set[str]:
        """Act on the inbox's ``stops`` (entries of one connection and fence each);
        returns those acted on."""
        done: set[str] = set()
        for entry in stops:
            connection_id, fence = schema.parse_stop_entry(entry)
            runner = self._holdings.runners.get(connection_id)
            action = choose_stop(
                acquiring=self._holdings.acquiring(connection_id),
                held_fence=None if runner is None else runner.fence_token,
                handing_off=runner is not None and runner.end_reason in HANDING_OFF,
                handed=runner is None and self._handoffs.pending(connection_id),
                fence=fence,
            )
            if action is StopAction.WAIT:
                continue
            if action is StopAction.STOP:
                self._log.info("stop_received", connection_id=connection_id)
                runner.request_stop()
            elif action is StopAction.STOP_HANDED:
                # Handed off and not taken yet: still attached to us, so its STOP came
                # here. Nobody holds a socket: free it (STOPPED), as its taker would have.
                task = asyncio.create_task(self._stop_handed(connection_id, fence), name=f"stop:{connection_id}")
                self._handoff_stops.add(task)
                task.add_done_callback(self._handoff_stops.discard)
            done.add(entry)
        return done

    async def _stop_handed(self, connection_id: str, fence: int) -> None:
        try:
            await self._handoffs.stop(connection_id, fence)  # settles its attachment when it lands
        except Exception as exc:  # noqa: BLE001 - the audit frees a STOPPED one still attached to us
            self._log.warning("handoff_stop_failed", connection_id=connection_id, error=f"{type(exc).__name__}: {exc}")
