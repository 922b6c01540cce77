"""The shape of the data: the one source of truth for tables, index and queue messages.

The CDK stacks, the runtime and the embedded backend all build their tables from
these names, so the three cannot drift. Nothing here does I/O.
"""

from __future__ import annotations

import zlib
from typing import Any

# --- connections table -----------------------------------------------------------
PK = "pk"
CONNECTION_PREFIX = "CONN#"

DESIRED_STATE = "desired_state"
WS_URL = "ws_url"
LAST_SEQ = "last_seq"
# Set by a release (its last_seq is where the stored messages end: everything was flushed
# first), removed by the next acquisition: a new owner finding it skips the stored-end read.
CHECKPOINT_IS_END = "checkpoint_is_end"
# Set by a graceful handoff (a SHUTDOWN or SHED release) to the fence it released at,
# the connection staying attached to the releasing session (no owner_key move): from
# then on that ownership writes nothing more, and any worker may take it, conditional
# on that session, that fence and this mark (leases.released_at_fence). Removed by the
# next acquisition and by a free.
RELEASED_FENCE = "released_fence"
LEASE_OWNER = "lease_owner"  # the owning worker_id, "" when free
LEASE_SESSION = "lease_session"  # the owning session_id, "" when free
FENCE_TOKEN = "fence_token"
OWNER_KEY = "owner_key"  # by_owner partition key, see owner_key_*()
UPDATED_AT_MS = "updated_at_ms"
CREATED_AT_MS = "created_at_ms"
# The START's upstream object (wsfleet.upstream_spec.Upstream.item(): non-default keys,
# secret ARNs only, never values); absent for the default protocol.
UPSTREAM = "upstream"
# Why the owner cannot connect (a handshake refused after re-fetching its secrets, a
# secret it cannot read, ...), with no secret in it, and since when; removed by the owner
# once a frame is accepted again. Written conditional on session and fence.
LAST_ERROR = "last_error"
LAST_ERROR_AT_MS = "last_error_at_ms"
# What the connection stored, as the checkpoint covering it counted it (wsfleet.checkpoint.Tally):
# data frames, their data's bytes, the newest one's received time. Absent before the first.
LAST_FRAME_AT_MS = "last_frame_at_ms"
FRAMES = "frames"
BYTES = "bytes"
COUNTS = (FRAMES, BYTES, LAST_FRAME_AT_MS)  # GET shows 0 for an absent one
# The crash-loop breaker (wsfleet.crash_loop): strikes against a connection, each the death
# of an owner whose session named it as its prime suspect, and the quarantine they lead to.
STRIKES = "strikes"  # strikes in the current run of consecutive ones
STRIKES_SINCE_MS = "strikes_since_ms"  # when the run's first strike was counted
STRIKE_FENCE = "strike_fence"  # the ownership (fence) the newest strike was for: each counts once
QUARANTINED = "quarantined"  # {"reason", "at_ms"}: not taken again until a new START
# An assigned-seq feed (upstream ``seq: assigned``): the highest seq any owner may have
# numbered a frame with. An owner writes it (conditional on its session and fence) before
# it numbers past it, so a new owner after a crash numbers after it: a late write of a
# frozen former owner can only land at a seq below, one no later owner ever uses.
SEQ_RESERVED = "seq_reserved"

STARTED = "STARTED"
STOPPED = "STOPPED"

# Sparse index of who owns what: S#<session> while owned, FREE#<shard> while STARTED
# and unowned, absent while STOPPED and unowned. Its key moves only at acquire,
# release, START and STOP, never at a heartbeat.
OWNER_INDEX = "by_owner"
OWNER_KEY_SESSION_PREFIX = "S#"
OWNER_KEY_FREE_PREFIX = "FREE#"
DEFAULT_STATE_SHARDS = 4
MAX_STATE_SHARDS = 256

