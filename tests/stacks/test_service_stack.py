"""The service stack: what the runtime needs from it (CONTRACT section 2) and the
invariants an operator relies on. Resources are found by type and by what they
reference, never by generated logical id."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aws_cdk import cx_api
from aws_cdk.assertions import Match

from stacks import runtime_assets, tracing
from stacks.constructs.api import EVENT_SCHEMA, INVALID_EVENT_MESSAGE
from stacks.constructs.messages_bucket import MESSAGES_BUCKET_LOGICAL_ID
from stacks.settings import FARGATE_MAX_STOP_TIMEOUT_SECONDS
from wsfleet import config, metrics, metrics_names, schema, settings_spec, stack_outputs
from wsfleet.leases import SessionTiming

# --- helpers ---------------------------------------------------------------------------


def _resources(env, type_: str, props: dict | None = None) -> dict[str, dict]:
    return env.service_template.find_resources(type_, {"Properties": props} if props else None)


def _only(found: dict[str, dict]) -> tuple[str, dict]:
    assert len(found) == 1, f"expected exactly one resource, found {sorted(found)}"
    return next(iter(found.items()))


def _task_definition(env) -> dict:
    return _only(_resources(env, "AWS::ECS::TaskDefinition"))[1]["Properties"]


def _container(env, name: str) -> dict:
    containers = {c["Name"]: c for c in _task_definition(env)["ContainerDefinitions"]}
    return containers[name]


def _worker_environment(env) -> dict[str, Any]:
    return {e["Name"]: e["Value"] for e in _container(env, "worker")["Environment"]}


def _router(env) -> dict:
    return _only(_resources(env, "AWS::Lambda::Function", {"Handler": "wsfleet.router.handler"}))[1]["Properties"]


def _statements_of_role(env, role_arn: dict) -> list[dict]:
    """Every policy statement attached to the role that ``role_arn`` (a GetAtt) names."""
    role_id = role_arn["Fn::GetAtt"][0]
    statements = []
    for policy in _resources(env, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def _actions(statement: dict) -> list[str]:
    actions = statement["Action"]
    return [actions] if isinstance(actions, str) else actions


def _granted(statements: list[dict], prefix: str) -> set[str]:
    return {a for s in statements for a in _actions(s) if a.startswith(prefix)}


def _grants_by_name(statements: list[dict], prefix: str, names: dict[str, str]) -> dict[str, set[str]]:
    """The ``prefix`` actions by the name ``names`` gives (keyed by its resolved JSON) to each
    resource they are granted on. A resource without a name fails."""
    grants: dict[str, set[str]] = {}
    for statement in statements:
        actions = [a for a in _actions(statement) if a.startswith(prefix)]
        if actions:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for resource in resources:
                grants.setdefault(names[json.dumps(resource, sort_keys=True)], set()).update(actions)
    return grants


def _dynamodb_grants(env, statements: list[dict]) -> dict[str, set[str]]:
    """DynamoDB actions by what they are granted on: "<table>" or "<table>/index/<name>",
    tables named by their attribute on the service stack. Any other resource fails."""
    stack = env.service
    names = {}
    for table in ("connections_table", "sessions_table", "messages_table"):
        arn = getattr(stack, table).table_arn
        names[json.dumps(stack.resolve(arn), sort_keys=True)] = table
        for index in (schema.OWNER_INDEX, schema.RING_INDEX, schema.MARKERS_INDEX):
            names[json.dumps(stack.resolve(f"{arn}/index/{index}"), sort_keys=True)] = f"{table}/index/{index}"
    return _grants_by_name(statements, "dynamodb:", names)


def _s3_grants(env, statements: list[dict]) -> dict[str, set[str]]:
    """S3 actions by what they are granted on: "<bucket>", "<bucket>/*" (every object) or
    "<bucket>/<messages prefix>*", the messages bucket as the service stack names it. Any
    other resource fails."""
    bucket = env.service.messages_bucket
    names = {
        json.dumps(env.service.resolve(arn), sort_keys=True): name
        for arn, name in (
            (bucket.bucket_arn, "<bucket>"),
            (bucket.arn_for_objects("*"), "<bucket>/*"),
            (bucket.arn_for_objects(f"{schema.MESSAGE_OBJECTS_PREFIX}*"), f"<bucket>/{schema.MESSAGE_OBJECTS_PREFIX}*"),
        )
    }
    return _grants_by_name(statements, "s3:", names)


def _all_statements(template) -> list[dict]:
    statements = []
    for type_ in ("AWS::IAM::Policy", "AWS::IAM::Role"):
        for resource in template.find_resources(type_).values():
            props = resource["Properties"]
            for policy in [props.get("PolicyDocument")] + [p["PolicyDocument"] for p in props.get("Policies", [])]:
                if policy:
                    statements += policy["Statement"]
    return statements


# --- API -------------------------------------------------------------------------------


def test_every_api_method_requires_iam_auth(env):
    methods = _resources(env, "AWS::ApiGateway::Method")
    assert {m["Properties"]["HttpMethod"] for m in methods.values()} == {"POST", "GET", "DELETE"}
    for method in methods.values():
        assert method["Properties"]["AuthorizationType"] == "AWS_IAM"


def test_post_events_is_validated_against_the_event_model(env):
    env.service_template.has_resource_properties(
        "AWS::ApiGateway::Method",
        {
            "HttpMethod": "POST",
            "RequestValidatorId": Match.any_value(),
            "RequestModels": {"application/json": Match.any_value()},
            "Integration": Match.object_like({"Type": "AWS_PROXY"}),
        },
    )
    env.service_template.has_resource_properties(
        "AWS::ApiGateway::RequestValidator", {"ValidateRequestBody": True, "ValidateRequestParameters": True}
    )
    env.service_template.has_resource_properties(
        "AWS::ApiGateway::Model", {"ContentType": "application/json", "Name": "Event"}
    )


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_get_and_delete_of_a_connection_require_its_path_parameter(env, method):
    env.service_template.has_resource_properties(
        "AWS::ApiGateway::Method",
        {
            "HttpMethod": method,
            "RequestParameters": {"method.request.path.connection_id": True},
            "RequestValidatorId": Match.any_value(),
        },
    )


def _path_of(env, resource_id: dict) -> str:
    """The full path of an API resource (a Ref), walked up its parents to the root."""
    resources = env.service_template.find_resources("AWS::ApiGateway::Resource")
    parts = []
    while "Ref" in resource_id and resource_id["Ref"] in resources:
        props = resources[resource_id["Ref"]]["Properties"]
        parts.insert(0, props["PathPart"])
        resource_id = props["ParentId"]
    assert resource_id == {"Fn::GetAtt": [_only(_resources(env, "AWS::ApiGateway::RestApi"))[0], "RootResourceId"]}
    return "/" + "/".join(parts)


def test_the_api_has_the_contract_routes_each_iam_authorized_and_proxied_to_the_router(env):
    routes = {}
    for method in _resources(env, "AWS::ApiGateway::Method").values():
        props = method["Properties"]
        routes[(props["HttpMethod"], _path_of(env, props["ResourceId"]))] = props
    assert set(routes) == {
        ("POST", "/events"),
        ("GET", "/connections/{connection_id}"),
        ("DELETE", "/connections/{connection_id}"),
        ("GET", "/connections/{connection_id}/messages"),
    }
    router_arn = env.service.resolve(env.service.router.function.function_arn)
    for props in routes.values():
        assert props["AuthorizationType"] == "AWS_IAM"
        assert props["Integration"]["Type"] == "AWS_PROXY"
        assert router_arn in props["Integration"]["Uri"]["Fn::Join"][1]


def test_get_messages_requires_its_path_parameter_and_documents_the_optional_paging_ones(env):
    env.service_template.has_resource_properties(
        "AWS::ApiGateway::Method",
        {
            "HttpMethod": "GET",
            "RequestParameters": {
                "method.request.path.connection_id": True,
                "method.request.querystring.after_seq": False,
                "method.request.querystring.limit": False,
            },
            "RequestValidatorId": Match.any_value(),
        },
    )


def test_api_gateway_may_invoke_the_router_on_the_messages_route(env):
    # LambdaIntegration adds one permission per method; the stage-scoped source ARN ends
    # in the method and path (path parameters as "*").
    source_arns = [
        "".join(p if isinstance(p, str) else "" for p in perm["Properties"]["SourceArn"]["Fn::Join"][1])
        for perm in _resources(env, "AWS::Lambda::Permission").values()
    ]
    assert any(arn.endswith("/GET/connections/*/messages") for arn in source_arns), source_arns


def _event_model(env) -> dict:
    return _only(_resources(env, "AWS::ApiGateway::Model"))[1]["Properties"]["Schema"]


@pytest.mark.parametrize(
    "event",
    [
        {"event_type": "START", "connection_id": "feed-1", "ws_url": "wss://feeds.example.com/a?x=1"},
        {"event_type": "STOP", "connection_id": "feed-1"},
        {"event_type": "STOP", "connection_id": "A.b_c:d-9"},
        {"event_type": "START", "connection_id": "x" * 128, "ws_url": "ws://h"},
        # Not the model's to refuse: the router answers these with its own codes.
        {"event_type": "START", "connection_id": "c", "ws_url": "https://not-a-websocket"},
        {"event_type": "STOP", "connection_id": "c", "extra": True},
    ],
)
def test_event_model_lets_every_contract_event_through(dev, event):
    jsonschema.Draft4Validator(_event_model(dev)).validate(event)


@pytest.mark.parametrize(
    "body",
    [
        [],
        "START",
        {"connection_id": "c"},
        {"event_type": "RESTART", "connection_id": "c"},
        {"event_type": "START", "connection_id": "c"},
        {"event_type": "START", "connection_id": "c", "ws_url": ""},
        {"event_type": "STOP", "connection_id": ""},
        {"event_type": "STOP", "connection_id": "has space"},
        {"event_type": "STOP", "connection_id": "x" * 129},
        {"event_type": "STOP", "connection_id": 7},
    ],
)
def test_event_model_refuses_only_what_the_contract_answers_with_400(dev, body):
    assert not jsonschema.Draft4Validator(_event_model(dev)).is_valid(body)


def test_event_model_in_the_template_is_the_construct_schema(env):
    assert _event_model(env)["title"] == EVENT_SCHEMA.title
    assert _event_model(env)["$schema"] == "http://json-schema.org/draft-04/schema#"


def test_gateway_errors_keep_the_contract_error_shape(env):
    responses = _resources(env, "AWS::ApiGateway::GatewayResponse")
    types = {r["Properties"]["ResponseType"] for r in responses.values()}
    assert types == {"BAD_REQUEST_BODY", "DEFAULT_4XX", "DEFAULT_5XX"}
    for response in responses.values():
        template = response["Properties"]["ResponseTemplates"]["application/json"]
        # API Gateway substitutes a quoted string for $context.error.messageString.
        body = json.loads(template.replace("$context.error.messageString", '"Forbidden"'))
        assert set(body) == {"error", "message"}
    invalid = next(r for r in responses.values() if r["Properties"]["ResponseType"] == "BAD_REQUEST_BODY")
    assert json.loads(invalid["Properties"]["ResponseTemplates"]["application/json"])["message"] == INVALID_EVENT_MESSAGE


def test_stage_throttles_traces_and_writes_json_access_logs(env):
    stage = _only(_resources(env, "AWS::ApiGateway::Stage"))[1]["Properties"]
    assert stage["TracingEnabled"] is True
    assert stage["MethodSettings"] == [
        {
            "HttpMethod": "*",
            "ResourcePath": "/*",
            "DataTraceEnabled": False,
            "LoggingLevel": "ERROR",
            "ThrottlingRateLimit": env.settings.api_rate_limit,
            "ThrottlingBurstLimit": env.settings.api_burst_limit,
        }
    ]
    access_log = json.loads(stage["AccessLogSetting"]["Format"])
    assert {"requestId", "status", "caller", "resourcePath"} <= set(access_log)


def test_api_name_is_unique_per_environment_so_its_metrics_are(env):
    env.service_template.has_resource_properties(
        "AWS::ApiGateway::RestApi", {"Name": f"wsfleet-{env.settings.name}-events"}
    )


# --- router ----------------------------------------------------------------------------


def test_router_runs_the_current_python_with_json_logs(env):
    # Its tracing (mode, layers) per environment: tests/stacks/test_stack_tracing.py.
    router = _router(env)
    assert router["Runtime"] == runtime_assets.LAMBDA_RUNTIME.name == "python3.14"
    assert router["LoggingConfig"]["LogFormat"] == "JSON"


def _sink_variables(env) -> set[str]:
    """The table where it is a sink; SINK where the sink is not the default (the table
    alone, left to the runtime's default); the stream where it is one."""
    return (
        ({settings_spec.MESSAGES_TABLE_NAME} if env.settings.stores_in_table else set())
        | ({settings_spec.SINK} if env.settings.sinks != schema.DEFAULT_SINKS else set())
        | ({settings_spec.MESSAGES_STREAM_NAME} if env.settings.has_stream else set())
    )


def _delivery_variables(env) -> set[str]:
    """The delivery stream's name, the worker's alone, where firehose is a sink."""
    return {settings_spec.MESSAGES_DELIVERY_STREAM_NAME} if env.settings.has_delivery else set()


def _tracing_variables(env, which: str) -> set[str]:
    """TRACING, and in otel the OTEL_* variables (tests/stacks/test_stack_tracing.py checks
    their values per mode)."""
    if which == "router":
        return set(tracing.router_environment(env.settings.tracing, "service", "region"))
    return set(tracing.worker_environment(env.settings.tracing, "service"))


def test_router_environment_is_what_the_contract_names(env):
    variables = _router(env)["Environment"]["Variables"]
    assert set(variables) == {
        settings_spec.TABLE_NAME,
        settings_spec.SESSIONS_TABLE_NAME,
        settings_spec.MESSAGES_BUCKET_NAME,
        settings_spec.QUEUE_URL,
        settings_spec.ALLOWED_WS_HOSTS,
        settings_spec.STATE_SHARDS,
        settings_spec.UPSTREAM_SECRET_PREFIX,
    } | _sink_variables(env) | _tracing_variables(env, "router")
    assert variables[settings_spec.ALLOWED_WS_HOSTS] == ",".join(env.settings.allowed_ws_hosts)
    assert variables[settings_spec.STATE_SHARDS] == str(env.settings.state_shards)


def test_router_environment_passes_the_routers_own_validation(env):
    variables = _router(env)["Environment"]["Variables"]
    literal = {k: v for k, v in variables.items() if isinstance(v, str)}
    tokens = {k: "resolved-at-deploy" for k, v in variables.items() if not isinstance(v, str)}
    # Lambda sets AWS_REGION itself.
    parsed = config.RouterConfig.from_env({**literal, **tokens, settings_spec.AWS_REGION: "us-east-1"})
    assert parsed.state_shards == env.settings.state_shards
    assert parsed.upstream_secret_prefix == env.settings.secret_prefix
    assert parsed.messages_table_name == parsed.messages_bucket_name == "resolved-at-deploy"
    assert parsed.sinks == env.settings.sinks


def test_router_may_write_connections_post_stops_read_messages_and_send_hints_only(env):
    statements = _statements_of_role(env, _router(env)["Role"])
    assert _dynamodb_grants(env, statements) == {
        # START and STOP: conditional writes of the desired state; GET reads it; DELETE of a STOPPED one.
        "connections_table": {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"},
        # STOP posts to the owning session's inbox; GET reads that session's expiry.
        "sessions_table": {"dynamodb:GetItem", "dynamodb:UpdateItem"},
        # GET .../messages reads a page; nothing writes messages but the workers.
        "messages_table": {"dynamodb:Query"},
        # GET counts the connection's skip markers.
        f"messages_table/index/{schema.MARKERS_INDEX}": {"dynamodb:Query"},
    }
    # Presigned GETs of large data are authorized as the router's own GetObject.
    assert _s3_grants(env, statements) == {f"<bucket>/{schema.MESSAGE_OBJECTS_PREFIX}*": {"s3:GetObject"}}
    assert _granted(statements, "sqs:") == {"sqs:SendMessage"}
    assert _granted(statements, "logs:") == {"logs:CreateLogStream", "logs:PutLogEvents"}
    # X-Ray: per tracing mode, tests/stacks/test_stack_tracing.py.
    # It checks secret_headers ARNs against the prefix; it never reads a secret.
    assert _granted(statements, "secretsmanager:") == _granted(statements, "kms:") == set()


# --- worker ----------------------------------------------------------------------------


def test_worker_stop_timeout_exceeds_its_shutdown_budget_within_fargates_limit(env):
    stop_timeout = _container(env, "worker")["StopTimeout"]
    shutdown = int(_worker_environment(env)[settings_spec.SHUTDOWN_SECONDS])
    assert shutdown < stop_timeout <= FARGATE_MAX_STOP_TIMEOUT_SECONDS


def test_worker_environment_is_what_the_contract_names(env):
    variables = _worker_environment(env)
    assert set(variables) == {
        settings_spec.TABLE_NAME,
        settings_spec.SESSIONS_TABLE_NAME,
        settings_spec.QUEUE_URL,
        settings_spec.AWS_REGION,
        settings_spec.LEASE_SECONDS,
        settings_spec.HEARTBEAT_SECONDS,
        settings_spec.RECONCILE_SECONDS,
        settings_spec.CHECKPOINT_SECONDS,
        settings_spec.FLUSH_INTERVAL_MS,
        settings_spec.MAX_CONNECTIONS,
        settings_spec.REBALANCE,
        settings_spec.REBALANCE_TOLERANCE,
        settings_spec.MAX_CLOCK_SKEW_MS,
        settings_spec.METRICS_NAMESPACE,
        settings_spec.SERVICE_NAME,
        settings_spec.STATE_SHARDS,
        settings_spec.SHUTDOWN_SECONDS,
        settings_spec.METRICS_SECONDS,
        settings_spec.MESSAGE_TTL_DAYS,
        settings_spec.MESSAGES_BUCKET_NAME,
        settings_spec.MAX_FRAME_BYTES,
        settings_spec.MAX_BUFFERED_BYTES,
        settings_spec.ALLOWED_WS_HOSTS,
        settings_spec.UPSTREAM_SECRET_PREFIX,
        settings_spec.SECRET_HOSTS_REQUIRED,
        settings_spec.UPSTREAM_PROXY,
    } | _sink_variables(env) | _delivery_variables(env) | _tracing_variables(env, "worker")
    # The same allow-list as the router's: the worker checks what the host names resolve to.
    assert variables[settings_spec.ALLOWED_WS_HOSTS] == _router(env)["Environment"]["Variables"][settings_spec.ALLOWED_WS_HOSTS]
    # On ECS the worker names itself from task metadata and talks to real AWS.
    assert settings_spec.WORKER_ID not in variables and settings_spec.AWS_ENDPOINT_URL not in variables


def test_worker_environment_passes_the_workers_own_validation(env):
    literal = {k: v for k, v in _worker_environment(env).items() if isinstance(v, str)}
    tokens = {k: "resolved-at-deploy" for k, v in _worker_environment(env).items() if not isinstance(v, str)}
    parsed = config.WorkerConfig.from_env({**literal, **tokens})
    # The failover bound the alarm uses is computed from this same timing.
    assert SessionTiming(parsed.lease_ms, parsed.heartbeat_ms, parsed.max_clock_skew_ms) == env.settings.session_timing
    assert parsed.reconcile_ms == env.settings.reconcile_seconds * 1000
    assert parsed.checkpoint_ms == env.settings.checkpoint_seconds * 1000
    assert parsed.flush_interval_ms == env.settings.flush_interval_ms
    assert parsed.max_connections == env.settings.max_connections_per_worker
    assert parsed.secret_hosts_required is env.settings.secret_hosts_required
    assert (parsed.rebalance, parsed.rebalance_tolerance) == (env.settings.rebalance, env.settings.rebalance_tolerance)
    assert parsed.max_frame_bytes == env.settings.max_frame_bytes == config.DEFAULT_MAX_FRAME_BYTES
    assert parsed.message_ttl_days == env.settings.message_ttl_days
    assert parsed.upstream_secret_prefix == env.settings.secret_prefix
    assert parsed.sinks == env.settings.sinks
    assert bool(parsed.messages_stream_name) == env.settings.has_stream
    # Frame bytes: half of what the worker container's memory (the task's, less its
    # tracing sidecar's reservation) leaves beside the frame decoder's child (32 MiB and
    # six frames at the limit), whatever cgroup limit the container sees on Fargate.
    sidecar_mib = {"xray-sdk": 64, "otel": 128, "off": 0}[env.settings.tracing.mode]
    decoder_mib = 32 + 6 * env.settings.max_frame_bytes // (1024 * 1024)
    assert parsed.max_buffered_bytes == (env.settings.worker_memory_mib - sidecar_mib - decoder_mib) * 1024 * 1024 // 2


def test_worker_and_router_name_the_stateful_stacks_tables(env):
    worker, router = _worker_environment(env), _router(env)["Environment"]["Variables"]
    stack = env.service
    for variable, table in (
        (settings_spec.TABLE_NAME, stack.connections_table),
        (settings_spec.SESSIONS_TABLE_NAME, stack.sessions_table),
        (settings_spec.MESSAGES_TABLE_NAME, stack.messages_table),
    ):
        assert worker[variable] == stack.resolve(table.table_name)
        assert router[variable] == worker[variable]


def test_worker_and_router_name_the_bucket_the_stateful_stack_outputs(env):
    worker, router = _worker_environment(env), _router(env)["Environment"]["Variables"]
    assert worker[settings_spec.MESSAGES_BUCKET_NAME] == router[settings_spec.MESSAGES_BUCKET_NAME] == {
        "Fn::GetStackOutput": {
            "StackName": env.stateful.stack_name,
            "OutputName": stack_outputs.MESSAGES_BUCKET_NAME,
            "Region": {"Ref": "AWS::Region"},
        }
    }
    env.stateful_template.has_output(
        stack_outputs.MESSAGES_BUCKET_NAME, {"Value": {"Ref": MESSAGES_BUCKET_LOGICAL_ID}}
    )


def test_worker_and_router_agree_on_state_shards(env):
    assert _worker_environment(env)[settings_spec.STATE_SHARDS] == _router(env)["Environment"]["Variables"][settings_spec.STATE_SHARDS]


def test_worker_logs_go_to_cloudwatch_without_blocking(env):
    options = _container(env, "worker")["LogConfiguration"]
    assert options["LogDriver"] == "awslogs"
    assert options["Options"]["mode"] == "non-blocking"


def test_worker_image_is_built_from_the_runtime_dockerfile_for_the_task_cpu(env):
    image = _container(env, "worker")["Image"]["Fn::Sub"]
    assert "container-assets" in image
    # Graviton unless the environment runs on Fargate Spot, which runs only x86_64.
    assert (env.settings.worker_architecture == "x86_64") == env.settings.use_fargate_spot
    assert _task_definition(env)["RuntimePlatform"] == {
        "CpuArchitecture": {"arm64": "ARM64", "x86_64": "X86_64"}[env.settings.worker_architecture],
        "OperatingSystemFamily": "LINUX",
    }


def test_service_deploys_with_rollback_and_never_below_capacity(env):
    env.service_template.has_resource_properties(
        "AWS::ECS::Service",
        {
            "DeploymentConfiguration": {
                "DeploymentCircuitBreaker": {"Enable": True, "Rollback": True},
                "MinimumHealthyPercent": 100,
                "MaximumPercent": 200,
            }
        },
    )


def test_tasks_run_in_private_subnets_with_no_public_ip_and_no_ingress(env):
    service = _only(_resources(env, "AWS::ECS::Service"))[1]["Properties"]
    network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    subnets = env.service_template.to_json()["Resources"]
    for ref in network["Subnets"]:
        subnet = subnets[ref["Ref"]]["Properties"]
        assert subnet["MapPublicIpOnLaunch"] is False
        assert {"Key": "aws-cdk:subnet-type", "Value": "Private"} in subnet["Tags"]
    for group in network["SecurityGroups"]:
        security_group = subnets[group["Fn::GetAtt"][0]]["Properties"]
        assert "SecurityGroupIngress" not in security_group
    assert not _resources(env, "AWS::EC2::SecurityGroupIngress")


def test_capacity_provider_is_spot_only_where_settings_say(env):
    expected = "FARGATE_SPOT" if env.settings.use_fargate_spot else "FARGATE"
    env.service_template.has_resource_properties(
        "AWS::ECS::Service", {"CapacityProviderStrategy": [{"CapacityProvider": expected, "Weight": 1}]}
    )


# --- scaling: the metric the worker publishes is the one the service scales on ---------


def test_service_scales_on_the_active_connections_metric_the_worker_publishes(env):
    variables = _worker_environment(env)
    published = metrics.metric_data(service_name=variables[settings_spec.SERVICE_NAME], active_connections=3, deltas={})
    gauge = next(d for d in published if d["MetricName"] == metrics_names.ACTIVE_CONNECTIONS)
    env.service_template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": Match.object_like(
                {
                    "CustomizedMetricSpecification": {
                        "MetricName": gauge["MetricName"],
                        "Namespace": variables[settings_spec.METRICS_NAMESPACE],
                        "Dimensions": gauge["Dimensions"],
                        "Statistic": "Average",
                    },
                    "TargetValue": env.settings.target_connections_per_worker,
                }
            ),
        },
    )
    assert variables[settings_spec.METRICS_NAMESPACE] == metrics_names.DEFAULT_NAMESPACE == "WsFleet"
    assert gauge["Dimensions"] == [{"Name": "ServiceName", "Value": env.settings.service_name}]


