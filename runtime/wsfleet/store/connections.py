"""The connections table: desired state (the router), ownership and checkpoints (the
workers). Every write is conditional; a lost race comes back as a value."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from botocore.exceptions import ClientError

from .. import schema
from ..leases import AcquireFailure, acquire_already_landed, acquire_refusal, backoff_s, release_already_landed
from .last_error import LastErrors
from .base import (
    TransactionCancelled,
    TransientError,
    _condition_failed,
    _names,
    _old_item,
    _Table,
    marshal,
    now_ms,
    unmarshal,
)

if TYPE_CHECKING:
    from .sessions import SessionsStore

# Checkpoints per TransactWriteItems (DynamoDB takes up to 100). 25 keeps one
# transaction's hold on the embedded emulator's DynamoDB lock to about that of a batch.
MAX_TRANSACTION = 25
# An acquire whose items keep changing between its read and its transaction (a START or
# STOP landing in between, each time) gives up after this many transactions.
ACQUIRE_ROUNDS = 4


@dataclass(frozen=True)
class CheckpointEntry:
    """One connection's checkpoint, as :meth:`ConnectionsStore.checkpoint_many` writes it."""

    connection_id: str
    session_id: str
    fence_token: int
    last_seq: int


@dataclass(frozen=True)
class Acquired:
    # The connection item after the acquisition: whole when it was read, or the fields a
    # clean release's hint carries (schema.item_from_released) when it was taken as that.
    item: dict

    @property
    def checkpoint_is_end(self) -> bool:
        """The previous owner (the fence just before ours) released it after flushing
        everything: its checkpoint is where the stored messages end, so there is nothing
        past it to read. False after a crash, a takeover or a free of an ENDED session's
        connection, where a last batch may lie past the checkpoint."""
        released_by = self.item.get(schema.CHECKPOINT_IS_END)
        return released_by is not None and int(released_by) == int(self.item[schema.FENCE_TOKEN]) - 1


@dataclass(frozen=True)
class NotAcquired:
    reason: AcquireFailure
    lease_session: str = ""  # the session it is attached to, when HELD


@dataclass(frozen=True)
class Owned:
    """A row of the by_owner index: what a session holds, as the index last saw it."""

    connection_id: str
    desired_state: str


class Released(enum.Enum):
    """How a release landed; false when it did not."""

    FREE = "free"  # STARTED (a START came meanwhile): in its FREE# partition, for anyone to take now
    STOPPED = "stopped"  # STOPPED: out of the owner index
    LOST = "lost"  # no longer ours: nothing written

    def __bool__(self) -> bool:
        return self is not Released.LOST


class StartOutcome(enum.Enum):
    CREATED = "created"  # new connection: 202
    RESTARTED = "restarted"  # was STOPPED, now STARTED again: 202
    UNCHANGED = "unchanged"  # already STARTED with this ws_url and upstream: 200
    CONFLICT = "conflict"  # already STARTED with another ws_url or upstream: 409


@dataclass(frozen=True)
class Started:
    outcome: StartOutcome
    unowned: bool = False  # STARTED and attached to no session: worth a hint
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


# A STOP's transaction conflicts with any other one on its owner's session item (DynamoDB
# cancels one of the two): it goes again after a pause with full jitter, doubling from
# STOP_CONFLICT_PAUSE_S up to the cap. Eight tries pause 1.8 s at most (0.9 s on average),
# well inside the router's 10 s; then the caller gets a 503 and tries again.
STOP_TRIES = 8
STOP_CONFLICT_PAUSE_S = 0.02
STOP_CONFLICT_PAUSE_CAP_S = 0.4

# Items per page when a session's connections are listed (the audit every 30 s, a
# drain). DynamoDB would answer a whole worker's holding (1,000 rows of about 100 bytes)
# in one request; the embedded emulator takes about 0.45 s to serialise such a page,
# inside the lock every DynamoDB request waits for, and every frame stored meanwhile
# waits with it. Pages of 100 hold it about 50 ms each, for 9 more requests per audit.
OWNER_PAGE_ITEMS = 100


