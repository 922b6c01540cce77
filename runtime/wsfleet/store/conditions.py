"""Every condition the lease tables' writes are made under, and the key conditions of
their queries, named once.

Each write condition says what it guards (the precondition) and what its failure means
(a lost race, a write already done, ...). The placeholders are those of
:data:`wsfleet.store.base._PLACEHOLDERS` (``#l`` lease_session, ``#f`` fence_token, ...);
the values (``:session``, ``:fence``, ...) are the caller's. What a failure returns or
raises is the writer's docstring's to say.
"""

from __future__ import annotations

from typing import Any, Mapping

from .. import schema


def all_of(*conditions: str) -> str:
    """Conditions joined with AND (each one either atomic or parenthesised)."""
    return " AND ".join(conditions)


# --- the sessions table ----------------------------------------------------------------

# open: no session with this id. Fails when it exists: a retry of a put that landed (its
# own worker's item) or, never by design, a reused id.
SESSION_IS_NEW = "attribute_not_exists(#sid)"

# Most session writes (end_own, rejoin_ring, announce, a STOP notice, the acquirer's own
# check): the session is LIVE (``:live``). Fails when it is ENDED (or gone): nothing to
# renew, announce or post to, and nothing may be attached to it.
SESSION_LIVE = "#st = :live"

# leave_ring: the session is ENDED (``:ended``). Fails when it is LIVE: a LIVE session is
# never dropped from watching.
SESSION_ENDED = "#st = :ended"

# renew: LIVE, and its stored expiry not past the new one (``:exp``). Fails when ENDED
# (the lease is lost), or when a later renewal of ours landed first (a slow one never
# moves the expiry back).
SESSION_RENEWABLE = all_of(SESSION_LIVE, "#e <= :exp")

# end_expired: LIVE, and expired by more than the clock-skew margin (``:cutoff``).
# Fails when it was renewed after all, or another watcher ended it first.
SESSION_EXPIRED = all_of(SESSION_LIVE, "#e < :cutoff")


# --- the connections table: the owner's writes -----------------------------------------

# Held by this ownership: attached to its session (``:session``) at its fence
# (``:fence``), and not handed off since (a handoff's releaser writes nothing after it).
# Fails when the connection changed hands, was freed or handed off: no longer ours.
HOLDING = "#l = :session AND #f = :fence AND attribute_not_exists(#rf)"

# The stored checkpoint is not past the new one (``:seq``): a checkpoint never goes
# backwards (the same one again lands: a retry). Fails when the stored one is already
# past it: nothing to write.
CHECKPOINT_NOT_BEHIND = "(attribute_not_exists(#q) OR #q <= :seq)"

# A checkpoint (checkpoint_many): HOLDING, and not behind the stored one.
CHECKPOINT = all_of(HOLDING, CHECKPOINT_NOT_BEHIND)

# A checkpoint that counts what it covers (checkpoint_many with an Uncounted): HOLDING,
# and the stored checkpoint is exactly the one its counts were taken against
# (``:from``; an absent one reads as 0). Fails when no longer ours, or when the stored
# checkpoint is another: a retry of a write that landed finds its own (nothing left to
# count), an owner before us moved it (counted what it stored): taken again against it.
def counted_checkpoint(from_seq: int) -> str:
    return all_of(HOLDING, counted_from(from_seq))


def counted_from(from_seq: int) -> str:
    """The stored checkpoint is ``:from`` (``from_seq``), the one counts were taken against."""
    return "(attribute_not_exists(#q) OR #q = :from)" if from_seq == 0 else "#q = :from"


# note_error: HOLDING, and last_error is not already ``:text``. Fails when no longer
# ours, or when the same error is stored already (its time says when it began).
NEW_ERROR = all_of(HOLDING, "(attribute_not_exists(#le) OR #le <> :text)")

# clear_error: HOLDING, and there is a last_error to remove. Fails when no longer ours,
# or when there is none (already cleared).
STORED_ERROR = all_of(HOLDING, "attribute_exists(#le)")

# A release or free by this ownership: attached to its session and fence (a handed-off
# one too: free_released adds RELEASED_AT_FENCE). Fails when no longer ours, or when a
# retry finds its first attempt landed (then the item says so: leases.release_already_landed).
OURS = "#l = :session AND #f = :fence"

# free_released: the connection is marked released at our fence (a handoff nobody took).
# Fails when a taker took it (and removed the mark) or it was freed.
RELEASED_AT_FENCE = "#rf = :fence"

# A handoff (release with handoff): ours and still STARTED (``:started``). Fails when no
# longer ours, already handed off by a retry that landed, or STOPPED meanwhile.
HANDOFF = all_of(OURS, "#s = :started")

# A handoff that counts what its checkpoint covers: HOLDING (not handed off already: a
# retry that landed adds nothing), STARTED, and the stored checkpoint is the one counted
# against (:func:`counted_from`). Fails for any of those: the release goes the long way.
def counted_handoff(from_seq: int) -> str:
    return all_of(HOLDING, "#s = :started", counted_from(from_seq))

# free_orphan: attached to the ENDED session ``:dead``. Fails when someone else freed or
# took it first.
ATTACHED_TO_DEAD = "#l = :dead"

# A detach (every release and free) names the desired state (``:state``) it expects, as
# the index key it writes depends on it. Fails when a START or STOP flipped it: the
# write goes again in the other form.
IN_STATE = "#s = :state"


