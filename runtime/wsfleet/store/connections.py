"""The connections table: ownership and checkpoints (the workers), with the router's
desired state (:mod:`.desired`) and the owners' last_error (:mod:`.last_error`) as parts
of the same store. Every write is conditional; a lost race comes back as a value."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from botocore.exceptions import ClientError

from .. import schema
from ..leases import (
    AcquireFailure,
    acquire_already_landed,
    acquire_refusal,
    release_already_landed,
    released_at_fence,
)
from .desired import DesiredState
from .last_error import HOLDING, LastErrors
from .base import (
    TransientError,
    _names,
    _Table,
    marshal,
    now_ms,
    unmarshal,
)

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
    HANDED = "handed"  # STARTED, still attached to our session, released at our fence: for the peer we hint
    STOPPED = "stopped"  # STOPPED: out of the owner index
    LOST = "lost"  # no longer ours: nothing written

    def __bool__(self) -> bool:
        return self is not Released.LOST


# Items per page when a session's connections are listed (the audit every 30 s, a
# drain). DynamoDB would answer a whole worker's holding (1,000 rows of about 100 bytes)
# in one request; the embedded emulator takes about 0.45 s to serialise such a page,
# inside the lock every DynamoDB request waits for, and every frame stored meanwhile
# waits with it. Pages of 100 hold it about 50 ms each, for 9 more requests per audit.
OWNER_PAGE_ITEMS = 100


class ConnectionsStore(DesiredState, LastErrors, _Table):
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

    def _owner_ids(self, owner_key: str, **extra: Any) -> Iterator[str]:
        """The connection ids of one by_owner partition, page by page (``extra``: as
        :meth:`_owner_pages` takes it)."""
        for page in self._owner_pages(owner_key, **extra):
            for raw in page.get("Items", []):
                yield schema.connection_id_from_pk(unmarshal(raw)[schema.PK])

    def free(self, shard: int, *, limit: int = 100, start_after: str = "") -> Iterator[str]:
        """STARTED connections nobody owns, of one index shard, ``limit`` per request:
        from just after the connection ``start_after`` (a random point, so that scanners
        do not all race for the same first entries; it need not be in the partition) to
        the partition's end, then from its start round to the first one already given.
        "" reads from the start."""
        partition = schema.free_partition(shard)
        seen: set[str] = set()
        if start_after:
            start = marshal({schema.PK: schema.connection_pk(start_after), schema.OWNER_KEY: partition})
            try:
                for cid in self._owner_ids(partition, Limit=limit, ExclusiveStartKey=start):
                    seen.add(cid)
                    yield cid
            except ClientError as exc:
                # A start key the table refuses ("The provided starting key is invalid"):
                # the scan reads from the start, as it did before it had a random point.
                if exc.response.get("Error", {}).get("Code") != "ValidationException":
                    raise
        for cid in self._owner_ids(partition, Limit=limit):
            if cid in seen:
                return  # round to where this scan began
            yield cid

    def free_ids(self, shard: int) -> set[str]:
        """Every STARTED connection of one shard nobody owns, keys only: what the
        UnownedConnections count compares between two of its samples."""
        return set(self._owner_ids(schema.free_partition(shard), projection="#pk"))

    def count_free(self, shard: int) -> int:
        """How many STARTED connections of one shard nobody owns, without reading them."""
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.free_partition(shard), Select="COUNT"))

    def count_owned_by(self, session_id: str) -> int:
        return sum(p.get("Count", 0) for p in self._owner_pages(schema.owner_key_session(session_id), Select="COUNT"))

    def sweep_page(self, start: Mapping | None, *, limit: int) -> tuple[list[dict], dict | None]:
        """One page of a Scan of every connection, as the reachability sweep reads it:
        (items with their key, desired state, session, owner key, fence, release mark
        and update time; the key to start the next page from, or None after the last).
        Eventually consistent: a caller acts only on what a consistent read confirms."""
        projection = "#pk, #s, #l, #k, #f, #rf, #u"
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
        a free one, or an ENDED session whose connections we are taking; or the session
        that handed it off, with ``released_fence`` = ``fence_token``: see
        :func:`~wsfleet.leases.acquire_refusal`), and ``fence_token``, ``ws_url`` and
        ``upstream`` are as read (a STOP then START of a
        free connection changes neither its fence nor, perhaps, its ws_url, but may change
        its upstream: a taker pinned to the old one would open the socket the old way). Session ids are never reused and an
        ENDED session is never renewed, so this pins the exact ownership epoch that was
        read. Each sets ``fence_token`` to the next one, moves ``owner_key`` to our
        session and removes ``released_fence``. The same transaction holds a ConditionCheck that our own session is
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
        update = "SET #o = :me, #l = :session, #k = :key, #u = :now, #f = :next REMOVE #rf"
        pinned = "attribute_exists(#pk) AND #s = :started AND #l = :holder AND #f = :fence AND #w = :url"
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
        for cid, (_, item) in todo.items():
            new = taken[cid]
            values = {
                ":me": new[schema.LEASE_OWNER],
                ":session": session_id,
                ":key": new[schema.OWNER_KEY],
                ":now": new[schema.UPDATED_AT_MS],
                ":next": new[schema.FENCE_TOKEN],
                ":started": schema.STARTED,
                # The session as read: the expected one (acquire_refusal), or the one
                # that handed it off, pinned with its release mark below.
                ":holder": item.get(schema.LEASE_SESSION, ""),
                ":fence": int(item.get(schema.FENCE_TOKEN, 0)),
                ":url": item.get(schema.WS_URL, ""),
            }
            released = " AND #rf = :fence" if released_at_fence(item) else ""
            # A map compares whole (DynamoDB's = takes maps and lists); the default
            # protocol is the attribute's absence.
            if schema.UPSTREAM in item:
                condition = f"{pinned}{released} AND #up = :up"
                values[":up"] = item[schema.UPSTREAM]
            else:
                condition = f"{pinned}{released} AND attribute_not_exists(#up)"
            items.append(self._transact_update(cid, update=update, condition=condition, values=values, return_old=True))
        return items

    def get_many(self, connection_ids: Sequence[str]) -> dict[str, dict | None]:
        """Strongly consistent BatchGetItem of whole connection items, 100 per request;
        None for one that does not exist."""
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
        STOPPED; any ``released_fence`` removed), under ``condition``. The index key depends on the desired state, which
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
                update += ", #k = :free REMOVE #rf"
                state_values[":free"] = schema.owner_key_free(connection_id, self._shards)
            else:
                update += " REMOVE #k, #rf"
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
        self,
        connection_id: str,
        *,
        session_id: str,
        fence_token: int,
        last_seq: int,
        stopped: bool = False,
        handoff: bool = False,
    ) -> Released:
        """Give the connection up with a final checkpoint.

        Conditional on: ``lease_session`` is ours and ``fence_token`` is ours. Returns how
        it landed: FREE when a START came meanwhile (STARTED: the releaser hints it, as
        nobody else will), STOPPED, or LOST when it was no longer ours (nothing written);
        a retry whose first attempt landed reports the state it finds. ``stopped``:
        released for a STOP, so the STOPPED form of the write goes first.

        ``handoff`` (a SHUTDOWN or a SHED, for a peer its hint names): a STARTED
        connection stays attached to our session, ``owner_key`` unmoved (no write to a
        FREE# partition), marked released at our fence (``released_fence``): HANDED. From
        then on this ownership writes nothing more to it (every write of ours is
        conditional on no such mark) but :meth:`free_released`. A STOPPED one is freed
        as for a STOP. A retry finding it already so reports HANDED."""
        if handoff:
            new, old = self._conditional_update(
                connection_id,
                update="SET #q = :seq, #ce = :fence, #rf = :fence, #u = :now",
                condition="#l = :session AND #f = :fence AND #s = :started",
                values={
                    ":seq": last_seq,
                    ":fence": fence_token,
                    ":now": self._now_ms(),
                    ":session": session_id,
                    ":started": schema.STARTED,
                },
                returns="NONE",
            )
            if new is not None:
                return Released.HANDED
            if old is not None and old.get(schema.DESIRED_STATE) == schema.STARTED:
                return Released.HANDED if release_already_landed(old, fence_token, session_id) else Released.LOST
            stopped = True  # a STOP came meanwhile (or it is gone): freed as for a STOP
        return self._free_ours(connection_id, "", session_id, fence_token, last_seq, stopped)

    def free_released(self, connection_id: str, *, session_id: str, fence_token: int, stopped: bool = False) -> Released:
        """Free a connection our session handed off and nobody took (the old way: into
        its FREE# partition if STARTED, out of the index if STOPPED), its checkpoint as
        the handoff left it. Conditional on: attached to ``session_id`` and released at
        ``fence_token``. FREE or STOPPED as it landed (a retry whose first attempt landed
        too), LOST when taken (or freed) by another meanwhile. ``stopped``: for a STOP,
        so the STOPPED form of the write goes first."""
        return self._free_ours(connection_id, " AND #rf = :fence", session_id, fence_token, None, stopped)

    def _free_ours(
        self, connection_id: str, also: str, session_id: str, fence_token: int, last_seq: int | None, stopped: bool
    ) -> Released:
        """:meth:`_detach` conditional on our session and fence (and ``also``), read as
        a :class:`Released`; a retry whose first attempt landed reports the state it finds."""
        landed, old = self._detach(
            connection_id,
            condition=f"#l = :session AND #f = :fence{also}",
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
        session and fence (``lease_session`` and ``fence_token``) and on no handoff of
        it (``released_fence`` absent: a handoff's releaser writes nothing after it), no
        index key moving.

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
                    condition=HOLDING,
                    values={":seq": e.last_seq, ":now": now, ":session": e.session_id, ":fence": e.fence_token},
                )
                for e in entries
            ]
        )
        if reasons is None:
            return [True] * len(entries)
        return [False if r["Code"] == "ConditionalCheckFailed" else None for r in reasons]


def _taken(item: Mapping[str, Any], *, session_id: str, worker_id: str, now_ms: int) -> dict:
    """The connection item as an acquisition by ``session_id`` leaves it."""
    taken = {
        **item,
        schema.LEASE_OWNER: worker_id,
        schema.LEASE_SESSION: session_id,
        schema.OWNER_KEY: schema.owner_key_session(session_id),
        schema.UPDATED_AT_MS: now_ms,
        schema.FENCE_TOKEN: int(item.get(schema.FENCE_TOKEN, 0)) + 1,
    }
    taken.pop(schema.RELEASED_FENCE, None)
    return taken