class ConnectionsStore(LastErrors, _Table):
    """The connections table: desired state, checkpoint, and which session owns it."""

    key_name = schema.PK

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        state_shards: int,
        sessions_table_name: str = "",
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        super().__init__(client, table_name, clock_ms=clock_ms)
        self._shards = state_shards
        # Where acquire checks that the acquirer's session is LIVE; the router, which
        # never acquires, needs none.
        self._sessions_table = sessions_table_name

    def _key(self, key: str) -> dict:
        return marshal({schema.PK: schema.connection_pk(key)})

    # --- reads -------------------------------------------------------------------------

    def get(self, connection_id: str, *, consistent: bool = True) -> dict | None:
        resp = self._call("get_item", Key=self._key(connection_id), ConsistentRead=consistent)
        return unmarshal(resp["Item"]) if "Item" in resp else None

    def _owner_pages(self, owner_key: str, *, projection: str = "", **extra: Any) -> Iterator[dict]:
        if projection:
            extra.update(Select="SPECIFIC_ATTRIBUTES", ProjectionExpression=projection)
        return self._query_pages(
            IndexName=schema.OWNER_INDEX,
            KeyConditionExpression="#k = :k",
            ExpressionAttributeNames=_names("#k", projection),
            ExpressionAttributeValues=marshal({":k": owner_key}),
            **extra,
        )

    def owned_by(self, session_id: str) -> list[Owned]:
        """Every connection attached to a session, as the by_owner index has it, in
        pages of :data:`OWNER_PAGE_ITEMS`."""
        return [
            Owned(schema.connection_id_from_pk(row[schema.PK]), row.get(schema.DESIRED_STATE, ""))
            for page in self._owner_pages(schema.owner_key_session(session_id), Limit=OWNER_PAGE_ITEMS)
            for row in map(unmarshal, page.get("Items", []))
        ]

    def free(self, shard: int, *, limit: int = 100) -> Iterator[str]:
        """STARTED connections nobody owns, of one index shard, ``limit`` per request."""
        for page in self._owner_pages(schema.free_partition(shard), Limit=limit):
            for raw in page.get("Items", []):
                yield schema.connection_id_from_pk(unmarshal(raw)[schema.PK])

    def free_ids(self, shard: int) -> set[str]:
        """Every STARTED connection of one shard nobody owns, keys only: what the
        UnownedConnections count compares between two of its samples."""
        pages = self._owner_pages(schema.free_partition(shard), projection="#pk")
        return {schema.connection_id_from_pk(unmarshal(raw)[schema.PK]) for page in pages for raw in page.get("Items", [])}

    def count_free(self, shard: int) -> int:
        """How many STARTED connections of one shard nobody owns, without reading them."""
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.free_partition(shard), Select="COUNT"))

    def count_owned_by(self, session_id: str) -> int:
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.owner_key_session(session_id), Select="COUNT"))

    def sweep_page(self, start: Mapping | None, *, limit: int) -> tuple[list[dict], dict | None]:
        """One page of a Scan of every connection, as the reachability sweep reads it:
        (items with their key, desired state, session and owner key; the key to start the
        next page from, or None after the last). Eventually consistent: a caller acts
        only on what a consistent read confirms."""
        projection = "#pk, #s, #l, #k"
        kwargs: dict[str, Any] = {
            "ProjectionExpression": projection,
            "ExpressionAttributeNames": _names(projection),
            "Limit": limit,
        }
        if start:
            kwargs["ExclusiveStartKey"] = dict(start)
        resp = self._call("scan", **kwargs)
        return [unmarshal(i) for i in resp.get("Items", [])], resp.get("LastEvaluatedKey")

    # --- ownership writes --------------------------------------------------------------

    def acquire(
        self, connection_id: str, *, session_id: str, worker_id: str, expected_session: str = ""
    ) -> Acquired | NotAcquired:
        """Attach one connection to our session: :meth:`acquire_many` of one."""
        return self.acquire_many([(connection_id, expected_session)], session_id=session_id, worker_id=worker_id)[0]

    def acquire_many(
        self,
        wanted: Sequence[tuple[str, str]],
        *,
        session_id: str,
        worker_id: str,
        known: Mapping[str, dict] | None = None,
    ) -> list[Acquired | NotAcquired]:
        """Attach connections to our session: ``wanted`` are (connection id, expected
        session) pairs, at most :data:`MAX_TRANSACTION`; ``known``: items as a clean
        release's hint says it left them (:func:`schema.item_from_released`), taken as
        read (the transaction's pin checks them; one that changed is read from its
        cancellation, as a race lost between a read and the transaction is).

        The other items are read first (strongly consistent, one BatchGetItem): one already
        attached to our session is ours (a retry of an acquire that landed), one that may
        not be taken is answered without a write. The rest are taken in one
        TransactWriteItems, each Update conditional on the version read: the item
        exists, desired_state is STARTED, ``lease_session`` is the expected session ("" for
        a free one, or an ENDED session whose connections we are taking), and
        ``fence_token``, ``ws_url`` and ``upstream`` are as read (a STOP then START of a
        free connection changes neither its fence nor, perhaps, its ws_url, but may change
        its upstream: a taker pinned to the old one would open the socket the old way). Session ids are never reused and an
        ENDED session is never renewed, so this pins the exact ownership epoch that was
        read. Each sets ``fence_token`` to the next one and moves ``owner_key`` to our
        session. The same transaction holds a ConditionCheck that our own session is
        LIVE: no connection is ever attached to a session that has ended (whose watchers
        may have drained it and taken it out of the ring), however late the request
        arrives.

        All or nothing: if our session is not LIVE, every entry still to take is
        NOT_LIVE; an entry whose item changed since the read is answered from the item it
        failed on (or tried again with it, if it may still be taken), and the others go
        again without it. Exactly one of any number of racing callers acquires a
        connection. Raises :class:`TransientError` for faults that say nothing about
        ownership; the caller retries the whole call, and what landed meanwhile is then
        read as ours."""
        if not self._sessions_table:
            raise ValueError("acquire needs the sessions table (ConnectionsStore(sessions_table_name=...))")
        wanted = list(dict.fromkeys(wanted))
        if not 0 < len(wanted) <= MAX_TRANSACTION:
            raise ValueError(f"an acquire transaction holds 1 to {MAX_TRANSACTION} connections, not {len(wanted)}")
        answers: dict[str, Acquired | NotAcquired] = {}
        todo: dict[str, tuple[str, dict]] = {}  # connection id -> (expected session, item as read)

        def judge(cid: str, expected: str, item: dict | None) -> None:
            if acquire_already_landed(item, session_id):
                answers[cid] = Acquired(item)
            elif (why := acquire_refusal(item, expected_session=expected)) is not None:
                answers[cid] = NotAcquired(why, (item or {}).get(schema.LEASE_SESSION, ""))
            else:
                todo[cid] = (expected, item)

        known = known or {}
        reads = self.get_many([cid for cid, _ in wanted if cid not in known])
        for cid, expected in wanted:
            judge(cid, expected, known[cid] if cid in known else reads[cid])
        for _ in range(ACQUIRE_ROUNDS):
            if not todo:
                break
            now = self._now_ms()
            taken = {cid: _taken(item, session_id=session_id, worker_id=worker_id, now_ms=now) for cid, (_, item) in todo.items()}
            reasons = self._transact(self._acquire_items(todo, taken, session_id=session_id))
            if reasons is None:
                answers.update((cid, Acquired(item)) for cid, item in taken.items())
                todo.clear()
            elif reasons[0].get("Code") == "ConditionalCheckFailed":
                answers.update((cid, NotAcquired(AcquireFailure.NOT_LIVE)) for cid in todo)
                todo.clear()
            else:
                for (cid, (expected, _)), reason in zip(list(todo.items()), reasons[1:], strict=True):
                    if reason.get("Code") == "ConditionalCheckFailed":
                        del todo[cid]
                        judge(cid, expected, reason.get("Item"))
        if todo:
            raise TransientError(f"acquire of {', '.join(todo)}: the items kept changing; try again")
        return [answers[cid] for cid, _ in wanted]

    def _acquire_items(self, todo: Mapping[str, tuple[str, dict]], taken: Mapping[str, dict], *, session_id: str) -> list[dict]:
        """The acquire transaction: our session's LIVE check first, then one Update per
        connection, pinned to the version read."""
        live = "#st = :live"
        update = "SET #o = :me, #l = :session, #k = :key, #u = :now, #f = :next"
        pinned = "attribute_exists(#pk) AND #s = :started AND #l = :expected AND #f = :fence AND #w = :url"
        items: list[dict] = [
            {
                "ConditionCheck": {
                    "TableName": self._sessions_table,
                    "Key": marshal({schema.SESSION_ID: session_id}),
                    "ConditionExpression": live,
                    "ExpressionAttributeNames": _names(live),
                    "ExpressionAttributeValues": marshal({":live": schema.LIVE}),
                }
            }
        ]
        for cid, (expected, item) in todo.items():
            new = taken[cid]
            values = {
                ":me": new[schema.LEASE_OWNER],
                ":session": session_id,
                ":key": new[schema.OWNER_KEY],
                ":now": new[schema.UPDATED_AT_MS],
                ":next": new[schema.FENCE_TOKEN],
                ":started": schema.STARTED,
                ":expected": expected,
                ":fence": int(item.get(schema.FENCE_TOKEN, 0)),
                ":url": item.get(schema.WS_URL, ""),
            }
            # A map compares whole (DynamoDB's = takes maps and lists); the default
            # protocol is the attribute's absence.
            if schema.UPSTREAM in item:
                condition = f"{pinned} AND #up = :up"
                values[":up"] = item[schema.UPSTREAM]
            else:
                condition = f"{pinned} AND attribute_not_exists(#up)"
            items.append(self._transact_update(cid, update=update, condition=condition, values=values, return_old=True))
        return items

    def get_many(self, connection_ids: Sequence[str]) -> dict[str, dict | None]:
        """Strongly consistent BatchGetItem of whole connection items (at most 100);
        None for one that does not exist."""
        if not connection_ids:
            return {}
        found = {
            schema.connection_id_from_pk(item[schema.PK]): item
            for item in self._batch_get(connection_ids, ConsistentRead=True)
        }
        return {c: found.get(c) for c in connection_ids}

    def _detach(
        self,
        connection_id: str,
        *,
        condition: str,
        values: Mapping[str, Any],
        last_seq: int | None,
        expect_stopped: bool = False,
    ) -> tuple[str | None, dict]:
        """Make the connection free (``owner_key`` FREE#shard if STARTED, removed if
        STOPPED), under ``condition``. The index key depends on the desired state, which
        a concurrent START or STOP may flip: the write names the state it expects, and
        is tried once more with the other one (a failed conditional write is billed, so
        the likelier state goes first). Returns (the desired state of the form that
        landed, {}), or (None, the old item, {} if gone) when the condition failed for
        another reason."""
        old: dict | None = None
        first, other = (schema.STOPPED, schema.STARTED) if expect_stopped else (schema.STARTED, schema.STOPPED)
        for state in (first, other, first):
            update = "SET #o = :empty, #l = :empty, #u = :now"
            state_values: dict[str, Any] = {":empty": "", ":now": self._now_ms(), ":state": state}
            if last_seq is not None:
                # A release: everything was flushed first, so last_seq is where the stored
                # messages end, as of this ownership (fence) -- see checkpoint_is_end().
                update += ", #q = :seq, #ce = :fence"
                state_values[":seq"] = last_seq
            if state == schema.STARTED:
                update += ", #k = :free"
                state_values[":free"] = schema.owner_key_free(connection_id, self._shards)
            else:
                update += " REMOVE #k"
            new, old = self._conditional_update(
                connection_id,
                update=update,
                condition=f"{condition} AND #s = :state",
                values={**values, **state_values},
                returns="NONE",
            )
            if new is not None:
                return state, {}
            if old is None or old.get(schema.DESIRED_STATE) == state:
                return None, old or {}
        return None, old or {}

    def release(
        self, connection_id: str, *, session_id: str, fence_token: int, last_seq: int, stopped: bool = False
    ) -> Released:
        """Give the connection up with a final checkpoint.

        Conditional on: ``lease_session`` is ours and ``fence_token`` is ours. Returns how
        it landed: FREE when a START came meanwhile (STARTED: the releaser hints it, as
        nobody else will), STOPPED, or LOST when it was no longer ours (nothing written);
        a retry whose first attempt landed reports the state it finds. ``stopped``:
        released for a STOP, so the STOPPED form of the write goes first."""
        landed, old = self._detach(
            connection_id,
            condition="#l = :session AND #f = :fence",
            values={":session": session_id, ":fence": fence_token},
            last_seq=last_seq,
            expect_stopped=stopped,
        )
        if landed is None and release_already_landed(old, fence_token):
            landed = old.get(schema.DESIRED_STATE)
        if landed is None:
            return Released.LOST
        return Released.FREE if landed == schema.STARTED else Released.STOPPED

    def free_orphan(self, connection_id: str, *, dead_session: str) -> bool:
        """Free a connection of an ENDED session without taking it (its checkpoint stays
        as the dead owner left it; whoever takes it finds the stored end past it).

        Conditional on: ``lease_session`` is the dead session."""
        landed, _ = self._detach(connection_id, condition="#l = :dead", values={":dead": dead_session}, last_seq=None)
        return landed is not None

    def checkpoint(self, connection_id: str, *, session_id: str, fence_token: int, last_seq: int) -> bool:
        """Store ``last_seq`` while holding the connection (no index key moves): a
        :meth:`checkpoint_many` of one. Conditional on: ``lease_session`` and
        ``fence_token`` are ours. Returns False if the connection is no longer ours."""
        return self.checkpoint_many([CheckpointEntry(connection_id, session_id, fence_token, last_seq)]) == [True]

    def checkpoint_many(self, entries: Sequence[CheckpointEntry]) -> list[bool | None]:
        """Store several checkpoints in one TransactWriteItems (at most
        :data:`MAX_TRANSACTION` of them), each an Update conditional on its connection's
        session and fence (``lease_session`` and ``fence_token``), no index key moving.

        A transaction is all or nothing. Per entry, in order: True when written, False
        when its condition failed (the connection is no longer ours), None when it was not
        written only because another entry failed (write it again without that one).
        Raises :class:`TransientError` when the transaction was cancelled for reasons that
        say nothing about ownership (a conflict with another write to one of the items,
        throttling): the whole group may go again. A retry of a transaction that landed
        writes the same values again under conditions that still hold."""
        if not 0 < len(entries) <= MAX_TRANSACTION:
            raise ValueError(f"a checkpoint transaction holds 1 to {MAX_TRANSACTION} entries, not {len(entries)}")
        now = self._now_ms()
        reasons = self._transact(
            [
                self._transact_update(
                    e.connection_id,
                    update="SET #q = :seq, #u = :now",
                    condition="#l = :session AND #f = :fence",
                    values={":seq": e.last_seq, ":now": now, ":session": e.session_id, ":fence": e.fence_token},
                )
                for e in entries
            ]
        )
        if reasons is None:
            return [True] * len(entries)
        return [False if r["Code"] == "ConditionalCheckFailed" else None for r in reasons]

    # --- desired state (the router) -------------------------------------------------------

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
        ones. A STARTED one is never written, so a repeated or concurrent START cannot
        disturb its owner: the same ``ws_url`` and ``upstream`` are UNCHANGED, another
        is a CONFLICT naming what differs. Losing a race re-reads the outcome from the
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
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames=_names("#pk"),
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
                return Started(StartOutcome.UNCHANGED, unowned=not session)
            update = "SET #s = :started, #w = :url, #u = :now" + (", #k = :free" if not session else "")
            update += ", #up = :upstream REMOVE #le, #lt" if wanted else " REMOVE #up, #le, #lt"
            params = self._update(
                connection_id,
                update=update,
                condition="#s = :stopped AND #l = :session",
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
            return Started(StartOutcome.RESTARTED, unowned=not session)
        raise TransientError(f"start of {connection_id!r} kept losing races; try again")

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
                "condition": "attribute_exists(#pk) AND #s = :started AND #l = :session AND #f = :fence",
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


def _taken(item: Mapping[str, Any], *, session_id: str, worker_id: str, now_ms: int) -> dict:
    """The connection item as an acquisition by ``session_id`` leaves it."""
    return {
        **item,
        schema.LEASE_OWNER: worker_id,
        schema.LEASE_SESSION: session_id,
        schema.OWNER_KEY: schema.owner_key_session(session_id),
        schema.UPDATED_AT_MS: now_ms,
        schema.FENCE_TOKEN: int(item.get(schema.FENCE_TOKEN, 0)) + 1,
    }
