"""The messages stream: where the workers put one record per frame when ``kinesis`` is a
sink (CONTRACT section 4), partition key = connection id, a connection's records of one
flush packed into one aggregated Kinesis record (``wsfleet.aggregation``).

On-demand capacity (shards follow the write rate, nothing to resize as the fleet grows),
or a provisioned number of shards, cheaper at a steady rate (``wsfleet plan`` sizes them
and says where the per-stream and per-shard limits bind).
Encrypted with KMS: the AWS managed ``aws/kinesis`` key, or a key of the stack's own
(rotated yearly) for an operator who wants the key policy and its CloudTrail trail in
their hands. Kept like the tables: retained in prod, deleted with the stack in dev.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kms as kms
from constructs import Construct

# Fixed like the tables' ids: moving the construct must never replace (and so empty) it.
MESSAGES_STREAM_LOGICAL_ID = "MessagesStream"
MESSAGES_STREAM_KEY_LOGICAL_ID = "MessagesStreamKey"


class MessagesStream(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        retention_hours: int,
        customer_managed_key: bool,
        retain_data: bool,
        shards: int | None = None,
    ) -> None:
        """``shards``: provisioned with that many; None: on-demand."""
        super().__init__(scope, id)
        removal_policy = RemovalPolicy.RETAIN if retain_data else RemovalPolicy.DESTROY
        # None with the AWS managed key: producers and consumers need no KMS grant then.
        self.key: kms.Key | None = None
        if customer_managed_key:
            self.key = kms.Key(
                self,
                "Key",
                description="wsfleet messages stream",
                enable_key_rotation=True,
                # A retained stream whose key is gone cannot be read: the key lives as long.
                removal_policy=removal_policy,
            )
            self.key.node.default_child.override_logical_id(MESSAGES_STREAM_KEY_LOGICAL_ID)
        self.stream = kinesis.Stream(
            self,
            "Stream",
            stream_mode=kinesis.StreamMode.ON_DEMAND if shards is None else kinesis.StreamMode.PROVISIONED,
            shard_count=shards,
            encryption=kinesis.StreamEncryption.KMS if self.key else kinesis.StreamEncryption.MANAGED,
            encryption_key=self.key,
            retention_period=Duration.hours(retention_hours),
            removal_policy=removal_policy,
        )
        self.stream.node.default_child.override_logical_id(MESSAGES_STREAM_LOGICAL_ID)
