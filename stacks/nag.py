"""cdk-nag's AwsSolutions pack on the whole app, and every acknowledged finding.

This is the only place a finding is acknowledged. Each acknowledgement names the exact
finding (bracketed where the rule reports several) on the narrowest construct that
produces it, with the reason it is accepted. ``cdk synth`` fails on anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, App, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from stacks.settings import EnvironmentSettings

if TYPE_CHECKING:
    from stacks.service_stack import ServiceStack
    from stacks.stateful_stack import StatefulStack

_APIGW_LOGS_POLICY = (
    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
    "AmazonAPIGatewayPushToCloudWatchLogs]"
)


def check_app(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def _acknowledge(construct: IConstruct, rule_id: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def acknowledge_stateful_findings(stack: "StatefulStack", settings: EnvironmentSettings) -> None:
    if not settings.retain_data:
        for table in (stack.tables.connections, stack.tables.sessions, stack.tables.messages):
            _acknowledge(
                table,
                "AwsSolutions-DDB3",
                f"{settings.name} data is disposable (retain_data=False): no point-in-time "
                "recovery; prod enables it.",
            )


def acknowledge_service_findings(stack: "ServiceStack", settings: EnvironmentSettings) -> None:
    rest_api = stack.api.rest_api
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
    _acknowledge(
        stack.router.role,
        "AwsSolutions-IAM5[Resource::*]",
        "Only xray:PutTraceSegments and xray:PutTelemetryRecords (added by active "
        "tracing) use '*': X-Ray has no resource-level permissions. Data access is "
        "granted on the table and queue ARNs.",
    )
    task_definition = stack.workers.task_definition
    _acknowledge(
        task_definition.task_role,
        "AwsSolutions-IAM5[Resource::*]",
        "Only cloudwatch:PutMetricData (which has no resource-level permissions and is "
        "limited to the fleet's namespace by a condition) and the X-Ray daemon's write "
        "and sampling calls (no resource-level permissions) use '*'. Data access is "
        "granted on the table, index and queue ARNs.",
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
        "limits), which is how the worker is configured (CONTRACT section 2); there are "
        "no secrets to move to Secrets Manager.",
    )