def test_scaling_bounds_keep_at_least_one_worker(env):
    env.service_template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {"MinCapacity": env.settings.min_workers, "MaxCapacity": env.settings.max_workers},
    )
    assert env.settings.min_workers >= 1


# --- worker permissions ------------------------------------------------------------------


def _worker_statements(env) -> list[dict]:
    return _statements_of_role(env, _task_definition(env)["TaskRoleArn"])


def test_worker_may_use_only_the_dynamodb_calls_it_makes(env):
    assert _dynamodb_grants(env, _worker_statements(env)) == {
        # acquire, checkpoint, release, free an orphan; read one back in the audit
        "connections_table": {"dynamodb:GetItem", "dynamodb:UpdateItem"},
        # what a session holds, the FREE# shards
        f"connections_table/index/{schema.OWNER_INDEX}": {"dynamodb:Query"},
        # open, renew, end; read the watched sessions
        "sessions_table": {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem"},
        # the watch ring
        f"sessions_table/index/{schema.RING_INDEX}": {"dynamodb:Query"},
        # store frames; find the stored end past a checkpoint
        "messages_table": {"dynamodb:BatchWriteItem", "dynamodb:Query"},
    }


def test_worker_may_only_put_objects_under_the_messages_prefix(env):
    assert _s3_grants(env, _worker_statements(env)) == {f"<bucket>/{schema.MESSAGE_OBJECTS_PREFIX}*": {"s3:PutObject"}}
    assert schema.message_object_key("c1", 7).startswith(schema.MESSAGE_OBJECTS_PREFIX)


def test_worker_may_only_consume_and_send_hints_on_its_queue(env):
    assert _granted(_worker_statements(env), "sqs:") == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:SendMessage",
    }


