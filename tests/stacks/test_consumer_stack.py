"""The reference consumer in the stacks (issue 21): its function on the router's code, the
event source mapping on the messages stream, its bucket and state table, its grants
(read that stream, write its prefix and its table, nothing else) and its alarms.

dev deploys it under the stream's own key; ``kinesis_only`` under the AWS managed key;
prod has none. Resources are found by type and by what they reference."""

from __future__ import annotations

import json

from aws_cdk import App, RemovalPolicy, Stack
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Match, Template

from stacks import runtime_assets
from stacks.constructs.consumer import (
    CONSUMER_BUCKET_LOGICAL_ID,
    CONSUMER_TABLE_LOGICAL_ID,
    FAILURE_QUEUE_RETENTION,
    HANDLER,
    ReferenceConsumer,
)
from stacks.settings_parts import ConsumerSettings
from wsfleet import schema, settings_spec, stack_outputs

from tests.stacks.policies import actions, statements


def _function(env, handler: str) -> dict:
    (function,) = env.service_template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    return function["Properties"]


def _mapping(env) -> dict:
    (mapping,) = env.service_template.find_resources("AWS::Lambda::EventSourceMapping").values()
    return mapping["Properties"]


def _resolved(env, value):
    return env.service.resolve(value)


# --- the function -------------------------------------------------------------------------------


def test_the_consumer_runs_the_routers_code_and_layer_with_its_own_handler(dev):
    consumer, router = _function(dev, HANDLER), _function(dev, "wsfleet.router.handler")
    assert HANDLER == "wsfleet.consumer.handler"
    assert consumer["Code"] == router["Code"]
    # The router's dependency layer, not its tracing layers (the consumer does not trace).
    assert consumer["Layers"] == [dev.service.resolve(dev.service.router.dependencies.layer_version_arn)]
    assert consumer["Layers"][0] in router["Layers"]
    assert consumer["Runtime"] == runtime_assets.LAMBDA_RUNTIME.name
    assert consumer["LoggingConfig"]["LogFormat"] == "JSON"
    # Its own role: nothing the router may do.
    assert consumer["Role"] != router["Role"]


def test_the_consumer_is_told_its_bucket_table_prefix_and_metrics_identity_and_nothing_else(dev):
    variables = _function(dev, HANDLER)["Environment"]["Variables"]
    assert variables == {
        settings_spec.CONSUMER_BUCKET_NAME: {
            "Fn::GetStackOutput": {
                "StackName": dev.stateful.stack_name,
                "OutputName": stack_outputs.CONSUMER_BUCKET_NAME,
                "Region": {"Ref": "AWS::Region"},
            }
        },
        settings_spec.CONSUMER_TABLE_NAME: _resolved(dev, dev.service.consumer_table.table_name),
        settings_spec.CONSUMER_PREFIX: dev.settings.consumer.prefix,
        # Its metrics per environment: dev's and prod's counts never add up in one account.
        settings_spec.METRICS_NAMESPACE: "WsFleet",
        settings_spec.SERVICE_NAME: "wsfleet-dev-consumer",
    }
    for output_id, logical_id in (
        (stack_outputs.CONSUMER_BUCKET_NAME, CONSUMER_BUCKET_LOGICAL_ID),
        (stack_outputs.CONSUMER_TABLE_NAME, CONSUMER_TABLE_LOGICAL_ID),
    ):
        dev.stateful_template.has_output(output_id, {"Value": {"Ref": logical_id}})


# --- the event source mapping ----------------------------------------------------------------------


def test_the_mapping_reads_the_stream_in_batches_splitting_failures_and_honouring_partial_answers(dev):
    consumer = dev.settings.consumer
    failure_queue = dev.service.consumer.failure_queue
    mapping = {k: v for k, v in _mapping(dev).items() if k != "Tags"}
    assert mapping == {
        "EventSourceArn": _resolved(dev, dev.service.messages_stream.stream_arn),
        "FunctionName": _resolved(dev, dev.service.consumer.function.function_name),
        "StartingPosition": "TRIM_HORIZON",
        "BatchSize": consumer.batch_size,
        "MaximumBatchingWindowInSeconds": consumer.max_batching_window_seconds,
        "BisectBatchOnFunctionError": True,
        # One invocation at a time per shard: one writer per connection's state.
        "ParallelizationFactor": 1,
        # The handler answers batchItemFailures: only the records from the first failed
        # one on are retried, the ones before it stay delivered.
        "FunctionResponseTypes": ["ReportBatchItemFailures"],
        "DestinationConfig": {"OnFailure": {"Destination": _resolved(dev, failure_queue.queue_arn)}},
    }
    # No MaximumRetryAttempts: a failing batch is retried until its records expire.
    assert consumer.retry_attempts is None


