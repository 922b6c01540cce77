"""Tracing per mode (stacks/tracing.py): what each environment's worker task and router
get for xray-sdk (prod), otel with the ADOT layer (dev), otel exporting straight to X-Ray
(dev, lambda_otel sdk) and off (dev, tracing off): the sidecar, the layers, the
variables, the X-Ray grants; the collector configurations in stacks/adot; the layer's
ARN per Region; bad settings refused with a sentence naming them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from aws_cdk import App, Environment, Stack
from aws_cdk import region_info
from cdk_nag import AwsSolutionsChecks

from stacks import tracing
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import XRAY_SDK_END_OF_SUPPORT, SettingsError, TracingSettings
from wsfleet import settings_spec

from tests.stacks.policies import actions, statements

ROUTER_HANDLER = "wsfleet.router.handler"


# --- helpers ---------------------------------------------------------------------------


def _containers(env) -> dict[str, dict]:
    (task,) = env.service_template.find_resources("AWS::ECS::TaskDefinition").values()
    return {c["Name"]: c for c in task["Properties"]["ContainerDefinitions"]}


def _variables(container: dict) -> dict:
    return {e["Name"]: e["Value"] for e in container.get("Environment", [])}


def _router(env) -> dict:
    (function,) = env.service_template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": ROUTER_HANDLER}}
    ).values()
    return function["Properties"]


def _xray(env, role) -> set[str]:
    return {a for s in statements(env, role) for a in actions(s) if a.startswith("xray:")}


def _stage(env) -> dict:
    (stage,) = env.service_template.find_resources("AWS::ApiGateway::Stage").values()
    return stage["Properties"]


def _region_join(value) -> str:
    """A Fn::Join of strings and the Region pseudo parameter, written out with <region>."""
    delimiter, parts = value["Fn::Join"]
    return delimiter.join("<region>" if p == {"Ref": "AWS::Region"} else p for p in parts)


def _config_layer_id(env) -> str:
    """The logical id of the layer that ships the Lambda collector's configuration."""
    (layer_id,) = [
        layer_id
        for layer_id, layer in env.service_template.find_resources("AWS::Lambda::LayerVersion").items()
        if "ADOT collector" in layer["Properties"].get("Description", "")
    ]
    return layer_id


def _all_actions(env) -> set[str]:
    return {
        a
        for policy in env.service_template.find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        for a in actions(s)
    }


# --- xray-sdk (prod) -------------------------------------------------------------------


def test_xray_sdk_runs_an_xray_daemon_sidecar_that_cannot_stop_the_task(prod):
    assert prod.settings.tracing.mode == "xray-sdk"
    containers = _containers(prod)
    assert set(containers) == {"worker", "xray-daemon"}
    daemon = containers["xray-daemon"]
    assert daemon["Image"] == tracing.XRAY_DAEMON_IMAGE
    assert re.fullmatch(r"public\.ecr\.aws/xray/aws-xray-daemon:\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", daemon["Image"])
    assert daemon["Essential"] is False
    assert daemon["MemoryReservation"] == tracing.XRAY_DAEMON_MEMORY_MIB
    assert daemon["PortMappings"] == [{"ContainerPort": 2000, "Protocol": "udp"}]
    assert daemon["LogConfiguration"]["LogDriver"] == "awslogs"
    assert _variables(containers["worker"])[settings_spec.TRACING] == "xray-sdk"
    assert not any(name.startswith("OTEL_") for name in _variables(containers["worker"]))


def test_xray_sdk_grants_the_task_role_what_the_daemon_calls_and_nothing_more(prod):
    assert _xray(prod, prod.service.workers.task_definition.task_role) == {
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "xray:GetSamplingRules",
        "xray:GetSamplingTargets",
    }


