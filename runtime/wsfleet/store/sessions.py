"""The worker sessions table: one item per worker run (an etcd-style lease), the watch
ring, the STOP inbox and the fleet summary item."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from botocore.exceptions import ClientError

from .. import schema
from ..balance import ring_write_due
from ..leases import EndFailure, RenewFailure, classify_end_failure, classify_renew_failure
from . import conditions as cond
from .base import TransientError, _condition_failed, _names, _old_item, _Table, marshal, unmarshal


RING_PAGE_LIMIT = 2000  # sessions per ring page: ~250 KB of index entries, 32 read units


class SessionsStore(_Table):
    """The worker sessions table: one item per worker run, renewed every heartbeat.

    The verbs of an etcd lease: :meth:`open` (grant), :meth:`renew` (keep-alive),
    :meth:`end_own` and :meth:`end_expired` (revoke), :meth:`get` (time-to-live).
    """

    key_name = schema.SESSION_ID

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The load the newest landed renewal stored, and how many landed renewals since
        # the one that wrote it: {session id: (its expiry, (active, max, draining), renewals)}
        self._stored_load: dict[str, tuple[int, tuple[int, int, bool], int]] = {}

    def open(self, session_id: str, *, worker_id: str, lease_ms: int, max_connections: int) -> dict:
        """Create a LIVE session in the watch ring.

        Conditional on: no item with this id (:data:`~.conditions.SESSION_IS_NEW`; ids
        are unique per run). A retry of a put that landed finds its own item and returns
        it; an item of another worker's with this id raises the ClientError."""
        now = self._now_ms()
        item = {
            schema.SESSION_ID: session_id,
            schema.SESSION_WORKER_ID: worker_id,
            schema.SESSION_STATE: schema.LIVE,
            schema.EXPIRES_AT_MS: now + lease_ms,
            schema.HEARTBEAT_AT_MS: now,
            schema.STARTED_AT_MS: now,
            schema.ACTIVE: 0,
            schema.MAX_CONNECTIONS: max_connections,
            schema.RING: schema.RING_VALUE,
        }
        try:
            self._call(
                "put_item",
                Item=marshal(item),
                ConditionExpression=cond.SESSION_IS_NEW,
                ExpressionAttributeNames=_names(cond.SESSION_IS_NEW),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not _condition_failed(exc):
                raise
            old = _old_item(exc)
            if old is None or old.get(schema.SESSION_WORKER_ID) != worker_id:
                raise
            return old
        return item

    def renew(
        self,
        session_id: str,
        *,
        lease_ms: int,
        active: int,
        max_connections: int,
        stops_done: Iterable[str] = (),
        assigned_done: Iterable[str] = (),
        draining: bool = False,
        suspect: Mapping[str, Any] | None = None,
    ) -> dict | RenewFailure:
        """Extend the session, report its load, and take the STOPs and the assignments
        (moves to it: :meth:`ConnectionsStore.move`) posted to it.

        Conditional on: the session is LIVE and its expiry not past the new one (a slow,
        superseded renewal never moves it back: :data:`~.conditions.SESSION_RENEWABLE`).
        Returns the item as renewed (its ``stops`` are the STOPs not yet handled); on a
        lost lease, why (ENDED / gone); raises :class:`TransientError` when a later
        renewal of ours landed first (that says nothing about ownership). Idempotent: a
        retry of a renewal that landed succeeds again. ``stops_done`` are removed from
        the inbox in the same write, ``assigned_done`` from the assignments. ``suspect``: the worker's prime suspect
        (:meth:`wsfleet.crash_loop.Suspect.item`), stored as ``suspect`` (removed when
        None), for whoever ends this session if it dies (not projected in any index).

        The load (active, max_connections, draining) is projected into the ring index:
        it is written only when :func:`wsfleet.balance.ring_write_due` says so, against
        what the newest renewal that landed stored (its returned item): never unchanged,
        a changed count at most every other renewal. A renewal whose answer was lost
        leaves what is stored unknown: the next one writes the load again."""
        now = self._now_ms()
        done = sorted(set(stops_done))
        update = "SET #e = :exp, #hb = :now"
        values: dict[str, Any] = {":exp": now + lease_ms, ":now": now, ":live": schema.LIVE}
        load = (active, max_connections, bool(draining))
        stored = self._stored_load.get(session_id)
        write = ring_write_due(stored[1] if stored else None, load, renewals_since=stored[2] if stored else 0)
        if write:
            update += ", #a = :active, #m = :max, #dr = :draining"
            values.update({":active": active, ":max": max_connections, ":draining": bool(draining)})
        if suspect is not None:
            update += ", #ps = :suspect"
            values[":suspect"] = dict(suspect)
        else:
            update += " REMOVE #ps"
        deletes = []
        if done:
            deletes.append("#in :done")
            values[":done"] = set(done)
        if assigned := sorted(set(assigned_done)):
            deletes.append("#as :assigned")
            values[":assigned"] = set(assigned)
        if deletes:
            update += " DELETE " + ", ".join(deletes)
        try:
            new, old = self._conditional_update(session_id, update=update, condition=cond.SESSION_RENEWABLE, values=values)
        except Exception:
            if write:
                self._stored_load.pop(session_id, None)  # it may have landed: written again next time
            raise
        if new is None and old is not None and old.get(schema.SESSION_STATE) == schema.LIVE:
            # A later renewal of ours landed first (this one was slow): never move the
            # expiry back, and this says nothing about ownership.
            raise TransientError("renew: a later renewal already landed")
        if new is not None:
            self._remember_load(session_id, new, wrote=write)
        return new if new is not None else classify_renew_failure(old)

    def _remember_load(self, session_id: str, item: Mapping[str, Any], *, wrote: bool) -> None:
        """What a landed renewal stored of the load, if it is the newest seen (stored
        expiries only grow, so the largest is what the item holds now): two renewals in
        flight may answer in either order. ``wrote``: it wrote the load (the count of
        renewals since starts again)."""
        expires = int(item.get(schema.EXPIRES_AT_MS, 0))
        stored = self._stored_load.get(session_id)
        if stored is None or expires >= stored[0]:
            load = (int(item.get(schema.ACTIVE, 0)), int(item.get(schema.MAX_CONNECTIONS, 0)), bool(item.get(schema.DRAINING)))
            since = 0 if wrote or stored is None else stored[2] + 1
            self._stored_load = {session_id: (expires, load, since)}  # one worker, one session at a time

    def end_expired(
        self, session_id: str, *, ended_by: str, max_clock_skew_ms: int, trace_header: str | None = None
    ) -> dict | EndFailure:
        """End another worker's dead session, so that it can never be renewed again and
        its connections may be taken. It stays in the watch ring until drained.
        ``trace_header``: the ending span's, stored as ``end_trace`` in the same write,
        so that every later drainer of the session continues that trace.

        Conditional on: LIVE and ``expires_at_ms`` more than ``max_clock_skew_ms`` in the
        past by our clock (:data:`~.conditions.SESSION_EXPIRED`). Exactly one of any
        number of racing callers succeeds (the ENDED item); the others get an
        :class:`~wsfleet.leases.EndFailure`: renewed after all, or ended by someone else."""
        now = self._now_ms()
        values = {
            ":ended": schema.ENDED,
            ":live": schema.LIVE,
            ":me": ended_by,
            ":ttl": now // 1000 + schema.ENDED_SESSION_TTL_S,
            ":cutoff": now - max_clock_skew_ms,
        }
        if trace_header:
            values[":th"] = trace_header
        new, old = self._conditional_update(
            session_id,
            update="SET #st = :ended, #by = :me, #ttl = :ttl" + (", #th = :th" if trace_header else ""),
            condition=cond.SESSION_EXPIRED,
            values=values,
        )
        return new if new is not None else classify_end_failure(old)

    def end_own(self, session_id: str, *, worker_id: str, active: int | None = None) -> bool:
        """End our own session: at a clean exit, or after our deadline passed. It stays in
        the watch ring: only :meth:`leave_ring` takes it out, once its connections are
        known to be gone (a session leaves the ring only when nothing is attached to it,
        and an acquisition may have landed without its worker learning of it).
        ``active``: what the worker still holds (0 after a clean handover), in place of
        the last renewal's count: the summary lists the ENDED session as dead with it, and
        workers read their inboxes between renewals only for a dead one holding some.

        Conditional on: LIVE. Returns False if it was ENDED already (or is gone)."""
        now = self._now_ms()
        values = {
            ":ended": schema.ENDED,
            ":live": schema.LIVE,
            ":me": worker_id,
            ":ttl": now // 1000 + schema.ENDED_SESSION_TTL_S,
        }
        update = "SET #st = :ended, #by = :me, #ttl = :ttl"
        if active is not None:
            update += ", #a = :active"
            values[":active"] = int(active)
        new, old = self._conditional_update(session_id, update=update, condition=cond.SESSION_LIVE, values=values)
        return new is not None

    def leave_ring(self, session_id: str) -> bool:
        """Take a drained session out of the watch ring.

        Conditional on: ENDED (a LIVE session is never dropped from watching). Returns
        False when it is LIVE (or gone)."""
        new, _ = self._conditional_update(
            session_id, update="REMOVE #r", condition=cond.SESSION_ENDED, values={":ended": schema.ENDED}, returns="NONE"
        )
        return new is not None

    def rejoin_ring(self, session_id: str) -> bool:
        """Put a LIVE session that is missing from the watch ring back in it (the
        reachability sweep's repair: a LIVE session is always watched).

        Conditional on: LIVE. Returns False when it has ended (or is gone)."""
        new, _ = self._conditional_update(
            session_id,
            update="SET #r = :ring",
            condition=cond.SESSION_LIVE,
            values={":ring": schema.RING_VALUE, ":live": schema.LIVE},
            returns="NONE",
        )
        return new is not None

    def post_stop(self, session_id: str, connection_id: str, fence_token: int) -> bool:
        """Post a STOP to the owning session's inbox, for the ownership ``fence_token``
        (see :func:`schema.stop_entry`); its worker takes it with its next renewal.
        Conditional on: LIVE (an ENDED session's connections are taken or freed by
        others, who see the STOP themselves). Returns False when not LIVE. Idempotent (a
        set ADD): a retry, or a second post of one STOP, leaves one entry."""
        new, _ = self._conditional_update(session_id, **self._stop_notice(connection_id, fence_token), returns="NONE")
        return new is not None

    def request_drain(self, session_id: str, *, by: str) -> tuple[dict | None, dict | None]:
        """Ask a LIVE session's worker to leave (``wsfleet drain``): its next renewal
        returns ``drain_requested`` and it leaves as on SIGTERM. One UpdateItem,
        conditional on: LIVE. A second request keeps the first one's who and when.
        Returns (the item as updated, None), or (None, the item as it was, or None if
        there is none) when the session is not LIVE."""
        request = {schema.DRAIN_BY: by, schema.DRAIN_AT_MS: self._now_ms()}
        return self._conditional_update(
            session_id,
            update="SET #drq = if_not_exists(#drq, :req)",
            condition=cond.SESSION_LIVE,  # fails on no item too: an UpdateItem never creates one here
            values={":req": request, ":live": schema.LIVE},
        )

    def stop_notice(self, session_id: str, connection_id: str, fence_token: int) -> dict:
        """:meth:`post_stop` as an entry of a TransactWriteItems, so that a STOP and its
        notice are one write (see :meth:`ConnectionsStore.stop`). Conditional on: LIVE;
        when it is not, this entry's condition cancels the transaction."""
        return self._transact_update(session_id, **self._stop_notice(connection_id, fence_token))

    @staticmethod
    def _stop_notice(connection_id: str, fence_token: int) -> dict[str, Any]:
        return {
            "update": "ADD #in :c",
            "condition": cond.SESSION_LIVE,
            "values": {":c": {schema.stop_entry(connection_id, fence_token)}, ":live": schema.LIVE},
        }

    def get(self, session_id: str, *, consistent: bool = True) -> dict | None:
        resp = self._call("get_item", Key=self._key(session_id), ConsistentRead=consistent)
        return unmarshal(resp["Item"]) if "Item" in resp else None

    def get_many(self, session_ids: Sequence[str]) -> list[dict]:
        """Eventually consistent BatchGetItem of sessions (the watched ones, the fleet
        summary, or all of them for the summary), 100 per request; missing ones are left
        out. Keys left unprocessed (throttling) are asked for again after a backoff
        (:meth:`_Table._batch_get`)."""
        projection = "#sid, #st, #e, #a, #m, #hb, #dr, #r, #th, #fw, #fc, #fb, #fs, #ft, #fu, #fo, #fx, #fi, #fl, #fd"
        return self._batch_get(
            list(dict.fromkeys(session_ids)), ProjectionExpression=projection, ExpressionAttributeNames=_names(projection)
        )

    def _ring_query(self, **extra: Any) -> dict[str, Any]:
        """The Query of the whole watch ring (``by_ring_load``), in id order."""
        return {
            "IndexName": schema.RING_INDEX,
            "KeyConditionExpression": cond.RING,
            "ExpressionAttributeNames": _names(cond.RING),
            "ExpressionAttributeValues": marshal({":r": schema.RING_VALUE}),
            **extra,
        }

    def ring_page(self, start: Mapping[str, Any] | None = None, *, limit: int) -> tuple[list[dict], dict | None]:
        """One page of the watch ring with what the index projects of each session
        (``schema.RING_PROJECTED``: state, active, max_connections, draining), in id
        order, at most ``limit`` items: (sessions, where the next page starts, or None
        after the last). The summarizer's bounded read: a page per pass."""
        resp = self._call("query", **self._ring_query(Limit=limit, **({"ExclusiveStartKey": start} if start else {})))
        return [unmarshal(raw) for raw in resp.get("Items", [])], resp.get("LastEvaluatedKey")

    def ring_before(self, session_id: str, *, limit: int) -> list[str]:
        """Up to ``limit`` session ids before ``session_id`` in the watch ring (nearest
        first, wrapping to the end): the sessions that watch it."""
        return self._ring_neighbours(session_id, limit=limit, forward=False)

    def announce(self, session_id: str) -> bool:
        """Tell a watching session that its successors changed (its next renewal returns
        the bumped ``ring_changes``). Conditional on: LIVE. Returns False when it has
        ended (or is gone): it watches nothing any more."""
        new, _ = self._conditional_update(
            session_id, update="ADD #rc :one", condition=cond.SESSION_LIVE, values={":one": 1, ":live": schema.LIVE}, returns="NONE"
        )
        return new is not None

    def put_summary(self, summary: Mapping[str, Any]) -> None:
        """Write the fleet summary item (unconditional: the newest summary wins, and two
        summarizers for a moment write the same figures)."""
        self._call("put_item", Item=marshal({schema.SESSION_ID: schema.FLEET_SUMMARY_ID, **summary}))

    def ring_after(self, session_id: str, *, limit: int) -> list[str]:
        """Up to ``limit`` session ids after ``session_id`` in the watch ring (sorted,
        wrapping to the start), not counting it: at most two small index queries."""
        return self._ring_neighbours(session_id, limit=limit, forward=True)

    def _ring_neighbours(self, session_id: str, *, limit: int, forward: bool) -> list[str]:
        """The nearest ``limit`` ids on one side of ``session_id``, going round the ring:
        one query from it in that direction, and one from the far end if that ran out."""
        found: list[str] = []
        beyond = cond.RING_AFTER if forward else cond.RING_BEFORE
        for condition, start in ((beyond, session_id), (cond.RING, None)):
            values = {":r": schema.RING_VALUE, **({":me": start} if start is not None else {})}
            resp = self._call(
                "query",
                IndexName=schema.RING_INDEX,
                KeyConditionExpression=condition,
                ExpressionAttributeNames=_names(condition),
                ExpressionAttributeValues=marshal(values),
                ScanIndexForward=forward,
                Limit=limit + 1,
            )
            for raw in resp.get("Items", []):
                sid = unmarshal(raw)[schema.SESSION_ID]
                if sid != session_id and sid not in found:
                    found.append(sid)
            if len(found) >= limit:
                break
        return found[:limit]