# --- sessions table ---------------------------------------------------------------
SESSION_ID = "session_id"
SESSION_WORKER_ID = "worker_id"
SESSION_STATE = "state"
EXPIRES_AT_MS = "expires_at_ms"
HEARTBEAT_AT_MS = "heartbeat_at_ms"
STARTED_AT_MS = "started_at_ms"
ACTIVE = "active"
MAX_CONNECTIONS = "max_connections"
ENDED_BY = "ended_by"
SESSION_TTL = "ttl"  # epoch seconds, DynamoDB TTL of ended sessions
# The X-Ray trace header of the end_session span that ended a dead session, written by the
# conditional write that ends it: whoever drains it later continues that trace.
END_TRACE = "end_trace"
# The worker's prime suspect, written by each renewal (absent: nothing remarkable):
# {"connection_id", "fence_token", "why"} (wsfleet.crash_loop.Suspect).
SUSPECT = "suspect"
# Connections whose STOP the router posted to the owning session: the renewal returns
# them, so a STOP reaches its owner at its next heartbeat without a per-connection read.
STOP_INBOX = "stops"
# Connections moved to this session by another worker (a shed, a dead session's drain):
# one conditional write attached each here (``<connection_id>#<fence>``, the fence the move
# gave it); the renewal returns them, and the worker picks them up, as it does its STOPs.
ASSIGNED = "assigned"
# At most this many assignments wait in one session item; a move to a session whose inbox
# is full is refused like one to an ENDED session, and goes the anonymous way. The bound is
# the item's partition, not its 400 KB: every move is a transaction that writes the whole
# item (twice its size in KB), and the item grows with each entry (up to ~140 bytes at
# the longest connection id) until the owner's next renewal empties it, so filling an
# inbox of N costs about N^2 write units. 48 keep a fill near 500 units, and the one or
# two a second may see (one each side of a renewal) inside the partition's 1,000: a
# target named by many movers at once (a join's newcomer, a crash's survivor) is not
# written past its limit (wsfleet.plan.bursts.inbox_fill_units). What it is sent beyond
# them it takes from the hints.
ASSIGNED_MAX = 48

LIVE = "LIVE"
ENDED = "ENDED"
# Bumped by a session that joins the ring right after this one: its watchers learn from
# their next renewal that their successors changed, instead of at their next ring read.
RING_CHANGES = "ring_changes"
# Set by a renewal while its worker shuts down: it takes nothing more, and its
# connections count as load to spread, not as capacity.
DRAINING = "draining"
# Set by an operator (``wsfleet drain``: one write, conditional on LIVE) to ask the worker
# to leave: {"by": who asked, "at_ms": when}. Its renewal returns it, and the worker leaves
# as on SIGTERM (every connection handed over, its session ended, exit 0). Never cleared:
# the session ends. Not projected in the ring.
DRAIN_REQUESTED = "drain_requested"
DRAIN_BY = "by"
DRAIN_AT_MS = "at_ms"

# The fleet's load in one item of the sessions table (never in the ring, so that writing
# it writes no index): written by the last session of the ring from one paged read of
# the ring when its figures change (and at least every 30 s, so that a stale one shows),
# read by every worker with its watch reads, so each knows its exact target without
# reading every session.
FLEET_SUMMARY_ID = "#fleet"
FLEET_WORKERS = "workers"  # LIVE sessions taking connections (not draining)
FLEET_ACTIVE = "active"  # connections held by all LIVE sessions
FLEET_CAPACITY = "capacity"  # sum of max_connections of the workers taking connections
FLEET_BELOW_SHARE = "below_share"  # connections the workers under their fair share could take
FLEET_UNDER = "under"  # {session_id: connections below its share}, the largest few
FLEET_OVER = "over"  # {session_id: connections above its share}, the largest few
FLEET_SUSPECTS = "suspects"  # sessions expired or ended and not yet drained: recovering
FLEET_AT_MS = "summarized_at_ms"
# The cut of the largest remainders (wsfleet.balance.exact_targets): with it each worker
# knows its exact target without the summary listing every worker.
FLEET_CUT_REM = "cut_rem"  # active * max_connections % capacity of the last worker given one more
FLEET_CUT_ID = "cut_id"  # ... and its session id
# What a drain plans from (wsfleet.balance.drain_targets), so that it never reads the ring:
FLEET_LOADS = "loads"  # {session_id: [held, max_connections]} of every taker, in a small fleet
FLEET_DEAD = "dead"  # {session_id: connections it last reported} of the sessions being recovered

# Sparse index of the sessions still to be watched (LIVE ones, and ENDED ones whose
# connections are not all taken yet), ordered by session id: a worker watches its next
# few successors in this ring, so watching costs O(workers), not O(workers squared).
# Its key is set at open and removed when the session is ended and drained: never at
# a heartbeat. It projects what the fleet summary needs (RING_PROJECTED), so one paged
# Query of the ring gives the summarizer every session's load; never an attribute that
# changes at every renewal (expires_at_ms, heartbeat_at_ms): a renewal writes to the
# index only when the worker's load or state changed. Named anew when its projection
# changed (CloudFormation cannot change a GSI's projection in place): it was "by_ring",
# KEYS_ONLY.
RING_INDEX = "by_ring_load"
RING = "ring"
RING_VALUE = "RING"
RING_PROJECTED = [SESSION_STATE, ACTIVE, MAX_CONNECTIONS, DRAINING]
ENDED_SESSION_TTL_S = 7 * 86400  # kept a week for post-mortems, then DynamoDB deletes it