def test_xray_sdk_router_traces_actively_through_lambdas_daemon(prod):
    router = _router(prod)
    assert router["TracingConfig"] == {"Mode": "Active"}
    assert len(router["Layers"]) == 1  # its dependencies only
    assert router["Environment"]["Variables"][settings_spec.TRACING] == "xray-sdk"
    assert _xray(prod, prod.service.router.role) == {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    assert _stage(prod)["TracingEnabled"] is True


# --- otel: the worker's collector (dev) --------------------------------------------------


def test_otel_runs_a_pinned_adot_collector_sidecar_that_cannot_stop_the_task(dev):
    assert dev.settings.tracing.mode == "otel"
    containers = _containers(dev)
    assert set(containers) == {"worker", "adot-collector"}
    collector = containers["adot-collector"]
    assert collector["Image"] == tracing.ADOT_COLLECTOR_IMAGE
    assert re.fullmatch(r"public\.ecr\.aws/aws-observability/aws-otel-collector:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", collector["Image"])
    assert collector["Essential"] is False
    # A hard limit: a leaking collector is stopped, not the task that holds the leases.
    assert collector["MemoryReservation"] == collector["Memory"] == tracing.ADOT_COLLECTOR_MEMORY_MIB
    assert "PortMappings" not in collector  # the worker reaches it on the task's loopback


def test_otel_collector_runs_the_repos_config_and_logs_to_cloudwatch(dev):
    collector = _containers(dev)["adot-collector"]
    variables = _variables(collector)
    assert variables[tracing.AOT_CONFIG_CONTENT] == tracing.WORKER_COLLECTOR_CONFIG.read_text()
    assert variables["AWS_REGION"] == {"Ref": "AWS::Region"}
    assert variables["GOMEMLIMIT"] == tracing.ADOT_COLLECTOR_GOMEMLIMIT
    logs = collector["LogConfiguration"]
    assert logs["LogDriver"] == "awslogs"
    assert logs["Options"]["mode"] == "non-blocking"
    assert logs["Options"]["awslogs-group"] == _containers(dev)["worker"]["LogConfiguration"]["Options"]["awslogs-group"]


def test_otel_worker_exports_to_the_collector_beside_it(dev):
    variables = _variables(_containers(dev)["worker"])
    assert {k: v for k, v in variables.items() if k == settings_spec.TRACING or k.startswith("OTEL_")} == {
        "TRACING": "otel",
        "OTEL_SERVICE_NAME": dev.settings.service_name,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://localhost:4318/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.05",
    }
    # Frame bytes: half of what the task leaves the worker beside the collector and the
    # frame decoder (32 MiB and six 32 MiB frames).
    assert int(variables[settings_spec.MAX_BUFFERED_BYTES]) == (512 - 128 - 224) * 1024 * 1024 // 2


def test_otel_grants_the_task_role_only_the_collectors_segment_writes(dev):
    assert _xray(dev, dev.service.workers.task_definition.task_role) == {"xray:PutTraceSegments"}


# --- otel: the router, through the layer (dev) or straight to X-Ray (sdk) ---------------


def test_otel_layer_router_runs_the_adot_extension_with_the_repos_config(dev):
    router = _router(dev)
    # Ours by reference (the dependencies, the collector's config), AWS's by ARN.
    ours = {layer["Ref"] for layer in router["Layers"] if "Ref" in layer}
    assert ours == {
        dev.service.resolve(dev.service.router.dependencies.layer_version_arn)["Ref"],
        _config_layer_id(dev),
    }
    (adot,) = [layer for layer in router["Layers"] if "Ref" not in layer]
    assert _region_join(adot) == (
        "arn:aws:lambda:<region>:901920570463:layer:aws-otel-collector-amd64-ver-0-115-0:2"
    )
    variables = router["Environment"]["Variables"]
    assert variables["OPENTELEMETRY_COLLECTOR_CONFIG_URI"] == "file:/opt/lambda-collector.yaml"
    assert variables["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://localhost:4318/v1/traces"
    assert variables["OTEL_SERVICE_NAME"] == "wsfleet-dev-router"
    assert variables["TRACING"] == "otel"
    # API Gateway starts the trace; Lambda's own segments stay in it.
    assert router["TracingConfig"] == {"Mode": "Active"}
    assert _stage(dev)["TracingEnabled"] is True
    # The extension writes segments with the function's role, which active tracing grants.
    assert _xray(dev, dev.service.router.role) == {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}


def test_otel_layer_config_layer_ships_the_lambda_collector_config_alone(dev):
    config_layer = dev.service_template.to_json()["Resources"][_config_layer_id(dev)]
    asset_hash = config_layer["Properties"]["Content"]["S3Key"].removesuffix(".zip")
    manifest = json.loads(Path(dev.assembly.directory, f"{dev.service.stack_name}.assets.json").read_text())
    directory = Path(dev.assembly.directory, manifest["files"][asset_hash]["source"]["path"])
    assert [p.name for p in directory.iterdir()] == [tracing.LAMBDA_COLLECTOR_CONFIG.name]
    assert (directory / tracing.LAMBDA_COLLECTOR_CONFIG.name).read_text() == tracing.LAMBDA_COLLECTOR_CONFIG.read_text()


def test_otel_layer_template_refuses_a_region_without_the_layer(dev):
    rules = dev.service_template.to_json()["Rules"]
    (rule,) = [r for name, r in rules.items() if name.startswith("RouterAdotLayerRegion")]
    (assertion,) = rule["Assertions"]
    assert assertion["Assert"] == {"Fn::Contains": [list(tracing.ADOT_LAYER_REGIONS), {"Ref": "AWS::Region"}]}
    assert "tracing.lambda_otel" in assertion["AssertDescription"]


def test_otel_sdk_router_exports_straight_to_xrays_otlp_endpoint(otel_sdk):
    router = _router(otel_sdk)
    assert len(router["Layers"]) == 1
    variables = router["Environment"]["Variables"]
    assert _region_join(variables["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]) == "https://xray.<region>.amazonaws.com/v1/traces"
    assert "OPENTELEMETRY_COLLECTOR_CONFIG_URI" not in variables
    assert router["TracingConfig"] == {"Mode": "Active"}
    assert _xray(otel_sdk, otel_sdk.service.router.role) == {
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "xray:PutSpans",
        "xray:PutSpansForIndexing",
    }
    assert not any(name.startswith("RouterAdotLayerRegion") for name in otel_sdk.service_template.to_json()["Rules"])
    # The worker's path does not depend on the router's.
    assert set(_containers(otel_sdk)) == {"worker", "adot-collector"}


# --- off ---------------------------------------------------------------------------------


def test_off_deploys_no_sidecar_no_layer_and_no_xray_grant(tracing_off):
    containers = _containers(tracing_off)
    assert set(containers) == {"worker"}
    worker = _variables(containers["worker"])
    assert worker[settings_spec.TRACING] == "off"
    assert int(worker[settings_spec.MAX_BUFFERED_BYTES]) == (512 - 224) * 1024 * 1024 // 2
    router = _router(tracing_off)
    assert router["Environment"]["Variables"][settings_spec.TRACING] == "off"
    assert "TracingConfig" not in router and len(router["Layers"]) == 1
    assert _stage(tracing_off)["TracingEnabled"] is False
    assert not any(a.startswith("xray:") for a in _all_actions(tracing_off))
    assert not any(name.startswith("OTEL_") for name in worker)


@pytest.mark.parametrize("variant", ["tracing_off", "otel_sdk"])
def test_every_tracing_mode_passes_cdk_nag(variant, request):
    synthesized = request.getfixturevalue(variant)
    assert synthesized.validation_error is None
    assert AwsSolutionsChecks().validate_scope(synthesized.app).success


# --- the collector configurations in stacks/adot -----------------------------------------


def test_worker_collector_takes_otlp_http_on_loopback_limits_memory_batches_and_exports_to_xray():
    collector = yaml.safe_load(tracing.WORKER_COLLECTOR_CONFIG.read_text())
    assert collector["receivers"] == {"otlp": {"protocols": {"http": {"endpoint": f"localhost:{tracing.OTLP_HTTP_PORT}"}}}}
    (pipeline,) = collector["service"]["pipelines"].values()
    assert pipeline == {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"], "exporters": ["awsxray"]}
    limiter = collector["processors"]["memory_limiter"]
    assert limiter["limit_mib"] < tracing.ADOT_COLLECTOR_MEMORY_MIB
    assert int(tracing.ADOT_COLLECTOR_GOMEMLIMIT.removesuffix("MiB")) < tracing.ADOT_COLLECTOR_MEMORY_MIB
    assert set(collector["exporters"]) == {"awsxray"}
    assert tracing.LOCAL_OTLP_TRACES_ENDPOINT == f"http://localhost:{tracing.OTLP_HTTP_PORT}/v1/traces"


def test_lambda_collector_takes_otlp_http_on_loopback_and_exports_to_xray():
    collector = yaml.safe_load(tracing.LAMBDA_COLLECTOR_CONFIG.read_text())
    assert collector["receivers"] == {"otlp": {"protocols": {"http": {"endpoint": f"localhost:{tracing.OTLP_HTTP_PORT}"}}}}
    assert collector["service"]["pipelines"] == {"traces": {"receivers": ["otlp"], "exporters": ["awsxray"]}}


# --- the layer's ARN per Region ----------------------------------------------------------


def _stack_in(region: str) -> Stack:
    return Stack(App(), "S", env=Environment(account="111111111111", region=region))


@pytest.mark.parametrize("region", tracing.ADOT_LAYER_REGIONS)
def test_layer_arn_in_each_region_is_the_one_aws_publishes(region):
    arn = tracing.adot_layer_arn(_stack_in(region))
    assert arn == f"arn:aws:lambda:{region}:901920570463:layer:aws-otel-collector-amd64-ver-0-115-0:2"
    # aws-cdk-lib's own table of the ADOT layers agrees.
    assert arn == region_info.RegionInfo.get(region).adot_lambda_layer_arn("GENERIC", "0.115.0", "x86_64")


def test_the_layer_regions_are_exactly_those_aws_cdk_lib_knows_the_layer_in():
    known = {
        r.name for r in region_info.RegionInfo.regions if r.adot_lambda_layer_arn("GENERIC", "0.115.0", "x86_64")
    }
    assert known == set(tracing.ADOT_LAYER_REGIONS)


@pytest.mark.parametrize("region", ["af-south-1", "eu-central-2", "cn-north-1", "us-gov-west-1"])
def test_a_region_without_the_layer_is_refused_at_synth_with_a_sentence(region):
    with pytest.raises(SettingsError, match=rf"tracing\.lambda_otel is layer.* in {region}, .*set tracing\.lambda_otel to sdk"):
        tracing.adot_layer_arn(_stack_in(region))


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, named",
    [
        ({"mode": "xray"}, "tracing.mode"),
        ({"mode": "OTEL"}, "tracing.mode"),
        ({"lambda_otel": "extension"}, "tracing.lambda_otel"),
        ({"sample_ratio": 1.5}, "tracing.sample_ratio"),
        ({"sample_ratio": -0.1}, "tracing.sample_ratio"),
        ({"sample_ratio": "0.05"}, "tracing.sample_ratio"),
        ({"sample_ratio": True}, "tracing.sample_ratio"),
    ],
)
def test_bad_tracing_settings_are_refused_naming_the_setting(change, named):
    with pytest.raises(SettingsError, match=rf"^{re.escape(named)} must be .*, got "):
        TracingSettings(**change)


def test_tracing_must_be_tracing_settings():
    with pytest.raises(SettingsError, match=r"^tracing must be a TracingSettings"):
        EnvironmentSettings(name="x", tracing="otel")


def test_tracing_defaults_to_the_xray_sdk_and_dev_runs_otel_ahead_of_prod(dev, prod):
    assert TracingSettings().mode == "xray-sdk"
    assert dev.settings.tracing == TracingSettings(mode="otel", lambda_otel="layer", sample_ratio=0.05)
    assert prod.settings.tracing.mode == "xray-sdk"


def test_the_tracing_docs_name_what_is_pinned_and_the_switch_date():
    text = (Path(__file__).resolve().parents[2] / "docs" / "tracing.md").read_text(encoding="utf-8")
    section = text[text.index("## Tracing: per environment") :]
    for pinned in (
        tracing.ADOT_COLLECTOR_IMAGE,
        tracing.XRAY_DAEMON_IMAGE,
        f"{tracing.ADOT_LAYER_NAME}:{tracing.ADOT_LAYER_VERSION}",
        f"{tracing.ADOT_COLLECTOR_MEMORY_MIB} MiB",
        XRAY_SDK_END_OF_SUPPORT,
        tracing.LAMBDA_COLLECTOR_CONFIG_PATH,
        *tracing.OTLP_ENDPOINT_ACTIONS,
    ):
        assert pinned.removeprefix("xray:") in section, f"docs/tracing.md's per-environment section does not name {pinned}"