def acquire_pinned(item: Mapping[str, Any], *, released: bool) -> str:
    """An acquire's Update: the connection exists, is STARTED (``:started``), and is still
    the version read: the session it is attached to (``:holder``), its fence
    (``:fence``), ws_url (``:url``), upstream (``:up``, or its absence: the default
    protocol; DynamoDB's = compares maps whole) and, ``released``, its release mark at
    that fence. Fails when anything of these changed since the read (another acquirer
    won, a STOP, a STOP then START with another upstream): the cancellation's item is
    judged again."""
    upstream = "#up = :up" if schema.UPSTREAM in item else "attribute_not_exists(#up)"
    pinned = ["attribute_exists(#pk)", "#s = :started", NOT_QUARANTINED, "#l = :holder", "#f = :fence", "#w = :url"]
    return all_of(*pinned, *(["#rf = :fence"] if released else []), upstream)


# --- a move: the connection and its target session, in one transaction -----------------
# The target session may be given connections: LIVE (``:live``), not leaving
# (``:false``), and fewer than ``:cap`` assignments waiting in its inbox. Fails when it
# ended, is shutting down, or its inbox is full: nothing moves, and the mover gives the
# connection to anyone instead.
SESSION_ASSIGNABLE = all_of(
    SESSION_LIVE, "(attribute_not_exists(#dr) OR #dr = :false)", "(attribute_not_exists(#as) OR size(#as) < :cap)"
)


def movable(*, released: bool) -> str:
    """A move's Update of the connection: STARTED (``:started``), not quarantined,
    attached to the source session (``:from``) at the fence read (``:fence``) and,
    ``released``, marked released at that fence (a handoff of the mover's own). Fails when
    any of these changed since the read (taken, stopped, quarantined, moved by another
    drainer), or when a retry finds its own first attempt landed: the item then says
    which (:func:`wsfleet.leases.move_already_landed`)."""
    pinned = ["#s = :started", NOT_QUARANTINED, "#l = :from", "#f = :fence"]
    return all_of(*pinned, *(["#rf = :fence"] if released else []))


# --- the connections table: the crash-loop breaker (wsfleet.crash_loop) ----------------

# Every acquisition: the connection is not quarantined. Fails when the breaker set it
# aside: nobody takes it until a new START removes the mark.
NOT_QUARANTINED = "attribute_not_exists(#qt)"


def strike_pinned(item: Mapping[str, Any]) -> str:
    """A strike (``strike``): still STARTED (``:started``), not quarantined, attached to
    the session read (``:holder``) at the fence read (``:fence``), and its newest strike
    the one read (``:last``, or none). Fails when any of these changed since the read (a
    takeover, a STOP, another strike, a retry of ours that landed): the item is read and
    judged again."""
    last = "#sf = :last" if schema.STRIKE_FENCE in item else "attribute_not_exists(#sf)"
    return all_of("#s = :started", NOT_QUARANTINED, "#l = :holder", "#f = :fence", last)


# set_aside: quarantined, and still attached to the session read (``:holder``; "" when
# free). Fails when a START cleared the mark, or another set it aside (or took it) first.
SET_ASIDE = all_of("attribute_exists(#qt)", "#l = :holder")

# START of a quarantined STARTED connection (the same ws_url and upstream): still
# quarantined and attached to the session read (``:session``). Fails when it changed
# since the read: the next put reads it again.
QUARANTINE_CLEARABLE = all_of("#s = :started", "attribute_exists(#qt)", "#l = :session")


# --- the connections table: the router's writes ----------------------------------------

# START of a new connection (a put): no item with this key. Fails when it exists: the
# outcome is read from the item it lost to (UNCHANGED, CONFLICT, or a restart).
CONNECTION_IS_NEW = "attribute_not_exists(#pk)"

# START of a STOPPED connection: still STOPPED (``:stopped``) and attached to the session
# read (``:session``). Fails when it changed since the read: the next put reads it again.
RESTARTABLE = "#s = :stopped AND #l = :session"

# STOP: exists, STARTED, attached to the session and fence read. Fails when it changed
# since the read (a STOP, a takeover): the outcome is read from the item it lost to.
STOPPABLE = "attribute_exists(#pk) AND #s = :started AND #l = :session AND #f = :fence"

# DELETE: a STOPPED connection that no session holds any more (its owner released it):
# nobody can be writing its checkpoint, and no taker reads it (it is in no partition).
DELETABLE = "#s = :stopped AND #l = :free"


# --- key conditions of the queries (what they read, not what they guard) ---------------

OWNER_PARTITION = "#k = :k"  # one partition of by_owner: a session's, or a FREE# shard
RING = "#r = :r"  # the whole watch ring (by_ring_load)
RING_AFTER = "#r = :r AND #sid > :me"  # the ring's sessions after ``:me``, in id order
RING_BEFORE = "#r = :r AND #sid < :me"  # and before it


def holds(item: Mapping[str, Any] | None, session_id: str, fence_token: int) -> bool:
    """:data:`HOLDING`, read from an item (as a failed condition returns it): still held
    by this ownership."""
    return (
        item is not None
        and item.get(schema.LEASE_SESSION) == session_id
        and int(item.get(schema.FENCE_TOKEN, -1)) == fence_token
        and schema.RELEASED_FENCE not in item
    )


def checkpoint_behind(item: Mapping[str, Any] | None, last_seq: int) -> bool:
    """What :data:`CHECKPOINT_NOT_BEHIND` refuses, read from an item: its stored
    checkpoint is past ``last_seq``."""
    return item is not None and schema.LAST_SEQ in item and int(item[schema.LAST_SEQ]) > last_seq