# --- messages table -----------------------------------------------------------
MSG_PK = "pk"
MSG_SK = "sk"  # upstream seq
MESSAGE_DATA = "message_data"
MSG_FENCE_TOKEN = "fence_token"
MSG_WORKER_ID = "worker_id"
RECEIVED_AT_MS = "received_at_ms"
# A skip marker: an item with no data that stands for a seq whose frame could not be
# stored, so that the stored seqs stay gap-free (CONTRACT.md section 4).
SKIPPED = "skipped"  # why: one of the SKIPPED_* reasons
DATA_BYTES = "data_bytes"  # how large the skipped data was, where known
SKIPPED_MALFORMED = "malformed"  # a frame the parser could read a seq from, but not its data
SKIPPED_OVER_FRAME_LIMIT = "over_frame_limit"  # a frame over MAX_FRAME_BYTES, after a bounded number of tries
SKIPPED_UPSTREAM_GAP = "upstream_gap"  # seqs the upstream skipped (a range: see SKIP_TO)
# An assigned-seq feed was (re)connected or taken over: frames the upstream sent in
# between may have been missed (it cannot replay them).
SKIPPED_RECONNECT = "reconnect"
SKIPPED_REASONS = (SKIPPED_MALFORMED, SKIPPED_OVER_FRAME_LIMIT, SKIPPED_UPSTREAM_GAP, SKIPPED_RECONNECT)
# A binary feed's item (upstream ``format: binary``): MESSAGE_DATA (or the object) holds
# the frame's bytes in base64, as a JSON string; the read API shows ``data_base64``.
DATA_FORMAT = "data_format"
DATA_FORMAT_BINARY = "binary"
# An upstream_gap marker stands for the seqs from its own (sk) to this one, inclusive;
# every other marker stands for its own seq only.
SKIP_TO = "skip_to"
# Data too large for an item: stored as an S3 object (written before the item), the item
# holds where, how large and its SHA-256 (hex) instead of MESSAGE_DATA.
DATA_REF = "data_ref"  # s3://<bucket>/<key>
DATA_SHA256 = "data_sha256"
# Sparse GSI of the messages table: only skip markers have its sort key (SKIPPED), so a
# Query of one connection's partition counts its markers without reading its messages.
MARKERS_INDEX = "markers"
# Objects of large data: under this prefix (the worker's S3 grant is limited to it), one
# object per (connection, seq); a replay rewrites the same key.
MESSAGE_OBJECTS_PREFIX = "messages/"
MESSAGE_TTL_ATTRIBUTE = "expires_at"  # epoch seconds; only written when a TTL is configured

# --- where frames go (SINK) -----------------------------------------------------
# SINK is a comma-separated set of these: the messages table (readable through the
# API), a Kinesis stream (MESSAGES_STREAM_NAME: one record per frame, wsfleet.records,
# a connection's records of one flush packed into one aggregated Kinesis record,
# wsfleet.aggregation), a Firehose delivery stream (MESSAGES_DELIVERY_STREAM_NAME: the
# # same records as JSON lines, into S3 for Athena; wsfleet.sinks.firehose), or several.
# With a stream among them a new owner resumes from the checkpoint (a stream's tail
# cannot be read cheaply): delivery is at least once (CONTRACT.md section 4).
SINK_DYNAMODB = "dynamodb"
SINK_KINESIS = "kinesis"
SINK_FIREHOSE = "firehose"
SINKS = (SINK_DYNAMODB, SINK_KINESIS, SINK_FIREHOSE)
DEFAULT_SINKS = (SINK_DYNAMODB,)

# --- the reference consumer's table (wsfleet.consumer) ----------------------------
# One item per connection: what the consumer has delivered downstream, so that each
# (connection, seq) is delivered once whatever the stream delivers again.
CONSUMER_CONNECTION_ID = "connection_id"  # partition key (S)
DELIVERED_FROM = "delivered_from"  # the first seq of the contiguous run delivered
DELIVERED_TO = "delivered_to"  # its last: every seq from delivered_from to here is delivered
DELIVERED_ABOVE = "above"  # [[from, to], ...]: the few ranges delivered past a hole above it
CONSUMER_FENCE = "fence_token"  # the highest fence seen: a record below it is a stale owner's
# The last seq delivered when that fence was first seen: a same-fence duplicate at or
# below it is a takeover's replay, above it a resend.
FENCE_SEEN_AT = "fence_seen_at"
CONSUMER_REVISION = "revision"  # +1 at every write; an object's name, and each write's condition
CONSUMER_UPDATED_AT_MS = "updated_at_ms"