def test_worker_needs_no_cloudwatch_grant_its_metrics_are_log_lines(env):
    assert _granted(_worker_statements(env), "cloudwatch:") == set()


@pytest.mark.parametrize("stack", ["stateful", "service"])
def test_no_policy_grants_a_wildcard_action(env, stack):
    for statement in _all_statements(env.template(stack)):
        for action in _actions(statement):
            assert "*" not in action, statement


def test_data_actions_are_never_granted_on_every_resource(env):
    for statement in _all_statements(env.service_template):
        if any(a.startswith(("dynamodb:", "sqs:", "s3:")) for a in _actions(statement)):
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            assert "*" not in resources, statement


# --- network -----------------------------------------------------------------------------


def test_nat_gateways_and_free_gateway_endpoints_per_environment(env):
    assert len(_resources(env, "AWS::EC2::NatGateway")) == env.settings.nat_gateways
    endpoints = _resources(env, "AWS::EC2::VPCEndpoint")
    assert {e["Properties"]["VpcEndpointType"] for e in endpoints.values()} == {"Gateway"}
    assert len(endpoints) == 2  # DynamoDB and S3


# --- alarms ------------------------------------------------------------------------------


def _alarm(env, suffix: str) -> dict:
    name = f"wsfleet-{env.settings.name}-{suffix}"
    return _only(_resources(env, "AWS::CloudWatch::Alarm", {"AlarmName": name}))[1]["Properties"]


