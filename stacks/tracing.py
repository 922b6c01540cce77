"""What each tracing mode (``TracingSettings``; the runtime's ``TRACING``) deploys: the
worker task's sidecar, the router's layers, the variables each is given, and the X-Ray
actions each needs. The constructs and the service stack ask here; nothing else in
``stacks/`` names an image, a layer or an ``OTEL_*`` variable.

* ``xray-sdk``: the X-Ray SDK (supported until ``XRAY_SDK_END_OF_SUPPORT``). The worker
  sends segments to an X-Ray daemon sidecar over UDP; the router to Lambda's own daemon.
* ``otel``: the OpenTelemetry SDK, exporting OTLP/HTTP (protobuf). The worker exports to
  an ADOT collector sidecar (its image pinned, its config ``adot/worker-collector.yaml``),
  which sends to X-Ray. The router exports either to the AWS-managed ADOT collector
  extension layer (``layer``; config ``adot/lambda-collector.yaml``, in a layer of its
  own) or straight to X-Ray's OTLP endpoint, which the runtime signs with SigV4 (``sdk``;
  it needs Transaction Search on in the account, see docs/tracing.md).
* ``off``: no sidecar, no layer, no tracing on the function or the API stage, no X-Ray
  grant.

The sample ratio applies to traces the fleet starts itself; a trace that comes in (from
API Gateway, or a hint's ``AWSTraceHeader``) keeps its caller's sampling decision.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, CfnRule, CfnRuleAssertion, Fn, Stack, Token
from constructs import Construct

from stacks.settings_parts import LAMBDA_OTEL_LAYER, TRACING_OTEL, TRACING_XRAY_SDK, SettingsError, TracingSettings
from wsfleet.settings_spec import (
    OPENTELEMETRY_COLLECTOR_CONFIG_URI,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SERVICE_NAME,
    OTEL_TRACES_SAMPLER,
    OTEL_TRACES_SAMPLER_ARG,
    TRACING,
)

# Where the ADOT collector image reads its whole configuration from (the sidecar's own
# variable, not the worker's: no wsfleet process reads it).
AOT_CONFIG_CONTENT = "AOT_CONFIG_CONTENT"

# --- xray-sdk: the X-Ray daemon sidecar -------------------------------------------------
# Pinned by digest, as every image the stacks run (a tag can be moved to other bytes by
# whoever holds the repository; a digest cannot): 3.7.0's OCI index. Bump on purpose,
# resolving the new tag's digest with `docker buildx imagetools inspect <image>:<tag>`
# (the tag stays in the reference for people; the digest is what is pulled).
XRAY_DAEMON_IMAGE = (
    "public.ecr.aws/xray/aws-xray-daemon:3.7.0@sha256:b67576293f4d3a0a155f807244957ed0aa4bc945df1573d62d81380a1d548071"
)
XRAY_DAEMON_PORT = 2000
XRAY_DAEMON_MEMORY_MIB = 64  # its reservation: the worker's memory is the task's less this

# --- otel: the ADOT collector ---------------------------------------------------------------
# Pinned by digest (v0.49.0's OCI index, amd64 and arm64): a new collector may read its
# configuration differently. Bump it on purpose, with its release notes
# (github.com/aws-observability/aws-otel-collector/releases), resolving the digest as above.
ADOT_COLLECTOR_IMAGE = (
    "public.ecr.aws/aws-observability/aws-otel-collector:v0.49.0"
    "@sha256:d2bdfff2c377c3d71d78bd5d9ce9862fd535b12134a5739d87a07801297cf9fd"
)
# Its reservation and its hard limit: a collector that leaks is stopped at it (it is not
# essential) rather than eat into the memory of the worker that holds the leases.
ADOT_COLLECTOR_MEMORY_MIB = 128
# The Go runtime's soft limit, under the hard one; memory_limiter (in the config) refuses
# spans before either is reached.
ADOT_COLLECTOR_GOMEMLIMIT = "110MiB"
OTLP_HTTP_PORT = 4318
LOCAL_OTLP_TRACES_ENDPOINT = f"http://localhost:{OTLP_HTTP_PORT}/v1/traces"
OTLP_PROTOCOL = "http/protobuf"
SAMPLER = "parentbased_traceidratio"

ADOT_DIR = Path(__file__).resolve().parent / "adot"
WORKER_COLLECTOR_CONFIG = ADOT_DIR / "worker-collector.yaml"
LAMBDA_COLLECTOR_CONFIG = ADOT_DIR / "lambda-collector.yaml"
# Lambda extracts a layer's files under /opt.
LAMBDA_COLLECTOR_CONFIG_PATH = f"/opt/{LAMBDA_COLLECTOR_CONFIG.name}"

# The AWS-managed ADOT collector extension layer for x86_64 functions (ADOT Collector for
# Lambda v0.42.0), published by AWS's account in each Region below and nowhere else (the
# Regions aws-cdk-lib's region-info lists for it; tests/stacks/test_stack_tracing.py checks).
ADOT_LAYER_ACCOUNT = "901920570463"
ADOT_LAYER_NAME = "aws-otel-collector-amd64-ver-0-115-0"
ADOT_LAYER_VERSION = 2
ADOT_LAYER_REGIONS = (
    "ap-northeast-1", "ap-northeast-2", "ap-south-1", "ap-southeast-1", "ap-southeast-2",
    "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2", "eu-west-3",
    "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
)  # fmt: skip

# What the X-Ray daemon calls (AWSXRayDaemonWriteAccess less GetSamplingStatisticSummaries,
# which only a console reads): segments, its own telemetry, and the sampling rules and
# quotas it serves the SDK.
XRAY_DAEMON_ACTIONS = (
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
)
# What the collector's awsxray exporter calls (its own telemetry is off by default).
COLLECTOR_ACTIONS = ("xray:PutTraceSegments",)
# What X-Ray's OTLP endpoint authorizes a span export with (and its indexing for
# Transaction Search).
OTLP_ENDPOINT_ACTIONS = ("xray:PutSpans", "xray:PutSpansForIndexing")


def worker_sidecar_memory_mib(tracing: TracingSettings) -> int:
    """What the worker task's tracing sidecar reserves: the worker's memory is the task's
    less this."""
    return {TRACING_XRAY_SDK: XRAY_DAEMON_MEMORY_MIB, TRACING_OTEL: ADOT_COLLECTOR_MEMORY_MIB}.get(tracing.mode, 0)


def worker_environment(tracing: TracingSettings, service_name: str) -> dict[str, str]:
    """The worker's tracing variables: ``TRACING`` always (its default may change before
    the stacks do), and in otel where to export (the collector beside it) and how much
    to keep."""
    if tracing.mode != TRACING_OTEL:
        return {TRACING: tracing.mode}
    return _otel_environment(tracing, service_name, LOCAL_OTLP_TRACES_ENDPOINT)


def router_environment(tracing: TracingSettings, service_name: str, region: str) -> dict[str, str]:
    """The router's tracing variables; in otel, the endpoint of its path: the extension's
    receiver on the sandbox's loopback and its configuration file (``layer``), or X-Ray's
    OTLP endpoint in the function's Region (``sdk``)."""
    if tracing.mode != TRACING_OTEL:
        return {TRACING: tracing.mode}
    if tracing.lambda_otel == LAMBDA_OTEL_LAYER:
        return {
            **_otel_environment(tracing, service_name, LOCAL_OTLP_TRACES_ENDPOINT),
            OPENTELEMETRY_COLLECTOR_CONFIG_URI: f"file:{LAMBDA_COLLECTOR_CONFIG_PATH}",
        }
    return _otel_environment(tracing, service_name, xray_otlp_traces_endpoint(region))


