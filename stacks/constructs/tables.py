"""The three tables: connections (with the ``by_owner`` index of who owns what), worker
sessions (with the ``by_ring_load`` watch index), and messages.

Keys, index and billing mode are read from ``wsfleet.schema``'s CreateTable specs, the
same ones the embedded backend creates its tables from, so the deployed tables and the
local ones cannot differ in shape; the messages table may be provisioned instead, and
autoscaled (the environment's ``messages_capacity``).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from stacks.settings_parts import MessagesCapacity
from wsfleet import schema
from wsfleet.plan.environments import MESSAGES_CAPACITY_DEFAULTS

_ATTRIBUTE_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_BILLING_MODES = {
    "PAY_PER_REQUEST": dynamodb.BillingMode.PAY_PER_REQUEST,
    "PROVISIONED": dynamodb.BillingMode.PROVISIONED,
}

# Logical ids of the stateful resources, fixed so that moving a construct in the tree
# never replaces (and so empties) a table.
CONNECTIONS_LOGICAL_ID = "ConnectionsTable"
SESSIONS_LOGICAL_ID = "SessionsTable"
MESSAGES_LOGICAL_ID = "MessagesTable"

# The ring index as stacks before issue 22 deployed it, and their workers query it: kept
# beside ``schema.RING_INDEX`` while a stack is upgraded (``keep_legacy_ring_index``;
# docs/operations.md, "Upgrading an existing stack"). CloudFormation cannot change an index's
# projection in place, and a table update creates or deletes one index: the upgrade adds
# the new index in one deploy and drops this one in the next.
LEGACY_RING_INDEX = "by_ring"


def legacy_ring_index_spec() -> dict[str, Any]:
    """``LEGACY_RING_INDEX`` as a CreateTable GSI: the ring and the session id, KEYS_ONLY."""
    return {
        "IndexName": LEGACY_RING_INDEX,
        "KeySchema": [
            {"AttributeName": schema.RING, "KeyType": "HASH"},
            {"AttributeName": schema.SESSION_ID, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    }


def sessions_spec(*, keep_legacy_ring_index: bool) -> dict[str, Any]:
    """The sessions table's spec, with the legacy ring index after the new one if kept
    (so that the transitional template differs from each neighbour by one index)."""
    spec = schema.sessions_table_spec("sessions")
    if keep_legacy_ring_index:
        spec["GlobalSecondaryIndexes"] = [*spec["GlobalSecondaryIndexes"], legacy_ring_index_spec()]
    return spec


def _key(spec: dict[str, Any], key_schema: list[dict[str, str]], key_type: str) -> dynamodb.Attribute | None:
    types = {d["AttributeName"]: d["AttributeType"] for d in spec["AttributeDefinitions"]}
    for key in key_schema:
        if key["KeyType"] == key_type:
            return dynamodb.Attribute(name=key["AttributeName"], type=_ATTRIBUTE_TYPES[types[key["AttributeName"]]])
    return None


def table_from_spec(
    scope: Construct,
    id: str,
    spec: dict[str, Any],
    *,
    logical_id: str,
    retain_data: bool,
    point_in_time_recovery: bool | None = None,
    index_warm_throughput: dict[str, dynamodb.WarmThroughput] | None = None,
    capacity: MessagesCapacity | None = None,
    **extra: Any,
) -> dynamodb.Table:
    """A table shaped by a ``wsfleet.schema`` CreateTable spec, with a fixed logical id.
    Point-in-time recovery follows ``retain_data`` unless given; ``index_warm_throughput``
    by index name, where an index needs more than a new on-demand one's. ``capacity``
    provisioned: the table and its indexes billed by provisioned capacity, autoscaled
    (:func:`_autoscale`) instead of the spec's on-demand."""
    provisioned = capacity is not None and capacity.provisioned
    units = {"read_capacity": capacity.min_read_units, "write_capacity": capacity.min_write_units} if provisioned else {}
    table = dynamodb.Table(
        scope,
        id,
        partition_key=_key(spec, spec["KeySchema"], "HASH"),
        sort_key=_key(spec, spec["KeySchema"], "RANGE"),
        billing_mode=dynamodb.BillingMode.PROVISIONED if provisioned else _BILLING_MODES[spec["BillingMode"]],
        **units,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=retain_data if point_in_time_recovery is None else point_in_time_recovery,
        ),
        deletion_protection=retain_data,
        removal_policy=RemovalPolicy.RETAIN if retain_data else RemovalPolicy.DESTROY,
        **extra,
    )
    for index in spec.get("GlobalSecondaryIndexes", ()):
        table.add_global_secondary_index(
            index_name=index["IndexName"],
            partition_key=_key(spec, index["KeySchema"], "HASH"),
            sort_key=_key(spec, index["KeySchema"], "RANGE"),
            projection_type=dynamodb.ProjectionType(index["Projection"]["ProjectionType"]),
            non_key_attributes=index["Projection"].get("NonKeyAttributes"),
            warm_throughput=(index_warm_throughput or {}).get(index["IndexName"]),
            **({"read_capacity": _INDEX_FLOOR, "write_capacity": _INDEX_FLOOR} if provisioned else {}),
        )
    if provisioned:
        _autoscale(table, capacity, [index["IndexName"] for index in spec.get("GlobalSecondaryIndexes", ())])
    table.node.default_child.override_logical_id(logical_id)
    return table


