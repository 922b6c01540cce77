"""Desired state: the router's START and STOP writes on the connections table. A part of
:class:`~wsfleet.store.ConnectionsStore`, kept apart (as :mod:`.last_error` is) so that
the table's ownership writes stay one room. Every write is conditional; a lost race
comes back as a value."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from botocore.exceptions import ClientError

from .. import schema
from ..leases import backoff_s
from . import conditions as cond
from .base import TransactionCancelled, TransientError, _condition_failed, _names, _old_item, marshal

if TYPE_CHECKING:
    from .sessions import SessionsStore


class StartOutcome(enum.Enum):
    CREATED = "created"  # new connection: 202
    RESTARTED = "restarted"  # was STOPPED, now STARTED again: 202
    UNCHANGED = "unchanged"  # already STARTED with this ws_url and upstream: 200
    CONFLICT = "conflict"  # already STARTED with another ws_url or upstream: 409


@dataclass(frozen=True)
class Started:
    outcome: StartOutcome
    unowned: bool = False  # STARTED and attached to no session: worth a hint
    fence_token: int = 0  # its fence as read (or written): what a move of an unowned one is conditional on
    differs: tuple[str, ...] = ()  # on CONFLICT: the attributes that differ (schema.WS_URL, schema.UPSTREAM)


class StopOutcome(enum.Enum):
    STOPPED = "stopped"  # 202
    ALREADY_STOPPED = "already_stopped"  # 200
    NOT_FOUND = "not_found"  # 404


@dataclass(frozen=True)
class Stopped:
    outcome: StopOutcome
    lease_session: str = ""  # the session it is attached to, if any
    fence_token: int = 0  # the ownership it was stopped under
    told: bool = False  # the STOP is in that session's inbox (False: it is not LIVE, or there is none)


class DeleteOutcome(enum.Enum):
    DELETED = "deleted"  # 200
    NOT_STOPPED = "not_stopped"  # 409: STOP it first
    HELD = "held"  # 409: STOPPED, its owner has not let it go yet (within a heartbeat or so)
    NOT_FOUND = "not_found"  # 404


# A STOP's transaction conflicts with any other one on its owner's session item (DynamoDB
# cancels one of the two): it goes again after a pause with full jitter, doubling from
# STOP_CONFLICT_PAUSE_S up to the cap. Eight tries pause 1.8 s at most (0.9 s on average),
# well inside the router's 10 s; then the caller gets a 503 and tries again.
STOP_TRIES = 8
STOP_CONFLICT_PAUSE_S = 0.02
STOP_CONFLICT_PAUSE_CAP_S = 0.4


# What a START removes of the crash-loop breaker's (wsfleet.crash_loop): the quarantine
# and the strikes that led to it.
_BREAKER = "#qt, #sk, #ss, #sf"


class DesiredState:
    """``ConnectionsStore``'s START and STOP (it supplies the table helpers below)."""

    _call: Any
    _conditional_update: Any
    _now_ms: Any
    _shards: int
    _transact: Any
    _transact_update: Any
    _update: Any
    get: Any

    def start(self, connection_id: str, ws_url: str, upstream: Mapping[str, Any] | None = None) -> Started:
        """Record that the connection should run, with ``ws_url`` and ``upstream`` (the
        stored form, :meth:`wsfleet.upstream_spec.Upstream.item`; None or ``{}`` for the
        default protocol, stored as no attribute).

        A new connection is created free (``owner_key`` FREE#shard) with a conditional
        put (``attribute_not_exists``). A STOPPED one is flipped with an update
        conditional on ``desired_state = STOPPED`` and on the session it is attached to
        (if free, it goes back into FREE#shard; if a session still holds it, it stays
        attached: its owner, told of the STOP, releases it and hints it), keeping its
        checkpoint and fence; it takes the new ``ws_url`` and ``upstream`` (set, or
        removed for the default) and loses any ``last_error``, which was about the old
        ones, and any quarantine and strikes. A STARTED one is never written, so a repeated or concurrent START cannot
        disturb its owner: the same ``ws_url`` and ``upstream`` are UNCHANGED, another
        is a CONFLICT naming what differs; but a quarantined one (the crash-loop
        breaker's) is RESTARTED: the START clears its quarantine and strikes and puts it
        back where a taker finds it. Losing a race re-reads the outcome from the
        item it lost to; so does a retry of a write that landed with its answer lost,
        which finds its own ``ws_url`` and ``upstream`` and reads UNCHANGED. ``unowned``
        in the result: STARTED and attached to no session (whatever the outcome), so
        that a hint, even a repeated one, is never missing."""
        wanted = dict(upstream or {})
        for _ in range(5):
            now = self._now_ms()
            item = {
                schema.PK: schema.connection_pk(connection_id),
                schema.DESIRED_STATE: schema.STARTED,
                schema.WS_URL: ws_url,
                schema.LAST_SEQ: 0,
                schema.LEASE_OWNER: "",
                schema.LEASE_SESSION: "",
                schema.FENCE_TOKEN: 0,
                schema.OWNER_KEY: schema.owner_key_free(connection_id, self._shards),
                schema.UPDATED_AT_MS: now,
                schema.CREATED_AT_MS: now,
                **({schema.UPSTREAM: wanted} if wanted else {}),
            }
            try:
                self._call(
                    "put_item",
                    Item=marshal(item),
                    ConditionExpression=cond.CONNECTION_IS_NEW,
                    ExpressionAttributeNames=_names(cond.CONNECTION_IS_NEW),
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return Started(StartOutcome.CREATED, unowned=True)
            except ClientError as exc:
                if not _condition_failed(exc):
                    raise
                old = _old_item(exc)
            if old is None:
                continue  # deleted between our write and its failure: try again
            session = old.get(schema.LEASE_SESSION, "")
            fence = int(old.get(schema.FENCE_TOKEN, 0))
            if old.get(schema.DESIRED_STATE) == schema.STARTED:
                # An item written before upstream existed has none: the default, {}.
                differs = tuple(
                    name
                    for name, same in (
                        (schema.WS_URL, old.get(schema.WS_URL) == ws_url),
                        (schema.UPSTREAM, (old.get(schema.UPSTREAM) or {}) == wanted),
                    )
                    if not same
                )
                if differs:
                    return Started(StartOutcome.CONFLICT, differs=differs)
                if schema.QUARANTINED not in old:
                    return Started(StartOutcome.UNCHANGED, unowned=not session, fence_token=fence)
                if self._clear_quarantine(connection_id, session, now):
                    return Started(StartOutcome.RESTARTED, unowned=not session, fence_token=fence)
                continue  # it changed since we read it: the next put reads what it became
            update = "SET #s = :started, #w = :url, #u = :now" + (", #k = :free" if not session else "")
            update += ", #up = :upstream REMOVE #le, #lt" if wanted else " REMOVE #up, #le, #lt"
            update += ", " + _BREAKER
            params = self._update(
                connection_id,
                update=update,
                condition=cond.RESTARTABLE,
                values={
                    ":started": schema.STARTED,
                    ":stopped": schema.STOPPED,
                    ":url": ws_url,
                    ":session": session,
                    ":now": now,
                    **({":free": schema.owner_key_free(connection_id, self._shards)} if not session else {}),
                    **({":upstream": wanted} if wanted else {}),
                },
            )
            try:
                self._call("update_item", **params)
            except ClientError as exc:
                if not _condition_failed(exc):
                    raise
                continue  # it changed since we read it: the next put reads what it became
            return Started(StartOutcome.RESTARTED, unowned=not session, fence_token=fence)
        raise TransientError(f"start of {connection_id!r} kept losing races; try again")

    def _clear_quarantine(self, connection_id: str, session: str, now: int) -> bool:
        """A START of a quarantined STARTED connection (same ws_url and upstream): the
        quarantine and the strikes go, and a free one goes back into its FREE#
        partition (the router hints it). Conditional on: still quarantined and attached
        to the session read (:data:`~.conditions.QUARANTINE_CLEARABLE`). False when it
        changed since the read."""
        values: dict[str, Any] = {":started": schema.STARTED, ":session": session, ":now": now}
        update = "SET #u = :now"
        if not session:
            update += ", #k = :free"
            values[":free"] = schema.owner_key_free(connection_id, self._shards)
        params = self._update(
            connection_id, update=f"{update} REMOVE {_BREAKER}", condition=cond.QUARANTINE_CLEARABLE, values=values
        )
        try:
            self._call("update_item", **params)
        except ClientError as exc:
            if not _condition_failed(exc):
                raise
            return False
        return True

    def stop(self, connection_id: str, *, sessions: SessionsStore) -> Stopped:
        """Record that the connection should stop, and tell its owner in the same write.

        Conditional on: the item exists, desired_state is STARTED, and the session and
        fence it is attached to (as read). Attached to a session: one TransactWriteItems
        of that update and the STOP notice in the session's inbox
        (:meth:`SessionsStore.stop_notice`, conditional on LIVE), so that neither a lost
        answer nor a crash between two writes can leave it STOPPED with its owner untold;
        if that session is not LIVE, the update alone (whoever takes or frees an ENDED
        session's connections sees STOPPED itself). Free: the update alone, which also
        takes it out of the sparse index. Already STOPPED and still attached (a retry of
        a STOP that landed with its answer lost, or a STOP stored without its notice):
        the notice is posted again (:meth:`SessionsStore.post_stop`, idempotent). Losing
        a race re-reads from the item it lost to."""
        item = self.get(connection_id)
        for attempt in range(STOP_TRIES):
            if item is None:
                return Stopped(StopOutcome.NOT_FOUND)
            session = item.get(schema.LEASE_SESSION, "")
            fence = int(item.get(schema.FENCE_TOKEN, 0))
            if item.get(schema.DESIRED_STATE) != schema.STARTED:
                told = bool(session) and sessions.post_stop(session, connection_id, fence)
                return Stopped(StopOutcome.ALREADY_STOPPED, session, fence, told)
            stop = {
                "update": "SET #s = :stopped, #u = :now" + (" REMOVE #k" if not session else ""),
                "condition": cond.STOPPABLE,
                "values": {
                    ":stopped": schema.STOPPED,
                    ":started": schema.STARTED,
                    ":now": self._now_ms(),
                    ":session": session,
                    ":fence": fence,
                },
            }
            if session:
                try:
                    reasons = self._transact(
                        [
                            self._transact_update(connection_id, **stop, return_old=True),
                            sessions.stop_notice(session, connection_id, fence),
                        ]
                    )
                except TransactionCancelled:
                    # Another STOP's transaction held the session item (a burst of STOPs
                    # of one worker's connections): nothing was written, go again shortly.
                    time.sleep(backoff_s(attempt, base=STOP_CONFLICT_PAUSE_S, cap=STOP_CONFLICT_PAUSE_CAP_S))
                    continue
                if reasons is None:
                    return Stopped(StopOutcome.STOPPED, session, fence, told=True)
                if reasons[0]["Code"] == "ConditionalCheckFailed":
                    item = reasons[0].get("Item") or self.get(connection_id)
                    continue
            new, old = self._conditional_update(connection_id, **stop, returns="NONE")
            if new is not None:
                return Stopped(StopOutcome.STOPPED, session, fence)
            item = old
        raise TransientError(f"stop of {connection_id!r} kept losing races; try again")

    def delete(self, connection_id: str) -> DeleteOutcome:
        """Delete the connection's item. Conditional on: desired_state is STOPPED and no
        session holds it (``lease_session`` empty: its owner released it), so that no
        worker is writing to it and none will take it. On a failed condition, a
        consistent read says why. Its messages are left to their TTL and its large-data
        objects to the bucket's lifecycle; a later START of the id is a new connection."""
        try:
            self._call(
                "delete_item",
                Key=self._key(connection_id),
                ConditionExpression=cond.DELETABLE,
                ExpressionAttributeNames=_names(cond.DELETABLE),
                ExpressionAttributeValues=marshal({":stopped": schema.STOPPED, ":free": ""}),
            )
        except ClientError as exc:
            if not _condition_failed(exc):
                raise
            item = self.get(connection_id)
            if item is None:
                return DeleteOutcome.NOT_FOUND
            if item.get(schema.DESIRED_STATE) != schema.STOPPED:
                return DeleteOutcome.NOT_STOPPED
            return DeleteOutcome.HELD
        return DeleteOutcome.DELETED