def _otel_environment(tracing: TracingSettings, service_name: str, endpoint: str) -> dict[str, str]:
    return {
        TRACING: TRACING_OTEL,
        OTEL_SERVICE_NAME: service_name,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: endpoint,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: OTLP_PROTOCOL,
        OTEL_TRACES_SAMPLER: SAMPLER,
        OTEL_TRACES_SAMPLER_ARG: f"{tracing.sample_ratio:g}",
    }


def xray_otlp_traces_endpoint(region: str) -> str:
    """X-Ray's OTLP/HTTP traces endpoint in ``region`` (SigV4, service ``xray``)."""
    return f"https://xray.{region}.amazonaws.com/v1/traces"


def adot_layer_arn(scope: Construct) -> str:
    """The ADOT collector extension layer's ARN in the Region of ``scope``'s stack.

    A stack bound to a Region AWS publishes no layer in is refused here, at synth. An
    environment-agnostic stack (the app's) learns its Region only at deploy: a template
    rule refuses it there, with the same sentence, before any resource changes."""
    stack = Stack.of(scope)
    arn = f"arn:aws:lambda:{stack.region}:{ADOT_LAYER_ACCOUNT}:layer:{ADOT_LAYER_NAME}:{ADOT_LAYER_VERSION}"
    if not Token.is_unresolved(stack.region):
        if stack.region not in ADOT_LAYER_REGIONS:
            raise SettingsError(_no_layer_sentence(stack.region))
        return arn
    CfnRule(
        scope,
        "AdotLayerRegion",
        assertions=[
            CfnRuleAssertion(
                assert_=Fn.condition_contains(list(ADOT_LAYER_REGIONS), Aws.REGION),
                assert_description=_no_layer_sentence("the Region deployed to"),
            )
        ],
    )
    return arn


def _no_layer_sentence(region: str) -> str:
    return (
        f"tracing.lambda_otel is layer, but AWS publishes no ADOT collector layer ({ADOT_LAYER_NAME}) in "
        f"{region}, only in {', '.join(ADOT_LAYER_REGIONS)}: set tracing.lambda_otel to sdk (the router "
        "then exports straight to X-Ray) or deploy to one of those Regions."
    )
