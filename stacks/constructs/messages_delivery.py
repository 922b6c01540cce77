"""The delivery stream: where the workers put frames when ``firehose`` is a sink
(``wsfleet.sinks.firehose``), Amazon Data Firehose into S3 for Athena.

* **The delivery stream** (Direct PUT, encrypted with an AWS owned key): a worker's
  record holds a connection's JSON lines of one flush; Firehose splits it back into its
  lines (record de-aggregation, JSON), reads each line's partition with JQ (the day of
  ``received_at_ms``, UTC, and ``connection_bucket``, which the worker writes: CRC-32 of
  the connection id modulo 64), appends a newline to each and delivers them GZIP'd
  under ``frames/dt=<day>/connection_bucket=<n>/``, every ``BUFFER_SECONDS`` or
  ``BUFFER_MIB``, whichever comes first. A line it cannot partition goes under
  ``errors/`` instead of being lost.
* **The bucket**: private (blocked public access, TLS only, SSE-S3), its objects
  expiring after ``ttl_days`` (0: kept), like the messages bucket.
* **The Glue table** (database ``wsfleet_<env>``, table ``frames``): the lines'
  columns, the OpenX JSON SerDe, and partition projection over ``dt`` and
  ``connection_bucket``, so Athena finds partitions from the query, with no crawler
  and no partition to add. A query keeps the highest fence per (connection_id, seq):
  docs/sinks.md.
* **The role** Firehose writes with: the bucket's object and multipart actions on its
  two prefixes, bucket-level listing, and its own error log stream; nothing else.

Why a bucket of 64 and not the connection id as the partition: a delivery stream holds
500 active partitions by default (a partition per connection would fail past that), one
S3 object per partition per buffer (a partition per connection would write as many
objects as connections, every buffer interval), and Athena's projection of a value it
cannot list (``injected``) answers only queries that name it. A connection's lines are
in one bucket: ``connection_bucket = crc32(to_utf8('<id>')) % 64`` reads a 64th.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_glue as glue
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesisfirehose as firehose
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.constructs.messages_bucket import ABORT_INCOMPLETE_UPLOADS_AFTER, private_bucket
from wsfleet.records import CONNECTION_BUCKET, CONNECTION_BUCKETS, FIREHOSE_BUFFER_MIB, FIREHOSE_BUFFER_SECONDS

# Fixed like the tables' ids: moving the construct must never replace (and so empty) them.
DELIVERY_BUCKET_LOGICAL_ID = "DeliveryBucket"
DELIVERY_STREAM_LOGICAL_ID = "DeliveryStream"
GLUE_DATABASE_LOGICAL_ID = "DeliveryDatabase"
GLUE_TABLE_LOGICAL_ID = "DeliveryTable"
TABLE_NAME = "frames"
FRAMES_PREFIX = "frames/"
ERRORS_PREFIX = "errors/"
BUFFER_SECONDS, BUFFER_MIB = FIREHOSE_BUFFER_SECONDS, FIREHOSE_BUFFER_MIB  # records declares them: the plan prices them
# The first day Athena's projection enumerates (through today): a query names its days.
PROJECTION_FIRST_DAY = "2026-01-01"
DELIVERY_LOG_STREAM = "DestinationDelivery"

# The day (UTC) the frame was received, and its connection's bucket, per line.
METADATA_QUERY = (
    '{dt: (.received_at_ms / 1000 | floor | strftime("%Y-%m-%d")), '
    f"{CONNECTION_BUCKET}: (.{CONNECTION_BUCKET} | tostring)}}"
)
PARTITIONED_PREFIX = (
    f"{FRAMES_PREFIX}dt=!{{partitionKeyFromQuery:dt}}/"
    f"{CONNECTION_BUCKET}=!{{partitionKeyFromQuery:{CONNECTION_BUCKET}}}/"
)
ERROR_PREFIX = f"{ERRORS_PREFIX}!{{firehose:error-output-type}}/dt=!{{timestamp:yyyy-MM-dd}}/"

# The lines' fields (wsfleet.records), as Athena reads them: data (a JSON value) as its
# JSON text.
COLUMNS = (
    ("connection_id", "string"),
    ("seq", "bigint"),
    ("fence_token", "bigint"),
    ("worker_id", "string"),
    ("received_at_ms", "bigint"),
    ("data", "string"),
    ("data_base64", "string"),
    ("data_ref", "string"),
    ("data_bytes", "bigint"),
    ("data_sha256", "string"),
    ("data_format", "string"),
    ("skipped", "string"),
    ("skip_to", "bigint"),
)
PARTITION_KEYS = (("dt", "string"), (CONNECTION_BUCKET, "int"))
JSON_SERDE = "org.openx.data.jsonserde.JsonSerDe"
TEXT_INPUT = "org.apache.hadoop.mapred.TextInputFormat"
TEXT_OUTPUT = "org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat"


class MessagesDelivery(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        environment_name: str,
        ttl_days: int,
        retain_data: bool,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, id)
        removal_policy = RemovalPolicy.RETAIN if retain_data else RemovalPolicy.DESTROY
        rule = s3.LifecycleRule(
            id="frames",
            abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS_AFTER,
            expiration=Duration.days(ttl_days) if ttl_days else None,
        )
        self.bucket = private_bucket(self, "Bucket", rule=rule, retain_data=retain_data, logical_id=DELIVERY_BUCKET_LOGICAL_ID)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=removal_policy)
        log_stream = logs.LogStream(
            self, "DeliveryLog", log_group=self.log_group, log_stream_name=DELIVERY_LOG_STREAM, removal_policy=removal_policy
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal(
                "firehose.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description="Amazon Data Firehose writes the delivery stream's objects with it",
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
                resources=[self.bucket.bucket_arn],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"],
                resources=[self.bucket.arn_for_objects(f"{p}*") for p in (FRAMES_PREFIX, ERRORS_PREFIX)],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:PutLogEvents"],
                resources=[
                    Stack.of(self).format_arn(
                        service="logs",
                        resource="log-group",
                        resource_name=f"{self.log_group.log_group_name}:log-stream:{DELIVERY_LOG_STREAM}",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )

        processors = [
            _processor("RecordDeAggregation", SubRecordType="JSON"),
            _processor("MetadataExtraction", MetadataExtractionQuery=METADATA_QUERY, JsonParsingEngine="JQ-1.6"),
            _processor("AppendDelimiterToRecord"),
        ]
        self.stream = firehose.CfnDeliveryStream(
            self,
            "Stream",
            delivery_stream_type="DirectPut",
            delivery_stream_encryption_configuration_input=firehose.CfnDeliveryStream.DeliveryStreamEncryptionConfigurationInputProperty(
                key_type="AWS_OWNED_CMK"
            ),
            extended_s3_destination_configuration=firehose.CfnDeliveryStream.ExtendedS3DestinationConfigurationProperty(
                bucket_arn=self.bucket.bucket_arn,
                role_arn=self.role.role_arn,
                prefix=PARTITIONED_PREFIX,
                error_output_prefix=ERROR_PREFIX,
                compression_format="GZIP",
                buffering_hints=firehose.CfnDeliveryStream.BufferingHintsProperty(
                    interval_in_seconds=BUFFER_SECONDS, size_in_m_bs=BUFFER_MIB
                ),
                dynamic_partitioning_configuration=firehose.CfnDeliveryStream.DynamicPartitioningConfigurationProperty(
                    enabled=True,
                    retry_options=firehose.CfnDeliveryStream.RetryOptionsProperty(duration_in_seconds=300),
                ),
                processing_configuration=firehose.CfnDeliveryStream.ProcessingConfigurationProperty(
                    enabled=True, processors=processors
                ),
                cloud_watch_logging_options=firehose.CfnDeliveryStream.CloudWatchLoggingOptionsProperty(
                    enabled=True, log_group_name=self.log_group.log_group_name, log_stream_name=log_stream.log_stream_name
                ),
            ),
        )
        self.stream.override_logical_id(DELIVERY_STREAM_LOGICAL_ID)
        self.stream.apply_removal_policy(removal_policy)
        # Firehose checks its role's S3 access when the stream is created.
        self.stream.node.add_dependency(self.role)

        self.database_name = f"wsfleet_{environment_name.replace('-', '_')}"
        self.database = glue.CfnDatabase(
            self,
            "Database",
            catalog_id=Stack.of(self).account,
            database_input=glue.CfnDatabase.DatabaseInputProperty(
                name=self.database_name, description="wsfleet: the delivery stream's frames, for Athena"
            ),
        )
        self.database.override_logical_id(GLUE_DATABASE_LOGICAL_ID)
        self.database.apply_removal_policy(removal_policy)
        location = f"s3://{self.bucket.bucket_name}/{FRAMES_PREFIX}"
        self.table = glue.CfnTable(
            self,
            "Table",
            catalog_id=Stack.of(self).account,
            database_name=self.database_name,
            table_input=glue.CfnTable.TableInputProperty(
                name=TABLE_NAME,
                description="One row per line the workers sent: keep the highest fence_token per (connection_id, seq)",
                table_type="EXTERNAL_TABLE",
                parameters={
                    "classification": "json",
                    "compressionType": "gzip",
                    "projection.enabled": "true",
                    "projection.dt.type": "date",
                    "projection.dt.format": "yyyy-MM-dd",
                    "projection.dt.range": f"{PROJECTION_FIRST_DAY},NOW",
                    "projection.dt.interval": "1",
                    "projection.dt.interval.unit": "DAYS",
                    f"projection.{CONNECTION_BUCKET}.type": "integer",
                    f"projection.{CONNECTION_BUCKET}.range": f"0,{CONNECTION_BUCKETS - 1}",
                    "storage.location.template": f"{location}dt=${{dt}}/{CONNECTION_BUCKET}=${{{CONNECTION_BUCKET}}}/",
                },
                partition_keys=[glue.CfnTable.ColumnProperty(name=n, type=t) for n, t in PARTITION_KEYS],
                storage_descriptor=glue.CfnTable.StorageDescriptorProperty(
                    columns=[glue.CfnTable.ColumnProperty(name=n, type=t) for n, t in COLUMNS],
                    location=location,
                    input_format=TEXT_INPUT,
                    output_format=TEXT_OUTPUT,
                    compressed=True,
                    serde_info=glue.CfnTable.SerdeInfoProperty(
                        serialization_library=JSON_SERDE,
                        # A line that is not JSON is an error, not a row of nulls.
                        parameters={"ignore.malformed.json": "false"},
                    ),
                ),
            ),
        )
        self.table.override_logical_id(GLUE_TABLE_LOGICAL_ID)
        self.table.apply_removal_policy(removal_policy)
        self.table.node.add_dependency(self.database)

    @property
    def stream_name(self) -> str:
        return self.stream.ref

    @property
    def stream_arn(self) -> str:
        return self.stream.attr_arn


def _processor(kind: str, **parameters: str) -> firehose.CfnDeliveryStream.ProcessorProperty:
    return firehose.CfnDeliveryStream.ProcessorProperty(
        type=kind,
        parameters=[
            firehose.CfnDeliveryStream.ProcessorParameterProperty(parameter_name=k, parameter_value=v)
            for k, v in parameters.items()
        ],
    )
