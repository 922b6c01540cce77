"""The service stack: network, API, router, worker fleet, the reference consumer where one
is wanted, alarms and dashboard, wired to the stateful stack's tables, bucket, queue and
stream. Every grant is made here, action by action, from what the runtime does (see the
docstrings of the grant methods)."""

from __future__ import annotations

from typing import Any

from aws_cdk import ArnFormat, CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks import environments, nag, tracing
from stacks.constructs.alarms import Alarms
from stacks.constructs.api import EventsApi
from stacks.constructs.consumer import ReferenceConsumer
from stacks.constructs.dashboard import OperationsDashboard
from stacks.constructs.network import Network
from stacks.constructs.router import Router
from stacks.constructs.tables import LEGACY_RING_INDEX
from stacks.constructs.worker_service import WorkerService
from stacks.settings import AVAILABILITY_ZONES, EnvironmentSettings
from stacks.settings_parts import LAMBDA_OTEL_SDK, TRACING_OFF, TRACING_OTEL, TRACING_XRAY_SDK
from stacks.environments import METRICS_NAMESPACE
from wsfleet import metrics_names, schema, stack_outputs

API_STAGE = "v1"


class ServiceStack(Stack):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: EnvironmentSettings,
        connections_table: dynamodb.ITable,
        sessions_table: dynamodb.ITable,
        messages_table: dynamodb.ITable,
        messages_bucket_name: str,
        start_queue: sqs.IQueue,
        dead_letter_queue: sqs.IQueue,
        messages_stream: kinesis.IStream | None = None,
        stream_key: kms.IKey | None = None,
        consumer_bucket_name: str | None = None,
        consumer_table: dynamodb.ITable | None = None,
        delivery_stream: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``messages_stream`` where kinesis is a sink, with ``stream_key`` if it is
        encrypted with a customer-managed key; ``consumer_bucket_name`` (as
        ``messages_bucket_name``) and ``consumer_table`` where the reference consumer is;
        ``delivery_stream`` (its name and ARN) where firehose is a sink."""
        super().__init__(scope, id, **kwargs)
        if (
            settings.has_stream != (messages_stream is not None)
            or (settings.consumer is None) != (consumer_bucket_name is None or consumer_table is None)
            or settings.has_delivery != (delivery_stream is not None)
        ):
            raise ValueError(
                "the stream, the delivery stream, and the consumer's bucket and table, go exactly where the settings have them"
            )
        self.delivery_stream = delivery_stream
        self._secret_prefix = settings.secret_prefix
        self._stores_in_table = settings.stores_in_table
        self._ring_indexes = [schema.RING_INDEX, *([LEGACY_RING_INDEX] if settings.keep_legacy_ring_index else [])]
        self.messages_stream = messages_stream
        self.stream_key = stream_key
        self.connections_table = connections_table
        self.sessions_table = sessions_table
        self.messages_table = messages_table
        # By the stateful stack's output (StatefulStack.output_value), not a CDK
        # reference: the objects ARN in the grants below is then the string cdk-nag sees,
        # and stacks/nag.py can acknowledge its prefix wildcard by name.
        self.messages_bucket = s3.Bucket.from_bucket_name(self, "MessagesBucket", messages_bucket_name)
        self.start_queue = start_queue
        self.tracing_settings = settings.tracing
        resources = environments.Resources(
            connections_table_name=connections_table.table_name,
            sessions_table_name=sessions_table.table_name,
            messages_table_name=messages_table.table_name,
            messages_bucket_name=self.messages_bucket.bucket_name,
            queue_url=start_queue.queue_url,
            messages_stream_name=messages_stream.stream_name if messages_stream is not None else None,
            stores_in_table=settings.stores_in_table,
            messages_delivery_stream_name=delivery_stream[0] if delivery_stream is not None else None,
        )

        self.network = Network(
            self,
            "Network",
            nat_gateways=settings.nat_gateways,
            addresses_per_gateway=settings.nat_addresses_per_gateway,
            worker_subnet_mask=settings.worker_subnet_mask,
            availability_zones=AVAILABILITY_ZONES,
            log_retention=settings.log_retention,
            removal_policy=settings.removal_policy,
        )

        self.router = Router(
            self,
            "Router",
            environment=environments.router(settings, resources, self.region),
            log_retention=settings.log_retention,
            removal_policy=settings.removal_policy,
            tracing_settings=settings.tracing,
        )
        self.grant_router(self.router.role)

        self.api = EventsApi(
            self,
            "Api",
            handler=self.router.function,
            api_name=f"wsfleet-{settings.name}-events",
            stage_name=API_STAGE,
            rate_limit=settings.api_rate_limit,
            burst_limit=settings.api_burst_limit,
            log_retention=settings.log_retention,
            removal_policy=settings.removal_policy,
            tracing_enabled=settings.tracing.mode != TRACING_OFF,
        )

        self.active_connections = cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name=metrics_names.ACTIVE_CONNECTIONS,
            dimensions_map={metrics_names.DIMENSION_SERVICE_NAME: settings.service_name},
            statistic=cloudwatch.Stats.AVERAGE,
            period=Duration.minutes(1),
        )
        self.workers = WorkerService(
            self,
            "Workers",
            vpc=self.network.vpc,
            subnets=self.network.worker_subnets,
            environment=environments.worker(settings, resources, self.region),
            cpu=settings.worker_cpu,
            memory_mib=settings.worker_memory_mib,
            stop_timeout=Duration.seconds(settings.stop_timeout_seconds),
            use_fargate_spot=settings.use_fargate_spot,
            architecture=settings.worker_architecture,
            base_image=settings.worker_base_image,
            min_capacity=settings.min_workers,
            max_capacity=settings.max_workers,
            scaling_metric=self.active_connections,
            scaling_target=settings.target_connections_per_worker,
            log_retention=settings.log_retention,
            removal_policy=settings.removal_policy,
            tracing_settings=settings.tracing,
        )
        self.grant_worker(self.workers.task_definition.task_role)
        self.grant_worker_secrets(self.workers.task_definition.task_role, settings)

        self.consumer: ReferenceConsumer | None = None
        if settings.consumer is not None:
            self.consumer_bucket = s3.Bucket.from_bucket_name(self, "ConsumerBucket", consumer_bucket_name)
            self.consumer_table = consumer_table
            self.consumer_prefix = settings.consumer.prefix
            self.consumer = ReferenceConsumer(
                self,
                "Consumer",
                settings=settings.consumer,
                stream=messages_stream,
                environment=environments.consumer(
                    settings, bucket_name=self.consumer_bucket.bucket_name, table_name=consumer_table.table_name
                ),
                dependencies=self.router.dependencies,
                log_retention=settings.log_retention,
                removal_policy=settings.removal_policy,
            )
            self.grant_consumer(self.consumer.role)

        self.alarms = Alarms(
            self,
            "Alarms",
            prefix=f"wsfleet-{settings.name}",
            dead_letter_queue=dead_letter_queue,
            router=self.router.function,
            api=self.api.rest_api,
            service=self.workers.service,
            max_workers=settings.max_workers,
            metrics_namespace=METRICS_NAMESPACE,
            service_name=settings.service_name,
            failover_bound=Duration.seconds(settings.failover_bound_seconds),
            alarm_topic_arn=settings.alarm_topic_arn,
            stream=messages_stream,
            consumer=self.consumer,
            consumer_service_name=settings.consumer_service_name,
            delivery_stream_name=delivery_stream[0] if delivery_stream is not None else None,
        )
        self.dashboard = OperationsDashboard(
            self,
            "Dashboard",
            dashboard_name=f"wsfleet-{settings.name}",
            metrics_namespace=METRICS_NAMESPACE,
            service_name=settings.service_name,
            consumer_service_name=settings.consumer_service_name,
            target_connections_per_worker=settings.target_connections_per_worker,
            max_connections_per_worker=settings.max_connections_per_worker,
            alarms=self.alarms.all,
            unowned_alarm=self.alarms.unowned_connections,
            unreachable_alarm=self.alarms.unreachable_connections,
            refused_alarm=self.alarms.refused_connections,
            api=self.api.rest_api,
            router=self.router.function,
            start_queue=start_queue,
            dead_letter_queue=dead_letter_queue,
            tables={"connections": connections_table, "sessions": sessions_table, "messages": messages_table},
            indexes={
                "connections": [schema.OWNER_INDEX],
                "sessions": [schema.RING_INDEX],
                "messages": [schema.MARKERS_INDEX],
            },
            stream=messages_stream,
            consumer=self.consumer,
            iterator_age_alarm=self.alarms.consumer_iterator_age,
            worker_log_group=self.workers.log_group,
        )
        CfnOutput(
            self,
            stack_outputs.API_URL,
            value=self.api.rest_api.url,
            description=f"The events API's stage URL (/{API_STAGE}/, SigV4): POST events, GET connections/ID",
        )
        CfnOutput(self, "DashboardUrl", value=self.dashboard.url, description="The fleet's CloudWatch dashboard")
        # `wsfleet logs ID` reads a connection's lines from these (FilterLogEvents on connection_id).
        CfnOutput(
            self,
            stack_outputs.WORKER_LOG_GROUP_NAME,
            value=self.workers.log_group.log_group_name,
            description="The workers' log group (JSON lines)",
        )
        CfnOutput(
            self,
            stack_outputs.ROUTER_LOG_GROUP_NAME,
            value=self.router.log_group.log_group_name,
            description="The router's log group (JSON lines)",
        )
        nag.acknowledge_service_findings(
            settings,
            api=self.api,
            router=self.router,
            workers=self.workers,
            consumer=self.consumer,
            message_objects_arn=self.message_objects_arn,
            consumer_objects_arn=self.consumer_objects_arn if self.consumer is not None else None,
            upstream_secrets_arn=self.upstream_secrets_arn,
        )

    def grant_router(self, role: iam.IRole) -> None:
        """The router reads a connection and writes its desired state (conditional
        PutItem/UpdateItem) or deletes a STOPPED one (conditional DeleteItem); for a STOP of an owned connection it posts to the owning
        session's inbox (UpdateItem), for a GET it reads that session's expiry
        (GetItem) and counts the connection's skip markers in the ``markers`` index
        (Query); it reads pages of messages (Query) and presigns GETs of their large
        data, which S3 authorizes as the router's own GetObject; it sends START hints.
        Where the table is not a sink, the read API answers 409 without reading: no
        messages grant. It never touches the stream (it only names it in that answer).
        With otel and lambda_otel sdk it exports its spans to X-Ray's OTLP endpoint."""
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"],
                resources=[self.connections_table.table_arn],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
                resources=[self.sessions_table.table_arn],
            )
        )
        if self._stores_in_table:
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:Query"],
                    resources=[
                        self.messages_table.table_arn,
                        _index_arn(self.messages_table, schema.MARKERS_INDEX),
                    ],
                )
            )
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.message_objects_arn])
            )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.start_queue.queue_arn])
        )
        # Active tracing grants Lambda's own segment writes; exporting straight to X-Ray's
        # OTLP endpoint takes its own actions (no resource-level permissions either).
        if self.tracing_settings.mode == TRACING_OTEL and self.tracing_settings.lambda_otel == LAMBDA_OTEL_SDK:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=list(tracing.OTLP_ENDPOINT_ACTIONS), resources=["*"])
            )

    def grant_worker(self, role: iam.IRole) -> None:
        """The worker opens its session (conditional PutItem) and renews and ends
        sessions (UpdateItem), reads the sessions it watches (BatchGetItem) and finds
        them in the ``by_ring_load`` index (and, while a stack is upgraded, the older
        workers in ``by_ring``: the task role is theirs too); it acquires, checkpoints and releases connections
        (UpdateItem; checkpoints go up to 25 in a TransactWriteItems, whose Updates IAM
        checks as UpdateItem), reads one back (GetItem) and lists who owns what in the
        ``by_owner`` index; where the table is a sink it batch-writes messages and
        queries the stored end past a checkpoint; where the stream is, it puts records
        (PutRecords, and nothing else: it neither describes nor reads the stream), and
        with a customer-managed key Kinesis asks KMS for data keys on its behalf
        (GenerateDataKey, for this stream only); where the delivery stream is, it puts
        record batches (PutRecordBatch, nothing else); it stores data too large for an item or
        a record as an object under the bucket's messages prefix (PutObject: S3
        authorizes a multipart upload's parts with it too) before the item or record;
        it consumes hints and sends them for connections it frees, publishes its
        metrics and (through the sidecar) traces."""
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
                resources=[self.connections_table.table_arn],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:Query"],
                resources=[_index_arn(self.connections_table, schema.OWNER_INDEX)],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem"],
                resources=[self.sessions_table.table_arn],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:Query"],
                resources=[_index_arn(self.sessions_table, index) for index in self._ring_indexes],
            )
        )
        if self._stores_in_table:
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:BatchWriteItem", "dynamodb:Query"],
                    resources=[self.messages_table.table_arn],
                )
            )
        if self.messages_stream is not None:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["kinesis:PutRecords"], resources=[self.messages_stream.stream_arn])
            )
            self._grant_stream_key(role, "kms:GenerateDataKey")
        if self.delivery_stream is not None:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["firehose:PutRecordBatch"], resources=[self.delivery_stream[1]])
            )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[self.message_objects_arn])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "sqs:ReceiveMessage",
                    "sqs:DeleteMessage",
                    "sqs:ChangeMessageVisibility",
                    "sqs:SendMessage",
                ],
                resources=[self.start_queue.queue_arn],
            )
        )
        # No cloudwatch:PutMetricData: the worker's metrics are EMF lines in its log
        # (wsfleet.metrics), which the awslogs driver ships and CloudWatch extracts.
        self.grant_worker_tracing(role)

    def grant_worker_tracing(self, role: iam.IRole) -> None:
        """What the task's tracing sidecar calls with the task role: the X-Ray daemon
        sends segments and its telemetry and serves the SDK its sampling rules and quotas
        (xray-sdk); the ADOT collector only sends segments (otel); off, nothing. X-Ray has
        no resource-level permissions for these."""
        actions = {TRACING_XRAY_SDK: tracing.XRAY_DAEMON_ACTIONS, TRACING_OTEL: tracing.COLLECTOR_ACTIONS}
        if self.tracing_settings.mode in actions:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=list(actions[self.tracing_settings.mode]), resources=["*"])
            )

    def grant_worker_secrets(self, role: iam.IRole, settings: EnvironmentSettings) -> None:
        """The worker reads the values of ``secret_headers`` and ``secret_query`` at connect
        time (GetSecretValue) and the ``wsfleet:hosts`` tag that binds each to its hosts
        (DescribeSecret), only of secrets of this account and region under the allowed
        prefix; with no prefix, nothing. Secrets encrypted with a customer-managed key
        need kms:Decrypt on it too: granted on the listed keys only, only when Secrets
        Manager calls KMS on the worker's behalf, and only for secrets under the prefix
        (Secrets Manager's encryption context names the secret's ARN)."""
        if not settings.secret_prefix:
            return
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
                resources=[self.upstream_secrets_arn],
            )
        )
        if settings.upstream_secret_kms_key_arns:
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=list(settings.upstream_secret_kms_key_arns),
                    conditions={
                        "StringEquals": {"kms:ViaService": f"secretsmanager.{self.region}.amazonaws.com"},
                        "StringLike": {"kms:EncryptionContext:SecretARN": self.upstream_secrets_arn},
                    },
                )
            )

    def grant_consumer(self, role: iam.IRole) -> None:
        """The reference consumer's event source mapping reads the stream as Lambda
        does for a standard iterator (DescribeStream, DescribeStreamSummary, ListShards,
        GetShardIterator, GetRecords: no enhanced fan-out, so no SubscribeToShard), with
        kms:Decrypt for this stream's records where its key is customer-managed, and
        records a batch it gives up on in the failure queue (SendMessage). The handler
        writes one object per (connection, batch) under its prefix (PutObject), reads
        each connection's delivery state (GetItem) and replaces it conditionally on the
        revision it read (PutItem)."""
        assert self.messages_stream is not None and self.consumer is not None
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "kinesis:DescribeStream",
                    "kinesis:DescribeStreamSummary",
                    "kinesis:ListShards",
                    "kinesis:GetShardIterator",
                    "kinesis:GetRecords",
                ],
                resources=[self.messages_stream.stream_arn],
            )
        )
        self._grant_stream_key(role, "kms:Decrypt")
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.consumer.failure_queue.queue_arn])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[self.consumer_objects_arn])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:GetItem", "dynamodb:PutItem"],
                resources=[self.consumer_table.table_arn],
            )
        )

    def _grant_stream_key(self, role: iam.IRole, action: str) -> None:
        """``action`` on the stream's customer-managed key, if it has one, only when
        Kinesis calls KMS on the role's behalf for this stream (Kinesis passes the
        stream's ARN as the encryption context of every call)."""
        if self.stream_key is None:
            return
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[action],
                resources=[self.stream_key.key_arn],
                conditions={
                    "StringEquals": {
                        "kms:ViaService": f"kinesis.{self.region}.amazonaws.com",
                        "kms:EncryptionContext:aws:kinesis:arn": self.messages_stream.stream_arn,
                    }
                },
            )
        )

    @property
    def consumer_objects_arn(self) -> str:
        """The objects under the reference consumer's prefix, and nothing else in its bucket."""
        return self.consumer_bucket.arn_for_objects(f"{self.consumer_prefix}*")

    @property
    def upstream_secrets_arn(self) -> str:
        """The secrets under UPSTREAM_SECRET_PREFIX, in this account and region. The
        wildcard also covers the six characters Secrets Manager appends to a name."""
        prefix = self._secret_prefix
        return self.format_arn(
            service="secretsmanager",
            resource="secret",
            resource_name=f"{prefix}*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    @property
    def message_objects_arn(self) -> str:
        """The objects under the messages prefix, and nothing else in the bucket."""
        return self.messages_bucket.arn_for_objects(f"{schema.MESSAGE_OBJECTS_PREFIX}*")


def _index_arn(table: dynamodb.ITable, index_name: str) -> str:
    return f"{table.table_arn}/index/{index_name}"

