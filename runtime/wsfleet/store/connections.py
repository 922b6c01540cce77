"""The connections table: ownership and checkpoints (the workers), with the reads
(:mod:`.connection_reads`), the router's desired state (:mod:`.desired`), the owners'
last_error (:mod:`.last_error`) and the crash-loop breaker's strikes
(:mod:`.quarantine`) as parts of the same store. Every write is conditional (its
condition named in :mod:`.conditions`); a lost race comes back as a value. What a
checkpoint counts (frames, bytes, last_frame_at_ms) is written by :mod:`.counting`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .. import schema
from ..checkpoint import Tally, Uncounted
from ..leases import (
    AcquireFailure,
    acquire_already_landed,
    acquire_refusal,
    release_already_landed,
    released_at_fence,
)
from . import conditions as cond
from .base import TransientError, _names, _Table, marshal, now_ms
from .connection_reads import ConnectionReads
from .counting import CheckpointEntry, Counting, counted_values
from .desired import DesiredState
from .last_error import LastErrors
from .moves import Moves
from .quarantine import Quarantines
from .reservations import SeqReservations

# Checkpoints per TransactWriteItems (DynamoDB takes up to 100). 25 keeps one
# transaction's hold on the embedded emulator's DynamoDB lock to about that of a batch.
MAX_TRANSACTION = 25
# An acquire whose items keep changing between its read and its transaction (a START or
# STOP landing in between, each time) gives up after this many transactions.
ACQUIRE_ROUNDS = 4


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


class Released(enum.Enum):
    """How a release landed; false when it did not."""

    FREE = "free"  # STARTED (a START came meanwhile): in its FREE# partition, for anyone to take now
    HANDED = "handed"  # STARTED, still attached to our session, released at our fence: for the peer we hint
    STOPPED = "stopped"  # STOPPED: out of the owner index
    LOST = "lost"  # no longer ours: nothing written

    def __bool__(self) -> bool:
        return self is not Released.LOST


class ConnectionsStore(
    ConnectionReads, DesiredState, LastErrors, Quarantines, Moves, Counting, SeqReservations, _Table
):
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
        TransactWriteItems, each Update conditional on the version read
        (:func:`~.conditions.acquire_pinned`): the item exists, desired_state is STARTED, ``lease_session`` is the expected session ("" for
        a free one, or an ENDED session whose connections we are taking; or the session
        that handed it off, with ``released_fence`` = ``fence_token``: see
        :func:`~wsfleet.leases.acquire_refusal`), and ``fence_token``, ``ws_url`` and
        ``upstream`` are as read (a STOP then START of a
        free connection changes neither its fence nor, perhaps, its ws_url, but may change
        its upstream: a taker pinned to the old one would open the socket the old way). Session ids are never reused and an
        ENDED session is never renewed, so this pins the exact ownership epoch that was
        read. Each sets ``fence_token`` to the next one, moves ``owner_key`` to our
        session and removes ``released_fence``. The same transaction holds a ConditionCheck that our own session is
        LIVE (:data:`~.conditions.SESSION_LIVE`): no connection is ever attached to a session that has ended (whose watchers
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
        live = cond.SESSION_LIVE
        update = "SET #o = :me, #l = :session, #k = :key, #u = :now, #f = :next REMOVE #rf"
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
            if schema.UPSTREAM in item:
                values[":up"] = item[schema.UPSTREAM]
            condition = cond.acquire_pinned(item, released=released_at_fence(item))
            items.append(self._transact_update(cid, update=update, condition=condition, values=values, return_old=True))
        return items

    def _detach(
        self,
        connection_id: str,
        *,
        condition: str,
        values: Mapping[str, Any],
        last_seq: int | None,
        expect_stopped: bool = False,
        counting: tuple[int, Tally] | None = None,
    ) -> tuple[str | None, dict]:
        """Make the connection free (``owner_key`` FREE#shard if STARTED, removed if
        STOPPED; any ``released_fence`` removed), under ``condition``. The index key depends on the desired state, which
        a concurrent START or STOP may flip: the write names the state it expects, and
        is tried once more with the other one (a failed conditional write is billed, so
        the likelier state goes first). ``last_seq`` (a release's final checkpoint) is
        written only if the stored one is not past it: if it is, the write goes again
        without it. Returns (the desired state of the form that landed, {}), or (None,
        the old item, {} if gone) when the condition failed for another reason.
        ``counting`` (a release's counts, with ``last_seq``: the checkpoint they were
        counted against, and what to add): the write adds them, conditional on that
        checkpoint, and is tried once only."""
        old: dict | None = None
        first, other = (schema.STOPPED, schema.STARTED) if expect_stopped else (schema.STARTED, schema.STOPPED)
        states = [first, other, first]
        while states:
            state = states[0]
            update = "SET #o = :empty, #l = :empty, #u = :now"
            state_values: dict[str, Any] = {":empty": "", ":now": self._now_ms(), ":state": state}
            conditions = [condition, cond.IN_STATE]
            if last_seq is not None:
                # A release: everything was flushed first, so last_seq is where the stored
                # messages end, as of this ownership (fence) -- see checkpoint_is_end().
                update += ", #q = :seq, #ce = :fence"
                state_values[":seq"] = last_seq
                conditions.append(cond.CHECKPOINT_NOT_BEHIND if counting is None else cond.counted_from(counting[0]))
            if counting is not None:
                update += ", #lfa = :lfa"
                state_values.update(counted_values(*counting))
            if state == schema.STARTED:
                update += ", #k = :free REMOVE #rf"
                state_values[":free"] = schema.owner_key_free(connection_id, self._shards)
            else:
                update += " REMOVE #k, #rf"
            update += " ADD #nf :nf, #nb :nb" if counting is not None else ""
            new, old = self._conditional_update(
                connection_id,
                update=update,
                condition=cond.all_of(*conditions),
                values={**values, **state_values},
                returns="NONE",
            )
            if new is not None:
                return state, {}
            if counting is not None:
                return None, old or {}
            if last_seq is not None and cond.checkpoint_behind(old, last_seq):
                # A checkpoint past ours, stored by the owner before us after our acquire
                # read the item: it stays, and this release marks no stored end. (If the
                # item is no longer ours either, the write fails again, for that.)
                last_seq = None
                continue
            states.pop(0)
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
        uncounted: Uncounted | None = None,
    ) -> Released:
        """Give the connection up with a final checkpoint.

        Conditional on: ``lease_session`` is ours and ``fence_token`` is ours
        (:data:`~.conditions.OURS`); ``last_seq`` is written only if the stored
        checkpoint is not past it (:data:`~.conditions.CHECKPOINT_NOT_BEHIND`; if it is,
        it stays, and the release goes without it). Returns how it landed: FREE when a
        START came meanwhile (STARTED: the releaser hints it, as nobody else will),
        STOPPED, or LOST when it was no longer ours (nothing written); a retry whose
        first attempt landed reports the state it finds. ``stopped``: released for a
        STOP, so the STOPPED form of the write goes first.

        ``handoff`` (a SHUTDOWN or a SHED, for a peer its hint names): a STARTED
        connection stays attached to our session, ``owner_key`` unmoved (no write to a
        FREE# partition), marked released at our fence (``released_fence``): HANDED. From
        then on this ownership writes nothing more to it (every write of ours is
        conditional on no such mark) but :meth:`free_released`. A STOPPED one is freed
        as for a STOP. A retry finding it already so reports HANDED.

        ``uncounted``: what ``last_seq`` covers that no checkpoint counted yet. The release's
        write adds it (as :meth:`checkpoint_many` does), tried once in the form expected,
        conditional on the stored checkpoint being ``uncounted.base``. If that fails (the
        checkpoint is another, a START or STOP flipped the state, a retry of one that
        landed), nothing was written: a counting checkpoint goes first, then the release
        as without counts, whose forms and retries add nothing."""
        if uncounted is not None and (counts := uncounted.past(uncounted.base, last_seq)):
            counting = (uncounted.base, counts)
            landed = self._release_counting(connection_id, session_id, fence_token, last_seq, stopped, handoff, counting)
            if landed is not None:
                return landed
            entry = CheckpointEntry(connection_id, session_id, fence_token, last_seq, uncounted)
            self.checkpoint_many([entry])  # not ours any more: the release below finds it so
        if handoff:
            values = {":fence": fence_token, ":now": self._now_ms(), ":session": session_id, ":started": schema.STARTED}
            new, old = self._conditional_update(
                connection_id,
                update="SET #q = :seq, #ce = :fence, #rf = :fence, #u = :now",
                condition=cond.all_of(cond.HANDOFF, cond.CHECKPOINT_NOT_BEHIND),
                values={**values, ":seq": last_seq},
                returns="NONE",
            )
            if new is None and cond.checkpoint_behind(old, last_seq):
                # As in _detach: the stored checkpoint, past ours, stays; no stored end marked.
                new, old = self._conditional_update(
                    connection_id, update="SET #rf = :fence, #u = :now", condition=cond.HANDOFF, values=values, returns="NONE"
                )
            if new is not None:
                return Released.HANDED
            if old is not None and old.get(schema.DESIRED_STATE) == schema.STARTED:
                return Released.HANDED if release_already_landed(old, fence_token, session_id) else Released.LOST
            stopped = True  # a STOP came meanwhile (or it is gone): freed as for a STOP
        return self._free_ours(connection_id, cond.OURS, session_id, fence_token, last_seq, stopped)

    def _release_counting(
        self, cid: str, session_id: str, fence_token: int, last_seq: int, stopped: bool, handoff: bool, counting: tuple[int, Tally]
    ) -> Released | None:
        """:meth:`release` with its counts in its write, once: None when its condition failed."""
        values = {":fence": fence_token, ":session": session_id}
        if not handoff:
            landed, _ = self._detach(
                cid, condition=cond.OURS, values=values, last_seq=last_seq, expect_stopped=stopped, counting=counting
            )
            return None if landed is None else Released.FREE if landed == schema.STARTED else Released.STOPPED
        new, _ = self._conditional_update(
            cid,
            update="SET #q = :seq, #ce = :fence, #rf = :fence, #u = :now, #lfa = :lfa ADD #nf :nf, #nb :nb",
            condition=cond.counted_handoff(counting[0]),
            values={**values, ":now": self._now_ms(), ":seq": last_seq, ":started": schema.STARTED, **counted_values(*counting)},
            returns="NONE",
        )
        return None if new is None else Released.HANDED

    def free_released(self, connection_id: str, *, session_id: str, fence_token: int, stopped: bool = False) -> Released:
        """Free a connection our session handed off and nobody took (the old way: into
        its FREE# partition if STARTED, out of the index if STOPPED), its checkpoint as
        the handoff left it. Conditional on: attached to ``session_id`` and released at
        ``fence_token`` (:data:`~.conditions.OURS`, :data:`~.conditions.RELEASED_AT_FENCE`).
        FREE or STOPPED as it landed (a retry whose first attempt landed too), LOST when
        taken (or freed) by another meanwhile. ``stopped``: for a STOP, so the STOPPED
        form of the write goes first."""
        condition = cond.all_of(cond.OURS, cond.RELEASED_AT_FENCE)
        return self._free_ours(connection_id, condition, session_id, fence_token, None, stopped)

    def _free_ours(
        self, connection_id: str, condition: str, session_id: str, fence_token: int, last_seq: int | None, stopped: bool
    ) -> Released:
        """:meth:`_detach` under ``condition`` (on our session and fence), read as a
        :class:`Released`; a retry whose first attempt landed reports the state it finds."""
        landed, old = self._detach(
            connection_id,
            condition=condition,
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

        Conditional on: ``lease_session`` is the dead session
        (:data:`~.conditions.ATTACHED_TO_DEAD`). Returns False when someone else freed
        or took it first."""
        landed, _ = self._detach(
            connection_id, condition=cond.ATTACHED_TO_DEAD, values={":dead": dead_session}, last_seq=None
        )
        return landed is not None

    def checkpoint(self, connection_id: str, *, session_id: str, fence_token: int, last_seq: int) -> bool:
        """Store ``last_seq`` while holding the connection (no index key moves): a
        :meth:`checkpoint_many` of one. Conditional on: ``lease_session`` and
        ``fence_token`` are ours, and the stored checkpoint not past ``last_seq``
        (:data:`~.conditions.CHECKPOINT`). Returns False if the connection is no longer
        ours; True when written, or when the stored checkpoint is already past it."""
        return self.checkpoint_many([CheckpointEntry(connection_id, session_id, fence_token, last_seq)]) == [True]

    def checkpoint_many(self, entries: Sequence[CheckpointEntry]) -> list[bool | None]:
        """Store several checkpoints in one TransactWriteItems (at most
        :data:`MAX_TRANSACTION` of them), each an Update conditional on its connection's
        session and fence (``lease_session`` and ``fence_token``), on no handoff of it
        (``released_fence`` absent: a handoff's releaser writes nothing after it) and on
        the stored checkpoint not being past it (a checkpoint never goes backwards):
        :data:`~.conditions.CHECKPOINT`. No index key moves.

        A transaction is all or nothing. Per entry, in order: True when written, or when
        refused only because the stored checkpoint is past it (still ours: nothing to
        write); False when the connection is no longer ours; None when it was not
        written only because another entry's connection is no longer ours (write it
        again without that one). Entries refused only as behind do not cost the others:
        those go again at once, without them. Raises :class:`TransientError` when the
        transaction was cancelled for reasons that say nothing about ownership (a
        conflict with another write to one of the items, throttling): the whole group
        may go again. A retry of a transaction that landed writes the same values again
        under conditions that still hold.

        Counting: an entry with an :class:`~wsfleet.checkpoint.Uncounted` adds what lies
        in (stored checkpoint, ``last_seq``] to ``frames`` and ``bytes`` and sets
        ``last_frame_at_ms``, conditional on the stored checkpoint being the one it was
        counted against (:func:`~.conditions.counted_checkpoint`); refused while still
        ours with the stored one behind ``last_seq`` (an owner before us moved it), it
        is counted again against that one and goes again. A retry of a write that landed
        finds its own ``last_seq`` stored: refused as not behind, it adds nothing."""
        if not 0 < len(entries) <= MAX_TRANSACTION:
            raise ValueError(f"a checkpoint transaction holds 1 to {MAX_TRANSACTION} entries, not {len(entries)}")
        answers: list[bool | None] = [None] * len(entries)
        pending = list(range(len(entries)))
        counted_from = [e.uncounted.base for e in entries]  # the stored checkpoint each count is taken against
        while pending:
            now = self._now_ms()
            reasons = self._transact([self._checkpoint_update(entries[i], counted_from[i], now) for i in pending])
            if reasons is None:
                for i in pending:
                    answers[i] = True
                break
            written_again = []
            for i, reason in zip(pending, reasons, strict=True):
                old = reason.get("Item")
                ours = cond.holds(old, entries[i].session_id, entries[i].fence_token)
                stored = int((old or {}).get(schema.LAST_SEQ, 0))
                if reason["Code"] != "ConditionalCheckFailed":
                    written_again.append(i)
                elif ours and stored < entries[i].last_seq:
                    counted_from[i] = stored  # counted against another checkpoint than the one stored
                    written_again.append(i)
                else:
                    # Still held: HOLDING passed, so only the stored checkpoint, past this one, refused it.
                    answers[i] = ours
            if any(answers[i] is False for i in pending):
                break  # a connection no longer ours: the others stay None, for the caller to send again
            pending = written_again
        return answers


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