def test_alarm_when_a_hint_is_dead_lettered(env):
    alarm = _alarm(env, "start-hints-dead-lettered")
    assert alarm["Namespace"] == "AWS/SQS"
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert "DeadLetter" in json.dumps(alarm["Dimensions"])
    assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_alarm_on_router_errors_and_api_5xx(env):
    assert _alarm(env, "router-errors")["MetricName"] == "Errors"
    api = _alarm(env, "api-5xx")
    assert api["MetricName"] == "5XXError"
    assert api["Dimensions"] == [{"Name": "ApiName", "Value": f"wsfleet-{env.settings.name}-events"}]


def test_alarm_when_the_service_sits_at_max_capacity(env):
    alarm = _alarm(env, "workers-at-max-capacity")
    assert alarm["MetricName"] == "DesiredTaskCount"
    assert alarm["Threshold"] == env.settings.max_workers


def test_alarm_when_the_reachability_sweep_finds_any_connection_no_worker_would_take(env):
    alarm = _alarm(env, "connections-unreachable")
    assert alarm["Namespace"] == metrics_names.DEFAULT_NAMESPACE
    assert alarm["Dimensions"] == [
        {"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": env.settings.service_name}
    ]
    assert alarm["MetricName"] == metrics_names.UNREACHABLE_CONNECTIONS
    # Only the sweeping worker counts, and every one found is a broken invariant.
    assert alarm["Statistic"] == "Sum"
    assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["EvaluationPeriods"] == 1 and alarm["TreatMissingData"] == "notBreaching"


