"""The delivery stream (SINK has firehose): the Firehose stream itself (de-aggregation,
JQ partitions, GZIP, encryption, buffering), its bucket, the Glue table Athena reads
(columns, partition keys, SerDe, partition projection), Firehose's own role, the worker's
grant narrowed to PutRecordBatch on that stream, what the worker is given, and the
delivery alarms.

dev has it (sink = "dynamodb,kinesis,firehose"); prod does not. Resources are found by
type and by what they reference, never by generated logical id."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from aws_cdk.assertions import Match

from stacks.constructs import messages_delivery as md
from stacks.constructs.messages_delivery import DELIVERY_BUCKET_LOGICAL_ID, DELIVERY_STREAM_LOGICAL_ID
from tests.stacks.policies import actions, statements
from wsfleet import settings_spec, stack_outputs
from wsfleet.sinks import DeliverySink
from wsfleet.records import connection_bucket
from wsfleet.stream import Frame


def _delivery(env) -> dict:
    return env.stateful_template.find_resources("AWS::KinesisFirehose::DeliveryStream")[DELIVERY_STREAM_LOGICAL_ID]


def test_the_glue_table_has_the_lines_columns_the_json_serde_and_projected_partitions(dev):
    dev.stateful_template.has_resource_properties(
        "AWS::Glue::Database", {"DatabaseInput": {"Name": "wsfleet_dev"}}
    )
    dev.stateful_template.has_resource_properties(
        "AWS::Glue::Table",
        {
            "DatabaseName": "wsfleet_dev",
            "TableInput": {
                "Name": "frames",
                "TableType": "EXTERNAL_TABLE",
                "PartitionKeys": [{"Name": "dt", "Type": "string"}, {"Name": "connection_bucket", "Type": "int"}],
                "StorageDescriptor": {
                    "Columns": [
                        {"Name": n, "Type": t}
                        for n, t in (
                            ("connection_id", "string"), ("seq", "bigint"), ("fence_token", "bigint"),
                            ("worker_id", "string"), ("received_at_ms", "bigint"), ("data", "string"),
                            ("data_base64", "string"), ("data_ref", "string"), ("data_bytes", "bigint"),
                            ("data_sha256", "string"), ("data_format", "string"), ("skipped", "string"),
                            ("skip_to", "bigint"),
                        )
                    ],
                    "InputFormat": "org.apache.hadoop.mapred.TextInputFormat",
                    "OutputFormat": "org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat",
                    "SerdeInfo": {"SerializationLibrary": "org.openx.data.jsonserde.JsonSerDe"},
                    "Location": {"Fn::Join": ["", ["s3://", {"Ref": DELIVERY_BUCKET_LOGICAL_ID}, "/frames/"]]},
                },
                "Parameters": Match.object_like({
                    "projection.enabled": "true",
                    "projection.dt.type": "date",
                    "projection.dt.format": "yyyy-MM-dd",
                    "projection.connection_bucket.type": "integer",
                    "projection.connection_bucket.range": "0,63",
                    "storage.location.template": {"Fn::Join": ["", [
                        "s3://", {"Ref": DELIVERY_BUCKET_LOGICAL_ID}, "/frames/dt=${dt}/connection_bucket=${connection_bucket}/",
                    ]]},
                }),
            },
        },
    )
    # The record's fields are exactly the table's columns (but connection_bucket, a partition).
    line = DeliverySink(None, "x")._line("c1", 3, Frame(1, '{"a":1}', 1), "w", None)
    assert [*json.loads(line)] == [c for c, _ in md.COLUMNS[:5]] + ["data", "connection_bucket"]


def test_the_delivery_stream_splits_partitions_compresses_and_delivers_under_frames_into_its_bucket(dev):
    props = _delivery(dev)["Properties"]
    assert props["DeliveryStreamType"] == "DirectPut"
    assert props["DeliveryStreamEncryptionConfigurationInput"] == {"KeyType": "AWS_OWNED_CMK"}
    s3 = props["ExtendedS3DestinationConfiguration"]
    assert s3["BucketARN"] == {"Fn::GetAtt": [DELIVERY_BUCKET_LOGICAL_ID, "Arn"]}
    assert s3["CompressionFormat"] == "GZIP"
    assert s3["DynamicPartitioningConfiguration"]["Enabled"] is True
    assert s3["BufferingHints"]["SizeInMBs"] >= 64  # dynamic partitioning's least
    assert s3["Prefix"] == "frames/dt=!{partitionKeyFromQuery:dt}/connection_bucket=!{partitionKeyFromQuery:connection_bucket}/"
    assert s3["ErrorOutputPrefix"].startswith("errors/!{firehose:error-output-type}/")
    kinds = [(p["Type"], {q["ParameterName"]: q["ParameterValue"] for q in p["Parameters"]}) for p in s3["ProcessingConfiguration"]["Processors"]]
    assert kinds == [
        ("RecordDeAggregation", {"SubRecordType": "JSON"}),
        ("MetadataExtraction", {"MetadataExtractionQuery": md.METADATA_QUERY, "JsonParsingEngine": "JQ-1.6"}),
        ("AppendDelimiterToRecord", {}),
    ]
    assert s3["CloudWatchLoggingOptions"]["Enabled"] is True


@pytest.mark.slow  # a process of its own
@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_the_jq_query_gives_each_line_its_utc_day_and_its_connections_bucket():
    sink = DeliverySink(None, "x")
    for cid, at_ms, day in (("c1", 1_764_633_599_999, "2025-12-01"), ("é☃", 1_764_633_600_000, "2025-12-02")):
        line = sink._line(cid, 1, Frame(1, "1", at_ms), "w", None)
        out = subprocess.run(["jq", "-c", md.METADATA_QUERY], input=line, capture_output=True, check=True).stdout
        assert json.loads(out) == {"dt": day, "connection_bucket": str(connection_bucket(cid))}


def test_the_bucket_is_private_encrypted_and_expires_frames_with_the_messages(dev):
    bucket = dev.stateful_template.find_resources("AWS::S3::Bucket")[DELIVERY_BUCKET_LOGICAL_ID]["Properties"]
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
    }
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    (rule,) = bucket["LifecycleConfiguration"]["Rules"]
    assert rule["ExpirationInDays"] == dev.settings.message_ttl_days and "AbortIncompleteMultipartUpload" in rule


def test_firehose_may_write_only_under_its_two_prefixes_and_its_own_log_stream(dev):
    role_id = _delivery(dev)["Properties"]["ExtendedS3DestinationConfiguration"]["RoleARN"]["Fn::GetAtt"][0]
    role = dev.stateful_template.find_resources("AWS::IAM::Role")[role_id]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "firehose.amazonaws.com"}
    (policy,) = [p for p in dev.stateful_template.find_resources("AWS::IAM::Policy").values()
                 if p["Properties"]["Roles"] == [{"Ref": role_id}]]
    granted = {tuple(sorted(actions(s))): json.dumps(s["Resource"]) for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(granted) == {
        ("s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"),
        ("s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject"),
        ("logs:PutLogEvents",),
    }
    objects = granted[("s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject")]
    assert "/frames/*" in objects and "/errors/*" in objects and '"/*"' not in objects
    assert ":log-stream:DestinationDelivery" in granted[("logs:PutLogEvents",)]


def test_the_worker_may_only_put_record_batches_on_that_stream_and_is_given_its_name(dev):
    role = dev.service.workers.task_definition.task_role
    found = [s for s in statements(dev, role) if any(a.startswith("firehose:") for a in actions(s))]
    assert [actions(s) for s in found] == [["firehose:PutRecordBatch"]]
    assert "DeliveryStream" in json.dumps(found[0]["Resource"])
    (task,) = dev.service_template.find_resources("AWS::ECS::TaskDefinition").values()
    (worker,) = [c for c in task["Properties"]["ContainerDefinitions"] if c["Name"] == "worker"]
    variables = {e["Name"]: e["Value"] for e in worker["Environment"]}
    assert variables[settings_spec.SINK] == "dynamodb,kinesis,firehose"
    assert "DeliveryStream" in json.dumps(variables[settings_spec.MESSAGES_DELIVERY_STREAM_NAME])
    router_roles = dev.service.router.role
    assert not [s for s in statements(dev, router_roles) if any(a.startswith("firehose:") for a in actions(s))]


def test_the_delivery_stream_bucket_and_database_are_stack_outputs(dev):
    outputs = dev.stateful_template.find_outputs("*")
    for name in (stack_outputs.MESSAGES_DELIVERY_STREAM_NAME, stack_outputs.DELIVERY_BUCKET_NAME, stack_outputs.DELIVERY_DATABASE_NAME):
        assert name in outputs


def test_alarms_when_delivery_to_s3_fails_and_when_the_stream_throttles(dev):
    dev.service_template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "wsfleet-dev-delivery-to-s3-failed",
            "Namespace": "AWS/Firehose",
            "MetricName": "DeliveryToS3.Success",
            "Statistic": "Minimum",
            "ComparisonOperator": "LessThanThreshold",
            "Threshold": 1,
            "TreatMissingData": "notBreaching",
        },
    )
    dev.service_template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"AlarmName": "wsfleet-dev-delivery-throttled", "Namespace": "AWS/Firehose", "MetricName": "ThrottledRecords"},
    )


def test_prod_has_no_delivery_stream_and_no_glue_table(prod):
    for kind in ("AWS::KinesisFirehose::DeliveryStream", "AWS::Glue::Table", "AWS::Glue::Database"):
        assert not prod.stateful_template.find_resources(kind)