def test_a_retry_count_and_starting_position_reach_the_mapping_as_set(tmp_path):
    stack = Stack(App(outdir=str(tmp_path)), "consumer")
    ReferenceConsumer(
        stack,
        "Consumer",
        settings=ConsumerSettings(
            batch_size=100,
            max_batching_window_seconds=0,
            starting_position="LATEST",
            retry_attempts=3,
            bisect_on_error=False,
        ),
        stream=kinesis.Stream(stack, "Stream", stream_mode=kinesis.StreamMode.ON_DEMAND),
        environment={},
        dependencies=lambda_.LayerVersion.from_layer_version_arn(
            stack, "Layer", "arn:aws:lambda:eu-west-1:123456789012:layer:deps:1"
        ),
        log_retention=logs.RetentionDays.ONE_DAY,
        removal_policy=RemovalPolicy.DESTROY,
    )
    Template.from_stack(stack).has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "BatchSize": 100,
            "MaximumBatchingWindowInSeconds": 0,
            "StartingPosition": "LATEST",
            "MaximumRetryAttempts": 3,
            "BisectBatchOnFunctionError": False,
        },
    )


def test_the_failure_queue_is_encrypted_tls_only_and_keeps_its_pointers_as_long_as_sqs_allows(dev):
    queue_ref = _resolved(dev, dev.service.consumer.failure_queue.queue_arn)["Fn::GetAtt"][0]
    queue = dev.service_template.to_json()["Resources"][queue_ref]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True
    assert queue["MessageRetentionPeriod"] == FAILURE_QUEUE_RETENTION.to_seconds() == 14 * 24 * 3600
    dev.service_template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "Queues": [{"Ref": queue_ref}],
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            },
        },
    )


# --- grants --------------------------------------------------------------------------------------


def _grants(env) -> dict[str, set[str]]:
    """The consumer's actions by what they are granted on, named; any other resource fails."""
    service = env.service
    names = {
        json.dumps(service.resolve(arn), sort_keys=True): name
        for arn, name in (
            (service.messages_stream.stream_arn, "stream"),
            (service.consumer.failure_queue.queue_arn, "failure queue"),
            (service.consumer_bucket.arn_for_objects(f"{env.settings.consumer.prefix}*"), "bucket/prefix*"),
            (service.consumer_table.table_arn, "table"),
            (service.consumer.log_group.log_group_arn, "logs"),
            *([(service.stream_key.key_arn, "key")] if service.stream_key else []),
        )
    }
    grants: dict[str, set[str]] = {}
    for statement in statements(env, service.consumer.role):
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        for resource in resources:
            grants.setdefault(names[json.dumps(resource, sort_keys=True)], set()).update(actions(statement))
    return grants


def test_the_consumer_may_read_that_stream_write_its_prefix_and_its_table_and_nothing_else(dev):
    assert _grants(dev) == {
        # What Lambda's poller calls for a standard iterator (no enhanced fan-out).
        "stream": {
            "kinesis:DescribeStream",
            "kinesis:DescribeStreamSummary",
            "kinesis:ListShards",
            "kinesis:GetShardIterator",
            "kinesis:GetRecords",
        },
        "key": {"kms:Decrypt"},
        "failure queue": {"sqs:SendMessage"},
        "bucket/prefix*": {"s3:PutObject"},
        # Read a connection's state; replace it, conditional on the revision read.
        "table": {"dynamodb:GetItem", "dynamodb:PutItem"},
        "logs": {"logs:CreateLogStream", "logs:PutLogEvents"},
    }