def test_alarm_when_connections_stay_unowned_past_the_failover_bound(env):
    alarm = _alarm(env, "connections-unowned")
    assert alarm["Namespace"] == metrics_names.DEFAULT_NAMESPACE
    assert alarm["Dimensions"] == [
        {"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": env.settings.service_name}
    ]
    assert alarm["MetricName"] == metrics_names.UNOWNED_CONNECTIONS
    # One worker counts for the fleet; while the summarizer changes hands two may
    # report for a minute, each with the whole count: the highest is the fleet's.
    assert alarm["Statistic"] == "Maximum"
    assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    # An episode no longer than the bound can straddle a period boundary, so it shows in
    # at most ceil(bound / period) + 1 periods: the alarm needs one more.
    bound = env.settings.failover_bound_seconds
    assert alarm["EvaluationPeriods"] == math.ceil(bound / alarm["Period"]) + 2
    assert alarm["TreatMissingData"] == "breaching"


def test_alarm_on_a_worker_whose_event_loop_keeps_stalling_for_a_second(env):
    alarm = _alarm(env, "worker-event-loop-stalled")
    assert (alarm["Namespace"], alarm["MetricName"]) == (metrics_names.DEFAULT_NAMESPACE, metrics_names.EVENT_LOOP_LAG)
    assert alarm["Dimensions"] == [
        {"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": env.settings.service_name}
    ]
    # Any worker's longest stall in a minute, in 3 of 5 minutes: a worker that keeps
    # stalling, not one GC pause.
    assert alarm["Statistic"] == "Maximum" and alarm["Period"] == 60
    assert alarm["Threshold"] == 1000 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert (alarm["DatapointsToAlarm"], alarm["EvaluationPeriods"]) == (3, 5)
    assert alarm["TreatMissingData"] == "notBreaching"


