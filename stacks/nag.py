"""cdk-nag's AwsSolutions pack on the whole app, and every acknowledged finding.

This is the only place a finding is acknowledged. Each acknowledgement names the exact
finding (bracketed where the rule reports several) on the narrowest construct that
produces it, with the reason it is accepted. ``cdk synth`` fails on anything else.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Acknowledgment, App, Stack, Validations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from stacks.constructs.api import EventsApi
from stacks.constructs.consumer import ConsumerStore, ReferenceConsumer
from stacks.constructs.messages_delivery import DELIVERY_BUCKET_LOGICAL_ID, MessagesDelivery
from stacks.constructs.messages_stream import MessagesStream
from stacks.constructs.router import Router
from stacks.constructs.worker_service import WorkerService
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import TRACING_OFF, TRACING_OTEL, TRACING_XRAY_SDK

_APIGW_LOGS_POLICY = (
    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
    "AmazonAPIGatewayPushToCloudWatchLogs]"
)


# What the worker task role's tracing grant is, per mode (stacks.tracing), for its reason.
_WORKER_TRACING_GRANTS = {
    TRACING_XRAY_SDK: "the X-Ray daemon's write and sampling calls (no resource-level permissions)",
    TRACING_OTEL: "the ADOT collector's xray:PutTraceSegments (no resource-level permissions)",
    TRACING_OFF: "nothing else (tracing is off: no X-Ray grant)",
}


def check_app(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def _acknowledge(construct: IConstruct, rule_id: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def acknowledge_stateful_findings(
    settings: EnvironmentSettings,
    *,
    messages_bucket: s3.IBucket,
    messages_stream: MessagesStream | None,
    messages_delivery: MessagesDelivery | None,
    consumer_store: ConsumerStore | None,
    tables: tuple[dynamodb.ITable, ...],
) -> None:
    """The stateful stack's findings, on its constructs (the stack passes them: this
    module is below the stacks and imports none of them)."""
    _acknowledge(
        messages_bucket,
        "AwsSolutions-S1",
        "No server access logs: every object is written by the worker task role and read "
        "through GETs the router presigns with its own role, only for IAM-authenticated API "
        "callers whose requests the API's access log records (caller, time, connection). An "
        "access-log bucket would be a second bucket, itself unlogged, recording what those "
        "logs already attribute; turn on CloudTrail S3 data events for an object-level audit.",
    )
    if messages_stream is not None and messages_stream.key is not None:
        _acknowledge(
            messages_stream.stream,
            "AwsSolutions-KDS3",
            "stream_kms is customer-managed in this environment, by choice: a key of the stack's own "
            "(rotation on) whose key policy and CloudTrail trail the operators hold, where the aws/kinesis "
            "key's are AWS's. The workers may use it only to generate data keys and the consumer only to "
            "decrypt, each only through Kinesis for this stream.",
        )
    if messages_delivery is not None:
        _acknowledge(
            messages_delivery.bucket,
            "AwsSolutions-S1",
            "No server access logs on the delivery stream's bucket: only Firehose's role writes objects "
            "(under frames/ and errors/), and Athena reads them for callers whose queries CloudTrail "
            "records; an access-log bucket would be a second bucket, itself unlogged. Turn on CloudTrail "
            "S3 data events for an object-level audit.",
        )
        for prefix in ("frames", "errors"):
            _acknowledge(
                messages_delivery.role,
                f"AwsSolutions-IAM5[Resource::<{DELIVERY_BUCKET_LOGICAL_ID}.Arn>/{prefix}/*]",
                f"Firehose's role writes the objects it delivers under {prefix}/ (names it makes: a partition "
                "path, the stream's name, a time and a random id), and reads and aborts its own uploads there: "
                "the prefix is the narrowest resource its objects have.",
            )
    if consumer_store is not None:
        _acknowledge(
            consumer_store.bucket,
            "AwsSolutions-S1",
            "No server access logs on the reference consumer's output: only its function's role writes "
            "objects (one per connection and batch, under its prefix) and nothing in the stack reads them; "
            "an access-log bucket would be a second bucket, itself unlogged. Turn on CloudTrail S3 data "
            "events for an object-level audit.",
        )
    if not settings.retain_data:
        for table in tables:
            _acknowledge(
                table,
                "AwsSolutions-DDB3",
                f"{settings.name} data is disposable (retain_data=False): no point-in-time "
                "recovery; prod enables it.",
            )


def acknowledge_service_findings(
    settings: EnvironmentSettings,
    *,
    api: EventsApi,
    router: Router,
    workers: WorkerService,
    consumer: ReferenceConsumer | None,
    message_objects_arn: str,
    consumer_objects_arn: str | None,
    upstream_secrets_arn: str,
) -> None:
    """The service stack's findings, on its constructs and the ARNs of its wildcard
    grants (the stack passes them: this module is below the stacks and imports none of
    them)."""
    rest_api = api.rest_api
    _acknowledge(
        rest_api,
        "AwsSolutions-COG4",
        "Callers are AWS principals (services, roles), not end users: the API uses IAM "
        "(SigV4) authorization on every method instead of a Cognito user pool.",
    )
    _acknowledge(
        rest_api.deployment_stage,
        "AwsSolutions-APIG3",
        "IAM authorization rejects unsigned requests before they reach the router, stage "
        "throttling bounds signed ones, and the request validator rejects bad bodies; a "
        "WAF web ACL ($5/month plus rules and requests) would add no control on top.",
    )
    _acknowledge(
        rest_api.node.find_child("CloudWatchRole"),
        _APIGW_LOGS_POLICY,
        "The account-level role API Gateway uses to write execution logs; the AWS managed "
        "policy is the documented one for it and is scoped to CloudWatch Logs.",
    )
    if settings.tracing.mode != TRACING_OFF:
        _acknowledge(
            router.role,
            "AwsSolutions-IAM5[Resource::*]",
            "Only X-Ray actions use '*': xray:PutTraceSegments and xray:PutTelemetryRecords (added by "
            "active tracing), and with otel exported straight to X-Ray's OTLP endpoint xray:PutSpans "
            "and xray:PutSpansForIndexing. X-Ray has no resource-level permissions. Data access is "
            "granted on the table and queue ARNs.",
        )
    objects = _wildcard_resource(router, message_objects_arn)
    _acknowledge(
        router.role,
        objects,
        "s3:GetObject on the objects under the messages prefix, the router's presigned "
        "reads of large message data: one object per (connection, seq), so no fixed ARN.",
    )
    if consumer is not None:
        _acknowledge(
            consumer.role,
            _wildcard_resource(consumer, consumer_objects_arn),
            "s3:PutObject on the objects under the reference consumer's prefix (CONSUMER_PREFIX), one per "
            "connection and batch, so no fixed ARN; nothing else in its bucket, and no other S3 action.",
        )
        _acknowledge(
            consumer.failure_queue,
            "AwsSolutions-SQS3",
            "This queue is itself a dead-letter destination: the reference consumer's event source "
            "mapping records here the batches it gave up on (their shard and sequence numbers). Nothing "
            "consumes it but an operator, so nothing could fail to process its messages.",
        )
    task_definition = workers.task_definition
    _acknowledge(
        task_definition.task_role,
        "AwsSolutions-IAM5[Resource::*]",
        f"Only {_WORKER_TRACING_GRANTS[settings.tracing.mode]} use '*' (the worker's metrics are log lines: no "
        "cloudwatch:PutMetricData). Data access is granted on the table, index and queue ARNs.",
    )
    _acknowledge(
        task_definition.task_role,
        objects,
        "s3:PutObject on the objects under the messages prefix, where the worker stores data "
        "too large for an item: one object per (connection, seq), so no fixed ARN; nothing "
        "else in the bucket, and no other S3 action.",
    )
    if settings.secret_prefix:
        _acknowledge(
            task_definition.task_role,
            _wildcard_resource(workers, upstream_secrets_arn),
            "secretsmanager:GetSecretValue and DescribeSecret (the wsfleet:hosts tag) on the secrets under "
            "the environment's upstream_secret_prefix (UPSTREAM_SECRET_PREFIX), in this account and region: "
            "callers name them per connection in START's secret_headers and secret_query, so no fixed ARN; "
            "the router refuses ARNs under any other prefix, and no other Secrets Manager action is granted.",
        )
    _acknowledge(
        task_definition.execution_role,
        "AwsSolutions-IAM5[Resource::*]",
        "ecr:GetAuthorizationToken, which ECS needs to pull the worker image, has no "
        "resource-level permissions; the image pull actions are on the asset repository.",
    )
    _acknowledge(
        task_definition,
        "AwsSolutions-ECS2",
        "The environment holds only non-secret configuration (resource names, timings, "
        "limits, the allowed secret name prefix, tracing settings, the ADOT collector's "
        "configuration from stacks/adot), which is how the worker is configured "
        "(CONTRACT section 2); upstream credentials are already in Secrets Manager, read by "
        "the worker at connect time, never through the task environment.",
    )


def _wildcard_resource(scope: IConstruct, arn: str) -> str:
    """cdk-nag's AwsSolutions-IAM5 finding for a resource ARN with a wildcard in it. The
    finding names the ARN as cdk-nag writes a CloudFormation reference out flat: joins
    joined, ``Ref``/``GetAtt`` as ``<name>``/``<resource.attribute>``, ``${...}`` as
    ``<...>``, any other function (a cross-stack ``Fn::GetStackOutput``) as its JSON."""

    def flat(node: Any) -> str:
        if isinstance(node, str):
            return node.replace("${", "<").replace("}", ">")
        if "Fn::Join" in node:
            delimiter, items = node["Fn::Join"]
            return delimiter.join(flat(item) for item in items)
        if "Fn::Sub" in node:
            return flat(node["Fn::Sub"])
        if "Fn::GetAtt" in node:
            resource, attribute = node["Fn::GetAtt"]
            return f"<{flat(resource)}.{flat(attribute)}>"
        if "Fn::ImportValue" in node:
            return flat(node["Fn::ImportValue"])
        if "Ref" in node:
            return f"<{flat(node['Ref'])}>"
        return json.dumps(node, separators=(",", ":"), ensure_ascii=False)

    return f"AwsSolutions-IAM5[Resource::{flat(Stack.of(scope).resolve(arn))}]"