# A provisioned table's indexes start from this floor (the messages table's one index
# holds skip markers only) and scale to the table's own most.
_INDEX_FLOOR = MESSAGES_CAPACITY_DEFAULTS["min_write_units"]


def _autoscale(table: dynamodb.Table, capacity: MessagesCapacity, indexes: list[str]) -> None:
    """Application Auto Scaling keeps the table's read and write units, and each index's,
    at ``capacity.target_utilisation`` between its bounds."""
    percent = round(capacity.target_utilisation * 100)
    table.auto_scale_write_capacity(
        min_capacity=capacity.min_write_units, max_capacity=capacity.max_write_units
    ).scale_on_utilization(target_utilization_percent=percent)
    table.auto_scale_read_capacity(
        min_capacity=capacity.min_read_units, max_capacity=capacity.max_read_units
    ).scale_on_utilization(target_utilization_percent=percent)
    for name in indexes:
        table.auto_scale_global_secondary_index_write_capacity(
            name, min_capacity=_INDEX_FLOOR, max_capacity=capacity.max_write_units
        ).scale_on_utilization(target_utilization_percent=percent)
        table.auto_scale_global_secondary_index_read_capacity(
            name, min_capacity=_INDEX_FLOOR, max_capacity=capacity.max_read_units
        ).scale_on_utilization(target_utilization_percent=percent)


class Tables(Construct):
    """The three tables. Physical names are left to CloudFormation (the specs' TableName is
    ignored) and reach the runtime as environment variables."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        retain_data: bool,
        connections_warm: dynamodb.WarmThroughput | None = None,
        owner_index_warm: dynamodb.WarmThroughput | None = None,
        keep_legacy_ring_index: bool = False,
        messages_capacity: MessagesCapacity | None = None,
    ) -> None:
        """``connections_warm`` and ``owner_index_warm``: what the connections table and
        its by_owner index absorb at once (a crash's acquisitions), where more than a new
        on-demand table's. ``keep_legacy_ring_index``: the sessions table keeps
        ``LEGACY_RING_INDEX`` beside the new one, for the workers of a stack being
        upgraded. ``messages_capacity``: how the messages table is billed (None: on-demand)."""
        super().__init__(scope, id)
        self.connections = table_from_spec(
            self,
            "Connections",
            schema.connections_table_spec("connections"),
            logical_id=CONNECTIONS_LOGICAL_ID,
            retain_data=retain_data,
            warm_throughput=connections_warm,
            index_warm_throughput={schema.OWNER_INDEX: owner_index_warm} if owner_index_warm else None,
        )
        self.sessions = table_from_spec(
            self,
            "Sessions",
            sessions_spec(keep_legacy_ring_index=keep_legacy_ring_index),
            logical_id=SESSIONS_LOGICAL_ID,
            retain_data=retain_data,
            # Set on ENDED sessions only: DynamoDB deletes them a week after they end.
            time_to_live_attribute=schema.SESSION_TTL,
        )
        self.messages = table_from_spec(
            self,
            "Messages",
            schema.messages_table_spec("messages"),
            logical_id=MESSAGES_LOGICAL_ID,
            retain_data=retain_data,
            # Items carry it only when the worker runs with MESSAGE_TTL_DAYS > 0.
            time_to_live_attribute=schema.MESSAGE_TTL_ATTRIBUTE,
            capacity=messages_capacity,
        )
