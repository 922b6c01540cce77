"""The worker fleet: an ECS Fargate service of ``python -m wsfleet.worker`` tasks, each
with its tracing mode's sidecar (an X-Ray daemon, an ADOT collector, or none; see
``stacks/tracing.py``), scaled on the fleet's own ActiveConnections metric.

Deployments start the new tasks before stopping old ones (100 % / 200 %), so capacity
never dips; a stopped task releases its leases in its SIGTERM budget and the others take
its connections over. The circuit breaker rolls back a deployment whose tasks keep dying.
"""

from __future__ import annotations

from typing import Mapping

from aws_cdk import Annotations, Duration, RemovalPolicy, Size, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks import runtime_assets, tracing
from stacks.settings import IMAGE_DIGEST
from stacks.settings_parts import TRACING_OTEL, TRACING_XRAY_SDK, TracingSettings

# Scale out quickly when connections pile up; scale in slowly, because every task
# removed hands its connections over (a reconnect and a replay for each).
SCALE_OUT_COOLDOWN = Duration.minutes(1)
SCALE_IN_COOLDOWN = Duration.minutes(10)


class WorkerService(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        environment: Mapping[str, str],
        cpu: int,
        memory_mib: int,
        stop_timeout: Duration,
        use_fargate_spot: bool,
        architecture: str,
        base_image: str,
        min_capacity: int,
        max_capacity: int,
        scaling_metric: cloudwatch.Metric,
        scaling_target: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
        tracing_settings: TracingSettings,
    ) -> None:
        super().__init__(scope, id)
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            vpc=vpc,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
            enable_fargate_capacity_providers=True,
        )
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=removal_policy)

        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=cpu,
            memory_limit_mib=memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=runtime_assets.worker_cpu_architecture(architecture),
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        if not IMAGE_DIGEST.search(base_image):
            Annotations.of(self).add_warning_v2(
                "wsfleet:worker-base-image-unpinned",
                f"worker_base_image {base_image!r} is a tag, which its repository can move to other bytes: pin it "
                "by digest in the environment's file (worker_base_image = \"<image>:<tag>@sha256:<digest>\", the "
                "digest from `docker buildx imagetools inspect <image>:<tag>`)",
            )
        self.task_definition.add_container(
            "worker",
            image=runtime_assets.worker_image(architecture, base_image),
            environment=dict(environment),
            essential=True,
            stop_timeout=stop_timeout,
            # The worker writes JSON lines to stdout; non-blocking so that a slow log
            # service can never stall the event loop that renews leases.
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix="worker",
                log_group=self.log_group,
                mode=ecs.AwsLogDriverMode.NON_BLOCKING,
                max_buffer_size=Size.mebibytes(25),
            ),
        )
        self._add_tracing_sidecar(tracing_settings)

        # Outbound only: nothing ever connects to a worker.
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, description="wsfleet workers: no ingress", allow_all_outbound=True
        )
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            vpc_subnets=subnets,
            assign_public_ip=False,
            security_groups=[self.security_group],
            capacity_provider_strategies=[
                ecs.CapacityProviderStrategy(
                    capacity_provider="FARGATE_SPOT" if use_fargate_spot else "FARGATE", weight=1
                )
            ],
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            min_healthy_percent=100,
            max_healthy_percent=200,
            enable_ecs_managed_tags=True,
            propagate_tags=ecs.PropagatedTagSource.SERVICE,
        )

        self.scaling = self.service.auto_scale_task_count(min_capacity=min_capacity, max_capacity=max_capacity)
        self.scaling.scale_to_track_custom_metric(
            "ActiveConnections",
            metric=scaling_metric,
            target_value=scaling_target,
            scale_out_cooldown=SCALE_OUT_COOLDOWN,
            scale_in_cooldown=SCALE_IN_COOLDOWN,
        )

    def _add_tracing_sidecar(self, tracing_settings: TracingSettings) -> None:
        """The mode's sidecar, never essential: losing traces must not stop a task that
        holds leases. Its memory is reserved out of the task's
        (``tracing.worker_sidecar_memory_mib``); its logs go beside the worker's. The
        worker does not wait for it either: a sidecar whose image cannot be pulled must
        not keep a worker from starting, and the spans exported before it listens are
        dropped by the worker's exporter, nothing else."""
        if tracing_settings.mode == TRACING_XRAY_SDK:
            name, stream_prefix, options = "xray-daemon", "xray", dict(
                image=ecs.ContainerImage.from_registry(tracing.XRAY_DAEMON_IMAGE),
                memory_reservation_mib=tracing.XRAY_DAEMON_MEMORY_MIB,
                port_mappings=[ecs.PortMapping(container_port=tracing.XRAY_DAEMON_PORT, protocol=ecs.Protocol.UDP)],
            )
        elif tracing_settings.mode == TRACING_OTEL:
            name, stream_prefix, options = "adot-collector", "adot", dict(
                image=ecs.ContainerImage.from_registry(tracing.ADOT_COLLECTOR_IMAGE),
                memory_reservation_mib=tracing.ADOT_COLLECTOR_MEMORY_MIB,
                memory_limit_mib=tracing.ADOT_COLLECTOR_MEMORY_MIB,
                environment={
                    tracing.AOT_CONFIG_CONTENT: tracing.WORKER_COLLECTOR_CONFIG.read_text(),
                    "AWS_REGION": Stack.of(self).region,
                    "GOMEMLIMIT": tracing.ADOT_COLLECTOR_GOMEMLIMIT,
                },
            )
        else:
            return
        self.task_definition.add_container(
            name,
            essential=False,
            cpu=32,
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix=stream_prefix, log_group=self.log_group, mode=ecs.AwsLogDriverMode.NON_BLOCKING
            ),
            **options,
        )