def test_alarm_on_any_connection_quarantined_by_the_crash_loop_breaker(env):
    alarm = _alarm(env, "connections-quarantined")
    assert (alarm["Namespace"], alarm["MetricName"]) == (metrics_names.DEFAULT_NAMESPACE, metrics_names.QUARANTINED_CONNECTIONS)
    assert alarm["Dimensions"] == [
        {"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": env.settings.service_name}
    ]
    assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["EvaluationPeriods"] == 1
    assert "wsfleet retry" in alarm["AlarmDescription"]


def test_alarm_on_any_worker_loop_error(env):
    alarm = _alarm(env, "worker-loop-errors")
    assert (alarm["Namespace"], alarm["MetricName"]) == (metrics_names.DEFAULT_NAMESPACE, metrics_names.LOOP_ERRORS)
    assert alarm["Dimensions"] == [
        {"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": env.settings.service_name}
    ]
    assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["EvaluationPeriods"] == 1
    assert alarm["TreatMissingData"] == "notBreaching"  # no worker reporting is the unowned alarm's to say


def test_worker_image_is_built_on_the_environments_base_image_and_a_tag_alone_is_a_warning(env):
    images = [
        image["source"]
        for manifest in Path(env.assembly.directory).glob("*.assets.json")
        for image in json.loads(manifest.read_text()).get("dockerImages", {}).values()
    ]
    assert [source.get("dockerBuildArgs") for source in images] == [{"PYTHON_IMAGE": env.settings.worker_base_image}]
    warnings = [
        message.entry.data
        for message in env.assembly.get_stack_by_name(env.service.stack_name).messages
        if message.level == cx_api.SynthesisMessageLevel.WARNING and "worker_base_image" in str(message.entry.data)
    ]
    pinned = "@sha256:" in env.settings.worker_base_image
    assert len(warnings) == (0 if pinned else 1)
    assert pinned or "pin it by digest" in warnings[0]
