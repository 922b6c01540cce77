"""A move: a connection given to a named session in one conditional write. A part of
:class:`~wsfleet.store.ConnectionsStore`, kept apart so that the table's ownership writes
stay one room.

The mover (a shedder after its handoff's release, or the drainer of a dead session)
attaches the connection to the target's session at the next fence and adds it to that
session's inbox of assignments, in one TransactWriteItems conditional on both sides. The
target learns of it from its next renewal (as of a STOP) and picks it up: it holds it
already, so its acquire reads it as its own and writes nothing. SQS never carries a hint
for one worker: a named hint that every other receiver puts back is what reached the
dead-letter queue at any fleet size of more than a few workers.
"""

from __future__ import annotations

import enum
from typing import Any

from .. import schema
from ..leases import move_already_landed, worker_of
from . import conditions as cond
from .base import _names, marshal


class Moved(enum.Enum):
    MOVED = "moved"  # attached to the target at the next fence, and in its inbox
    REFUSED = "refused"  # the target ended, is leaving or its inbox is full: nothing written
    LOST = "lost"  # the connection is no longer as read (taken, stopped, moved): nothing written


class Moves:
    """``ConnectionsStore``'s move (it supplies the table helpers)."""

    _sessions_table: str
    _now_ms: Any
    _transact: Any
    _transact_update: Any

    def move(self, connection_id: str, *, from_session: str, fence_token: int, to_session: str, released: bool) -> Moved:
        """Attach the connection to ``to_session`` and post it to that session's inbox of
        assignments (:func:`schema.assigned_entry`, at the new fence), in one transaction.

        Conditional on: the connection STARTED, not quarantined, attached to
        ``from_session`` at ``fence_token`` and, ``released``, marked released at it (a
        handoff of our own: :func:`~.conditions.movable`); and the target session LIVE,
        not draining and its inbox under :data:`schema.ASSIGNED_MAX`
        (:data:`~.conditions.SESSION_ASSIGNABLE`). The move sets the next fence (the
        mover's late writes, and a frozen former owner's, are refused from then on),
        the target's ``owner_key`` and removes the release mark; the checkpoint and its
        stored-end mark stay, so the target reads the stored messages' end exactly when
        a taker would. Idempotent: a retry of a move that landed finds the connection at
        the target at the next fence and answers MOVED. Raises TransientError (nothing
        known) for faults."""
        if not self._sessions_table:
            raise ValueError("move needs the sessions table (ConnectionsStore(sessions_table_name=...))")
        fence = fence_token + 1
        connection = self._transact_update(
            connection_id,
            update="SET #o = :owner, #l = :to, #k = :key, #u = :now, #f = :next REMOVE #rf",
            condition=cond.movable(released=released),
            values={
                ":owner": worker_of(to_session),
                ":to": to_session,
                ":key": schema.owner_key_session(to_session),
                ":now": self._now_ms(),
                ":next": fence,
                ":started": schema.STARTED,
                ":from": from_session,
                ":fence": fence_token,
            },
            return_old=True,
        )
        condition, update = cond.SESSION_ASSIGNABLE, "ADD #as :entry"
        notice = {
            "Update": {
                "TableName": self._sessions_table,
                "Key": marshal({schema.SESSION_ID: to_session}),
                "UpdateExpression": update,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": _names(update, condition),
                "ExpressionAttributeValues": marshal(
                    {
                        ":entry": {schema.assigned_entry(connection_id, fence)},
                        ":live": schema.LIVE,
                        ":false": False,
                        ":cap": schema.ASSIGNED_MAX,
                    }
                ),
            }
        }
        reasons = self._transact([connection, notice])
        if reasons is None:
            return Moved.MOVED
        if reasons[0].get("Code") == "ConditionalCheckFailed":
            old = reasons[0].get("Item")
            return Moved.MOVED if move_already_landed(old, to_session=to_session, fence_token=fence_token) else Moved.LOST
        return Moved.REFUSED