def test_the_consumer_decrypts_only_through_kinesis_for_that_stream(dev):
    (decrypt,) = [s for s in statements(dev, dev.service.consumer.role) if "kms:Decrypt" in actions(s)]
    assert decrypt["Condition"] == {
        "StringEquals": {
            "kms:ViaService": {"Fn::Join": ["", ["kinesis.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]},
            "kms:EncryptionContext:aws:kinesis:arn": _resolved(dev, dev.service.messages_stream.stream_arn),
        }
    }


def test_with_the_aws_managed_key_the_consumer_needs_no_key_grant(kinesis_only):
    grants = _grants(kinesis_only)
    assert "key" not in grants
    assert grants["stream"] == {
        "kinesis:DescribeStream",
        "kinesis:DescribeStreamSummary",
        "kinesis:ListShards",
        "kinesis:GetShardIterator",
        "kinesis:GetRecords",
    }


# --- its data ------------------------------------------------------------------------------------


def test_the_consumer_bucket_is_encrypted_private_tls_only_and_expires_output_as_set(dev):
    bucket = dev.stateful_template.to_json()["Resources"][CONSUMER_BUCKET_LOGICAL_ID]["Properties"]
    assert bucket["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
    }
    assert set(bucket["PublicAccessBlockConfiguration"].values()) == {True}
    assert "VersioningConfiguration" not in bucket
    assert bucket["LifecycleConfiguration"]["Rules"] == [
        {
            "Id": "frames",
            "Status": "Enabled",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
            "ExpirationInDays": dev.settings.consumer.output_ttl_days,
        }
    ]
    (policy,) = dev.stateful_template.find_resources(
        "AWS::S3::BucketPolicy", {"Properties": {"Bucket": {"Ref": CONSUMER_BUCKET_LOGICAL_ID}}}
    ).values()
    conditions = [s.get("Condition") for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert {"Bool": {"aws:SecureTransport": "false"}} in conditions
    assert {"NumericLessThan": {"s3:TlsVersion": 1.2}} in conditions


def test_the_consumer_table_is_the_schema_spec_with_point_in_time_recovery(dev):
    table = dev.stateful_template.to_json()["Resources"][CONSUMER_TABLE_LOGICAL_ID]["Properties"]
    spec = schema.consumer_table_spec("any")
    assert table["KeySchema"] == spec["KeySchema"] == [{"AttributeName": "connection_id", "KeyType": "HASH"}]
    assert table["AttributeDefinitions"] == spec["AttributeDefinitions"]
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    # Even in dev, where the other tables have none: lost state means everything the
    # stream holds is delivered again.
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


# --- alarms --------------------------------------------------------------------------------------


def _alarm(env, suffix: str) -> dict:
    (alarm,) = env.service_template.find_resources(
        "AWS::CloudWatch::Alarm", {"Properties": {"AlarmName": f"wsfleet-{env.settings.name}-{suffix}"}}
    ).values()
    return alarm["Properties"]


def _on_the_consumer(env) -> list[dict]:
    return [{"Name": "FunctionName", "Value": _resolved(env, env.service.consumer.function.function_name)}]


def test_alarm_when_the_consumer_falls_behind_past_its_threshold(dev):
    alarm = _alarm(dev, "consumer-iterator-age")
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/Lambda", "IteratorAge")
    assert alarm["Dimensions"] == _on_the_consumer(dev)
    assert alarm["Statistic"] == "Maximum"
    assert alarm["Threshold"] == dev.settings.consumer.iterator_age_alarm_seconds * 1000
    # Well before the records leave the stream.
    assert alarm["Threshold"] < dev.settings.stream_retention_hours * 3600 * 1000
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_alarm_when_the_consumer_fails_or_gives_up_on_a_batch(dev):
    errors = _alarm(dev, "consumer-errors")
    assert (errors["MetricName"], errors["Statistic"], errors["Threshold"]) == ("Errors", "Sum", 1)
    assert errors["Dimensions"] == _on_the_consumer(dev)
    gave_up = _alarm(dev, "consumer-batches-abandoned")
    assert (gave_up["Namespace"], gave_up["MetricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert gave_up["Dimensions"] == [
        {"Name": "QueueName", "Value": _resolved(dev, dev.service.consumer.failure_queue.queue_name)}
    ]
    assert gave_up["Threshold"] == 1


def test_alarm_when_the_consumer_gives_up_on_seqs(dev):
    alarm = _alarm(dev, "consumer-seqs-abandoned")
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == ("WsFleet", "SeqsAbandoned", "Sum")
    assert alarm["Dimensions"] == [{"Name": "ServiceName", "Value": "wsfleet-dev-consumer"}]
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
