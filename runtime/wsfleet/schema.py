"""The shape of the data: the one source of truth for tables, index and queue messages.

The CDK stacks, the runtime and the embedded backend all build their tables from
these names, so the three cannot drift. Nothing here does I/O.
"""

from __future__ import annotations

import zlib
from typing import Any

# --- connections (lease) table ------------------------------------------------
PK = "pk"
CONNECTION_PREFIX = "CONN#"

DESIRED_STATE = "desired_state"
WS_URL = "ws_url"
LAST_SEQ = "last_seq"
LEASE_OWNER = "lease_owner"
LEASE_EXPIRES_AT_MS = "lease_expires_at_ms"
FENCE_TOKEN = "fence_token"
UPDATED_AT_MS = "updated_at_ms"
CREATED_AT_MS = "created_at_ms"

STARTED = "STARTED"
STOPPED = "STOPPED"

# Sparse, sharded index of STARTED connections ordered by lease expiry: the
# reconciler's way to find orphans without a scan.
GSI_NAME = "by_state_expiry"
GSI_PK = "gsi_state"
GSI_SK = LEASE_EXPIRES_AT_MS
DEFAULT_STATE_SHARDS = 4
MAX_STATE_SHARDS = 256

# --- messages table -----------------------------------------------------------
MSG_PK = "pk"
MSG_SK = "sk"  # upstream seq
MESSAGE_DATA = "message_data"
MSG_FENCE_TOKEN = "fence_token"
MSG_WORKER_ID = "worker_id"
RECEIVED_AT_MS = "received_at_ms"
MESSAGE_TTL_ATTRIBUTE = "expires_at"  # epoch seconds; only written when a TTL is configured

# The public fields returned by GET /connections/{id}.
PUBLIC_FIELDS = (
    DESIRED_STATE,
    WS_URL,
    LEASE_OWNER,
    LEASE_EXPIRES_AT_MS,
    FENCE_TOKEN,
    LAST_SEQ,
    UPDATED_AT_MS,
)

# --- queue --------------------------------------------------------------------
# SQS message body of a START hint: {"connection_id": "..."}
HINT_CONNECTION_ID = "connection_id"


def connection_pk(connection_id: str) -> str:
    return CONNECTION_PREFIX + connection_id


def connection_id_from_pk(pk: str) -> str:
    if not pk.startswith(CONNECTION_PREFIX):
        raise ValueError(f"not a connection key: {pk!r}")
    return pk[len(CONNECTION_PREFIX) :]


def shard_for(connection_id: str, shards: int) -> int:
    """Stable shard of a connection: crc32, so every process and language agrees."""
    return zlib.crc32(connection_id.encode("utf-8")) % shards


def gsi_partition(shard: int) -> str:
    """The index partition key of one shard."""
    return f"{STARTED}#{shard}"


def gsi_state(connection_id: str, shards: int) -> str:
    return gsi_partition(shard_for(connection_id, shards))


def connections_table_spec(table_name: str) -> dict[str, Any]:
    """CreateTable arguments for the connections table (on-demand)."""
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": PK, "AttributeType": "S"},
            {"AttributeName": GSI_PK, "AttributeType": "S"},
            {"AttributeName": GSI_SK, "AttributeType": "N"},
        ],
        "KeySchema": [{"AttributeName": PK, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": GSI_NAME,
                "KeySchema": [
                    {"AttributeName": GSI_PK, "KeyType": "HASH"},
                    {"AttributeName": GSI_SK, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
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
        ],
        "KeySchema": [
            {"AttributeName": MSG_PK, "KeyType": "HASH"},
            {"AttributeName": MSG_SK, "KeyType": "RANGE"},
        ],
    }
