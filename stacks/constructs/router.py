"""The event router: the Lambda function behind the API (``wsfleet.router.handler``)."""

from __future__ import annotations

from typing import Mapping

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks import runtime_assets, tracing
from stacks.settings_parts import LAMBDA_OTEL_LAYER, TRACING_OFF, TRACING_OTEL, TracingSettings

HANDLER = "wsfleet.router.handler"


class Router(Construct):
    """The function, its dependency layer, its log group and a role with nothing but log
    writes and tracing; the stack grants the data access.

    Active tracing is on unless tracing is off, in otel too: API Gateway starts the
    trace, and Lambda's own segments (the invocation, a cold start's init) sit between
    the stage's and the router's spans, under the trace id the runtime continues. In otel
    with ``lambda_otel`` layer the function also runs the ADOT collector extension, with
    its configuration from ``stacks/adot`` in a layer of its own."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        environment: Mapping[str, str],
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
        tracing_settings: TracingSettings,
    ) -> None:
        super().__init__(scope, id)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=removal_policy)
        # Our own role, so no AWS managed policy with logs:* on every log group.
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.log_group.grant_write(self.role)
        # Shared with the reference consumer, which runs the same code.
        self.dependencies = lambda_.LayerVersion(
            self,
            "Dependencies",
            code=runtime_assets.dependencies_layer_code(),
            compatible_runtimes=[runtime_assets.LAMBDA_RUNTIME],
            compatible_architectures=[runtime_assets.LAMBDA_ARCHITECTURE],
            description="wsfleet runtime dependencies (runtime/requirements.txt)",
        )
        layers: list[lambda_.ILayerVersion] = [self.dependencies]
        if tracing_settings.mode == TRACING_OTEL and tracing_settings.lambda_otel == LAMBDA_OTEL_LAYER:
            layers += [
                lambda_.LayerVersion.from_layer_version_arn(self, "AdotCollector", tracing.adot_layer_arn(self)),
                lambda_.LayerVersion(
                    self,
                    "AdotCollectorConfig",
                    code=lambda_.Code.from_asset(
                        str(tracing.ADOT_DIR), exclude=["*", f"!{tracing.LAMBDA_COLLECTOR_CONFIG.name}"]
                    ),
                    compatible_architectures=[runtime_assets.LAMBDA_ARCHITECTURE],
                    description=f"wsfleet's ADOT collector configuration ({tracing.LAMBDA_COLLECTOR_CONFIG_PATH})",
                ),
            ]
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=runtime_assets.LAMBDA_RUNTIME,
            architecture=runtime_assets.LAMBDA_ARCHITECTURE,
            handler=HANDLER,
            code=runtime_assets.router_code(),
            layers=layers,
            environment=dict(environment),
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            tracing=lambda_.Tracing.DISABLED if tracing_settings.mode == TRACING_OFF else lambda_.Tracing.ACTIVE,
            memory_size=256,
            # Every request is at most a few DynamoDB calls and one SendMessage; well
            # under API Gateway's 29 s integration limit.
            timeout=Duration.seconds(10),
        )