def consumer_table_spec(table_name: str) -> dict[str, Any]:
    """CreateTable arguments for the reference consumer's delivery state (on-demand)."""
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": CONSUMER_CONNECTION_ID, "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": CONSUMER_CONNECTION_ID, "KeyType": "HASH"}],
    }



def message_object_key(connection_id: str, seq: int) -> str:
    """The S3 key of a (connection, seq)'s large data: zero-padded so keys list in seq order."""
    return f"{MESSAGE_OBJECTS_PREFIX}{connection_id}/{seq:020d}"


def data_ref(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def parse_data_ref(ref: str) -> tuple[str, str]:
    """(bucket, key) of a DATA_REF; ValueError if it is not an s3:// reference."""
    if not ref.startswith("s3://") or "/" not in ref[5:]:
        raise ValueError(f"not an s3:// reference: {ref!r}")
    bucket, key = ref[5:].split("/", 1)
    return bucket, key


# The public fields returned by GET /connections/{id}.
# lease_expires_at_ms is not stored on the connection: it is its session's expiry.
LEASE_EXPIRES_AT_MS = "lease_expires_at_ms"
SKIPPED_COUNT = "skipped"  # nor is this: the count of its skip markers (MARKERS_INDEX)
PUBLIC_FIELDS = (
    DESIRED_STATE,
    WS_URL,
    LEASE_OWNER,
    LEASE_EXPIRES_AT_MS,
    FENCE_TOKEN,
    LAST_SEQ,
    UPDATED_AT_MS,
    SKIPPED_COUNT,
    UPSTREAM,
    LAST_ERROR,
    LAST_ERROR_AT_MS,
    LAST_FRAME_AT_MS,
    FRAMES,
    BYTES,
)

# --- queue --------------------------------------------------------------------
# SQS message body of a START hint: {"connection_id": "..."}; a hint for a connection a
# worker shed to rebalance also names that worker's session: {"...", "shed_by": "..."}.
HINT_CONNECTION_ID = "connection_id"
HINT_SHED_BY = "shed_by"
HINT_FROM_SESSION = "from_session"  # an ENDED session the connection is still attached to
# A clean release's hint: the state it left the connection in (its fence, ws_url,
# last_seq and upstream), so that the taker's acquire, pinned to that state, needs no
# read first.
HINT_RELEASED = "released"
# The SQS system attribute a hint carries the sender's trace in (an X-Ray trace header),
# and that the taker's receive asks for.
HINT_TRACE_HEADER = "AWSTraceHeader"
# The START queue moves a hint received this many times without a delete to its
# dead-letter queue (the stack's redrive policy, and the local emulator's).
MAX_HINT_RECEIVES = 5


def hint_trace_attributes(trace_header: str | None) -> dict:
    """SendMessage's (or a batch entry's) arguments carrying ``trace_header`` as the
    hint's ``AWSTraceHeader`` system attribute; none without one."""
    if not trace_header:
        return {}
    return {"MessageSystemAttributes": {HINT_TRACE_HEADER: {"StringValue": trace_header, "DataType": "String"}}}


def released_state(
    fence_token: int,
    ws_url: str,
    last_seq: int,
    upstream: Any = None,
    last_error: str | None = None,
    *,
    session_id: str = "",
) -> dict[str, Any]:
    """A hint's ``released``: what a clean release wrote (its fence, which it marks as
    the stored end), the ws_url it was running, its upstream item (absent for the
    default protocol) and its last_error as the releaser knew it (absent: none), which
    the taker removes once it connects. ``session_id``: a handoff's, the releasing
    session it stays attached to (released at its fence); absent: released free."""
    out: dict[str, Any] = {FENCE_TOKEN: fence_token, WS_URL: ws_url, LAST_SEQ: last_seq}
    if session_id:
        out[LEASE_SESSION] = session_id
    if upstream:
        out[UPSTREAM] = dict(upstream)
    if last_error is not None:
        out[LAST_ERROR] = last_error
    return out


def item_from_released(connection_id: str, released: Any) -> dict[str, Any] | None:
    """The connection item as the clean release a hint describes left it (free, or
    attached to the releasing session and released at its fence; STARTED, checkpointed
    at the stored end), or None if ``released`` is not one. An acquisition pinned to it
    (``ConnectionsStore.acquire_many``: fence, ws_url, upstream, session, release mark,
    STARTED) lands only if the item is still that; while so, nothing else moves its
    checkpoint."""
    if not isinstance(released, dict):
        return None
    fence, url, last_seq = released.get(FENCE_TOKEN), released.get(WS_URL), released.get(LAST_SEQ)
    if not (type(fence) is int and type(last_seq) is int and isinstance(url, str) and fence >= 0 and last_seq >= 0):
        return None
    upstream = released.get(UPSTREAM)
    if upstream is not None and not (isinstance(upstream, dict) and upstream):
        return None
    session = released.get(LEASE_SESSION, "")
    if not isinstance(session, str):
        return None
    item = {
        PK: connection_pk(connection_id),
        DESIRED_STATE: STARTED,
        WS_URL: url,
        LAST_SEQ: last_seq,
        FENCE_TOKEN: fence,
        CHECKPOINT_IS_END: fence,
        LEASE_OWNER: "",
        LEASE_SESSION: session,
    }
    if session:
        item[RELEASED_FENCE] = fence
    if upstream is not None:
        item[UPSTREAM] = upstream
    if isinstance(released.get(LAST_ERROR), str):
        item[LAST_ERROR] = released[LAST_ERROR]
    return item


def connection_pk(connection_id: str) -> str:
    return CONNECTION_PREFIX + connection_id


def connection_id_from_pk(pk: str) -> str:
    if not pk.startswith(CONNECTION_PREFIX):
        raise ValueError(f"not a connection key: {pk!r}")
    return pk[len(CONNECTION_PREFIX) :]


def shard_for(connection_id: str, shards: int) -> int:
    """Stable shard of a connection: crc32, so every process and language agrees."""
    return zlib.crc32(connection_id.encode("utf-8")) % shards


def stop_entry(connection_id: str, fence_token: int) -> str:
    """A STOP in a session's inbox: for one ownership of the connection (its fence), so
    that a second STOP after a restart is a new entry, not one already acknowledged.
    Connection ids never contain '#'."""
    return f"{connection_id}#{fence_token}"


def assigned_entry(connection_id: str, fence_token: int) -> str:
    """An assignment in a session's inbox: the connection and the fence its move gave it."""
    return stop_entry(connection_id, fence_token)


def parse_stop_entry(entry: str) -> tuple[str, int]:
    connection_id, _, fence = entry.rpartition("#")
    return connection_id, int(fence) if fence.isdigit() else -1


def owner_key_free(connection_id: str, shards: int) -> str:
    """The by_owner partition of a STARTED connection that nobody owns."""
    return free_partition(shard_for(connection_id, shards))


def free_partition(shard: int) -> str:
    return f"{OWNER_KEY_FREE_PREFIX}{shard}"


def owner_key_session(session_id: str) -> str:
    """The by_owner partition of every connection attached to one session."""
    return OWNER_KEY_SESSION_PREFIX + session_id


def connections_table_spec(table_name: str) -> dict[str, Any]:
    """CreateTable arguments for the connections table (on-demand)."""
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": PK, "AttributeType": "S"},
            {"AttributeName": OWNER_KEY, "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": PK, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": OWNER_INDEX,
                "KeySchema": [{"AttributeName": OWNER_KEY, "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": [DESIRED_STATE]},
            }
        ],
    }


