"""The stateful stack: the tables (connections, worker sessions, messages), the
messages bucket (data too large for an item), the START queue, where ``kinesis`` is
a sink the messages stream and the reference consumer's bucket and state table, and
where ``firehose`` is, the delivery stream, its bucket and its Glue table.

Kept apart from the service stack so that the service can be replaced, or its stack
deleted and recreated, without touching data; its resources keep fixed logical ids.
"""

from __future__ import annotations

import math
from typing import Any

from aws_cdk import CfnOutput, Duration, Fn, Stack
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from stacks import nag
from stacks.constructs.consumer import ConsumerStore
from stacks.constructs.messages_bucket import MessagesBucket
from stacks.constructs.messages_delivery import MessagesDelivery
from stacks.constructs.messages_stream import MessagesStream
from stacks.constructs.queue import StartQueue
from stacks.constructs.tables import Tables
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import STREAM_KMS_CUSTOMER_MANAGED, WarmThroughput
from wsfleet import schema, stack_outputs

# A hint that keeps failing goes to the dead-letter queue after this many receives.
MAX_HINT_RECEIVES = schema.MAX_HINT_RECEIVES


class StatefulStack(Stack):
    def __init__(self, scope: Construct, id: str, *, settings: EnvironmentSettings, **kwargs: Any) -> None:
        super().__init__(scope, id, termination_protection=settings.retain_data, **kwargs)
        self.tables = Tables(
            self,
            "Tables",
            retain_data=settings.retain_data,
            connections_warm=_warm(settings.connections_warm_throughput),
            owner_index_warm=_warm(settings.owner_index_warm_throughput),
            keep_legacy_ring_index=settings.keep_legacy_ring_index,
            messages_capacity=settings.messages_capacity,
        )
        self.messages_bucket = MessagesBucket(
            self, "MessagesBucket", retain_data=settings.retain_data, message_ttl_days=settings.message_ttl_days
        )
        self.start_queue = StartQueue(
            self,
            "StartQueue",
            # Long enough for a worker to act on a hint (a conditional write or two, with
            # retries) before it reappears; short enough that a hint held by a worker
            # that crashed comes back soon after that worker's session would have run out.
            visibility_timeout=Duration.seconds(math.ceil(2 * settings.lease_seconds)),
            max_receive_count=MAX_HINT_RECEIVES,
            removal_policy=settings.removal_policy,
        )
        self.messages_stream: MessagesStream | None = None
        if settings.has_stream:
            self.messages_stream = MessagesStream(
                self,
                "MessagesStream",
                retention_hours=settings.stream_retention_hours,
                customer_managed_key=settings.stream_kms == STREAM_KMS_CUSTOMER_MANAGED,
                retain_data=settings.retain_data,
                shards=settings.stream_shards,
            )
        self.messages_delivery: MessagesDelivery | None = None
        if settings.has_delivery:
            self.messages_delivery = MessagesDelivery(
                self,
                "MessagesDelivery",
                environment_name=settings.name,
                ttl_days=settings.message_ttl_days,
                retain_data=settings.retain_data,
                log_retention=settings.log_retention,
            )
        self.consumer_store: ConsumerStore | None = None
        if settings.consumer is not None:
            self.consumer_store = ConsumerStore(
                self, "Consumer", settings=settings.consumer, retain_data=settings.retain_data
            )
        # What operators and `wsfleet --stack` find by name. The service stack's references
        # go through the outputs CDK makes for them, which these leave as they are, but for
        # the bucket's name, which it reads from MessagesBucketName (see output_value).
        tables = self.tables
        for output_id, value, description in (
            (stack_outputs.CONNECTIONS_TABLE_NAME, tables.connections.table_name, "The connections table (TABLE_NAME)"),
            (stack_outputs.SESSIONS_TABLE_NAME, tables.sessions.table_name, "The sessions table (SESSIONS_TABLE_NAME)"),
            (stack_outputs.MESSAGES_TABLE_NAME, tables.messages.table_name, "The messages table (MESSAGES_TABLE_NAME)"),
            (
                stack_outputs.MESSAGES_BUCKET_NAME,
                self.messages_bucket.bucket.bucket_name,
                "The bucket of message data too large for an item (MESSAGES_BUCKET_NAME)",
            ),
            (stack_outputs.START_QUEUE_URL, self.start_queue.queue.queue_url, "The START-hint queue (QUEUE_URL)"),
            *self._stream_outputs(),
        ):
            CfnOutput(self, output_id, value=value, description=description)
        nag.acknowledge_stateful_findings(
            settings,
            messages_bucket=self.messages_bucket.bucket,
            messages_stream=self.messages_stream,
            messages_delivery=self.messages_delivery,
            consumer_store=self.consumer_store,
            tables=(tables.connections, tables.sessions, tables.messages),
        )

    def _stream_outputs(self) -> list[tuple[str, str, str]]:
        outputs = []
        if self.messages_stream is not None:
            outputs.append(
                (
                    stack_outputs.MESSAGES_STREAM_NAME,
                    self.messages_stream.stream.stream_name,
                    "The stream of one record per frame (MESSAGES_STREAM_NAME)",
                )
            )
        if self.messages_delivery is not None:
            delivery = self.messages_delivery
            outputs += [
                (
                    stack_outputs.MESSAGES_DELIVERY_STREAM_NAME,
                    delivery.stream_name,
                    "The Firehose delivery stream of the frames (MESSAGES_DELIVERY_STREAM_NAME)",
                ),
                (stack_outputs.DELIVERY_BUCKET_NAME, delivery.bucket.bucket_name, "Where the delivery stream puts the frames"),
                (stack_outputs.DELIVERY_DATABASE_NAME, delivery.database_name, "The Glue database of the frames table, for Athena"),
            ]
        if self.consumer_store is not None:
            outputs += [
                (
                    stack_outputs.CONSUMER_BUCKET_NAME,
                    self.consumer_store.bucket.bucket_name,
                    "The reference consumer's output bucket (CONSUMER_BUCKET_NAME)",
                ),
                (
                    stack_outputs.CONSUMER_TABLE_NAME,
                    self.consumer_store.table.table_name,
                    "The reference consumer's delivery state (CONSUMER_TABLE_NAME)",
                ),
            ]
        return outputs

    def output_value(self, output_id: str) -> str:
        """One of the outputs above as another stack reads it: ``Fn::GetStackOutput`` by
        its fixed id, the same expression at construction as in the template (a CDK
        reference is rewritten at synthesis to an output id CDK generates)."""
        return Fn.get_stack_output(self.stack_name, output_id, self.region)


def _warm(setting: WarmThroughput | None) -> dynamodb.WarmThroughput | None:
    if setting is None:
        return None
    return dynamodb.WarmThroughput(
        read_units_per_second=setting.read_units_per_second, write_units_per_second=setting.write_units_per_second
    )
