"""The reference consumer of the messages stream (``wsfleet.consumer.handler``).

Two parts, one per stack:

* :class:`ConsumerStore` (stateful stack): the output bucket, one object of JSON lines
  per (connection, batch) under the consumer's prefix, and the consumer's state table
  (what it has delivered per connection, ``schema.consumer_table_spec``). The two are
  one piece of data, the table saying which objects' records count, so they live and
  die together, like the messages table and its bucket.
* :class:`ReferenceConsumer` (service stack): the function, its event source mapping on
  the stream and the queue where Lambda records a batch it gave up on.

The stack grants the data access (``ServiceStack.grant_consumer``).
"""

from __future__ import annotations

import jsii
from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks import runtime_assets
from stacks.constructs.messages_bucket import ABORT_INCOMPLETE_UPLOADS_AFTER, private_bucket
from stacks.constructs.tables import table_from_spec
from stacks.settings_parts import ConsumerSettings
from wsfleet import schema

HANDLER = "wsfleet.consumer.handler"
CONSUMER_BUCKET_LOGICAL_ID = "ConsumerBucket"
CONSUMER_TABLE_LOGICAL_ID = "ConsumerTable"
# An invocation decodes a batch (at most 6 MB) and, connection by connection, writes one
# object and one state item: a batch of many connections takes a while. The handler
# starts no connection with less than 15 s left and answers the rest as failed (retried
# from there), so a long limit only lets large batches finish; memory is CPU on Lambda,
# and decoding is much of the work.
FUNCTION_TIMEOUT = Duration.minutes(5)
FUNCTION_MEMORY_MIB = 512
# What Lambda sends to the failure queue is the batch's shard and sequence-number range,
# not its records: an operator replays it from the stream while the stream keeps them,
# so the queue keeps the pointers as long as SQS allows.
FAILURE_QUEUE_RETENTION = Duration.days(14)


class ConsumerStore(Construct):
    def __init__(self, scope: Construct, id: str, *, settings: ConsumerSettings, retain_data: bool) -> None:
        super().__init__(scope, id)
        rule = s3.LifecycleRule(
            id="frames",
            abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS_AFTER,
            expiration=Duration.days(settings.output_ttl_days) if settings.output_ttl_days else None,
        )
        self.bucket = private_bucket(
            self, "Bucket", rule=rule, retain_data=retain_data, logical_id=CONSUMER_BUCKET_LOGICAL_ID
        )
        self.table = table_from_spec(
            self,
            "State",
            schema.consumer_table_spec("consumer"),
            logical_id=CONSUMER_TABLE_LOGICAL_ID,
            retain_data=retain_data,
            # Losing the state would deliver everything the stream still holds again:
            # recovery to a point in time is worth its cents in every environment.
            point_in_time_recovery=True,
        )


@jsii.implements(lambda_.IEventSourceDlq)
class _FailureQueue:
    """The on-failure destination, without the broader send grant CDK's SqsDlq makes:
    the stack grants sqs:SendMessage, all Lambda needs."""

    def __init__(self, queue: sqs.IQueue) -> None:
        self._queue = queue

    def bind(self, _target: lambda_.IEventSourceMapping, _handler: lambda_.IFunction) -> lambda_.DlqDestinationConfig:
        return lambda_.DlqDestinationConfig(destination=self._queue.queue_arn)


class ReferenceConsumer(Construct):
    """The function (the router's code and dependency layer, another handler), its log
    group, a role with nothing but log writes, the failure queue, and the event source
    mapping: batches per shard in stream order, a failing batch split in two, and the
    handler's partial-batch answer honoured (only the records from the first failed one
    on are retried)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: ConsumerSettings,
        stream: kinesis.IStream,
        environment: dict[str, str],
        dependencies: lambda_.ILayerVersion,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        self.iterator_age_alarm_threshold = Duration.seconds(settings.iterator_age_alarm_seconds)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=removal_policy)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.log_group.grant_write(self.role)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=runtime_assets.LAMBDA_RUNTIME,
            architecture=runtime_assets.LAMBDA_ARCHITECTURE,
            handler=HANDLER,
            code=runtime_assets.router_code(),
            layers=[dependencies],
            environment=environment,
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            memory_size=FUNCTION_MEMORY_MIB,
            timeout=FUNCTION_TIMEOUT,
        )
        self.failure_queue = sqs.Queue(
            self,
            "FailureQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=FAILURE_QUEUE_RETENTION,
            removal_policy=removal_policy,
        )
        self.mapping = lambda_.EventSourceMapping(
            self,
            "Mapping",
            target=self.function,
            event_source_arn=stream.stream_arn,
            starting_position=lambda_.StartingPosition(settings.starting_position),
            batch_size=settings.batch_size,
            max_batching_window=Duration.seconds(settings.max_batching_window_seconds),
            bisect_batch_on_error=settings.bisect_on_error,
            retry_attempts=settings.retry_attempts,
            report_batch_item_failures=True,
            # One invocation at a time per shard, so one writer per connection's state
            # (the consumer relies on it; a second is caught by its conditional write).
            parallelization_factor=1,
            on_failure=_FailureQueue(self.failure_queue),
        )