def sessions_table_spec(table_name: str) -> dict[str, Any]:
    """CreateTable arguments for the worker sessions table (on-demand; TTL on ``ttl``
    is set separately, UpdateTimeToLive)."""
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": SESSION_ID, "AttributeType": "S"},
            {"AttributeName": RING, "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": SESSION_ID, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": RING_INDEX,
                "KeySchema": _key_schema(RING, SESSION_ID),
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(RING_PROJECTED)},
            }
        ],
    }


def messages_table_spec(table_name: str) -> dict[str, Any]:
    """CreateTable arguments for the messages table (on-demand)."""
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": MSG_PK, "AttributeType": "S"},
            {"AttributeName": MSG_SK, "AttributeType": "N"},
            {"AttributeName": SKIPPED, "AttributeType": "S"},
        ],
        "KeySchema": _key_schema(MSG_PK, MSG_SK),
        "GlobalSecondaryIndexes": [_keys_only_index(MARKERS_INDEX, MSG_PK, SKIPPED)],
    }


def _key_schema(hash_key: str, range_key: str) -> list[dict[str, str]]:
    return [{"AttributeName": hash_key, "KeyType": "HASH"}, {"AttributeName": range_key, "KeyType": "RANGE"}]


def _keys_only_index(name: str, hash_key: str, range_key: str) -> dict[str, Any]:
    """A GSI that projects the keys only: it holds nothing its items do not key on."""
    keys = _key_schema(hash_key, range_key)
    return {"IndexName": name, "KeySchema": keys, "Projection": {"ProjectionType": "KEYS_ONLY"}}
