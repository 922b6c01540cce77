"""The messages stream (issue 21): the settings that choose it, checked as the runtime
parses SINK; the stream itself; what reaches the worker and the router; the worker's
grant narrowed to PutRecords on that stream; and the stream's alarms.

dev runs the three sinks, the stream under a customer-managed key; ``kinesis_only`` is dev synthesized
with ``-c sink=kinesis -c stream_kms=aws-managed``; prod has no stream. Resources are
found by type and by what they reference, never by generated logical id."""

from __future__ import annotations

import dataclasses
import json

import pytest
from aws_cdk.assertions import Template

from app import ENVIRONMENTS, create_stacks
from stacks.constructs.consumer import CONSUMER_BUCKET_LOGICAL_ID, CONSUMER_TABLE_LOGICAL_ID
from stacks.constructs.messages_stream import MESSAGES_STREAM_KEY_LOGICAL_ID, MESSAGES_STREAM_LOGICAL_ID
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import ConsumerSettings, SettingsError
from stacks.synth import with_context
from stacks.stateful_stack import StatefulStack
from wsfleet import config, metrics_names, schema, settings_spec, stack_outputs

from tests.stacks.policies import actions, statements

# --- helpers ---------------------------------------------------------------------------


def _touching(found: list[dict], prefix: str) -> list[dict]:
    return [s for s in found if any(a.startswith(prefix) for a in actions(s))]


def _worker_role(env):
    return env.service.workers.task_definition.task_role


def _container_environment(env) -> dict:
    (task,) = env.service_template.find_resources("AWS::ECS::TaskDefinition").values()
    (worker,) = [c for c in task["Properties"]["ContainerDefinitions"] if c["Name"] == "worker"]
    return {e["Name"]: e["Value"] for e in worker["Environment"]}


def _router_environment(env) -> dict:
    (router,) = env.service_template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": "wsfleet.router.handler"}}
    ).values()
    return router["Properties"]["Environment"]["Variables"]


def _resolved(env, value) -> object:
    return env.service.resolve(value)


def _alarm(env, suffix: str) -> dict:
    (alarm,) = env.service_template.find_resources(
        "AWS::CloudWatch::Alarm", {"Properties": {"AlarmName": f"wsfleet-{env.settings.name}-{suffix}"}}
    ).values()
    return alarm["Properties"]


# --- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, named",
    [
        ({"sink": "kafka"}, "sink"),
        ({"sink": "dynamodb,"}, "sink"),
        ({"sink": " "}, "sink"),
        ({"stream_retention_hours": 23}, "stream_retention_hours"),
        ({"stream_retention_hours": 8761}, "stream_retention_hours"),
        ({"stream_kms": "alias/mine"}, "stream_kms"),
        # dev deploys the reference consumer: it needs a stream to read.
        ({"sink": "dynamodb"}, "consumer"),
        # An object of large data must outlive the record that points at it.
        ({"message_ttl_days": 1, "stream_retention_hours": 48}, "message_ttl_days"),
        # The lag alarm must fire before records leave the stream.
        ({"consumer": ConsumerSettings(iterator_age_alarm_seconds=24 * 3600)}, "iterator_age_alarm_seconds"),
    ],
)
def test_inconsistent_stream_settings_are_refused_with_the_setting_named(change, named):
    with pytest.raises(SettingsError, match=named):
        dataclasses.replace(ENVIRONMENTS["dev"], **change)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"batch_size": 0}, "consumer.batch_size"),
        ({"batch_size": 10_001}, "consumer.batch_size"),
        ({"max_batching_window_seconds": -1}, "consumer.max_batching_window_seconds"),
        ({"max_batching_window_seconds": 301}, "consumer.max_batching_window_seconds"),
        ({"starting_position": "AT_TIMESTAMP"}, "consumer.starting_position"),
        ({"retry_attempts": -1}, "consumer.retry_attempts"),
        ({"retry_attempts": 10_001}, "consumer.retry_attempts"),
        ({"prefix": ""}, "consumer.prefix"),  # the consumer would write under frames/
        ({"prefix": "/frames/"}, "consumer.prefix"),
        ({"prefix": "fr ames/"}, "consumer.prefix"),
        ({"prefix": " frames/"}, "consumer.prefix"),
        ({"output_ttl_days": -1}, "consumer.output_ttl_days"),
        ({"iterator_age_alarm_seconds": 30}, "consumer.iterator_age_alarm_seconds"),
    ],
)
def test_bad_consumer_settings_are_refused_with_the_setting_named(change, named):
    with pytest.raises(SettingsError, match=named.replace(".", r"\.")):
        ConsumerSettings(**change)


@pytest.mark.parametrize("raw", ["dynamodb", "kinesis", "kinesis,dynamodb", " Kinesis , DynamoDB "])
def test_the_sink_setting_is_parsed_by_the_runtimes_own_rules(raw):
    settings = EnvironmentSettings(name="x", sink=raw)
    assert settings.sinks == config.sinks({settings_spec.SINK: raw})
    assert settings.has_stream == (schema.SINK_KINESIS in settings.sinks)
    assert settings.stores_in_table == (schema.SINK_DYNAMODB in settings.sinks)


def test_the_default_sink_is_the_table_alone_with_no_consumer():
    settings = EnvironmentSettings(name="x")
    assert settings.sinks == schema.DEFAULT_SINKS == (schema.SINK_DYNAMODB,)
    assert settings.consumer is None and not settings.has_stream


def test_context_overrides_the_sink_the_stream_and_the_consumer():
    context = {"sink": "dynamodb,kinesis", "stream_retention_hours": "48", "stream_kms": "customer-managed"}
    prod = with_context(ENVIRONMENTS["prod"], {**context, "consumer": "on"}.get)
    assert prod.sinks == ("dynamodb", "kinesis")
    assert (prod.stream_retention_hours, prod.stream_kms) == (48, "customer-managed")
    assert prod.consumer == ConsumerSettings()
    # dev keeps its own consumer settings when switched on, and can switch it off.
    assert with_context(ENVIRONMENTS["dev"], {"consumer": "on"}.get) == ENVIRONMENTS["dev"]
    assert with_context(ENVIRONMENTS["dev"], {"consumer": "off"}.get).consumer is None
    assert with_context(ENVIRONMENTS["prod"], {}.get) is ENVIRONMENTS["prod"]


@pytest.mark.parametrize(
    "context, named",
    [
        ({"sink": "kafka"}, "sink"),
        ({"stream_retention_hours": "a day"}, "stream_retention_hours"),
        ({"stream_retention_hours": "9000"}, "stream_retention_hours"),
        ({"consumer": "maybe"}, "consumer"),
        ({"consumer": "on"}, "consumer needs a stream"),  # prod's sink is the table alone
    ],
)
def test_a_bad_context_value_stops_the_synth_naming_it(new_app, context, named):
    app = new_app("prod")
    for key, value in context.items():
        app.node.set_context(key, value)
    with pytest.raises(SystemExit, match=named):
        create_stacks(app)


# --- the stream -----------------------------------------------------------------------------


def _stream(env) -> dict:
    return env.stateful_template.to_json()["Resources"][MESSAGES_STREAM_LOGICAL_ID]


def test_dev_stream_is_one_provisioned_shard_kept_a_day_and_encrypted_with_its_own_rotated_key(dev):
    stream = _stream(dev)
    assert stream["Type"] == "AWS::Kinesis::Stream"
    props = stream["Properties"]
    # One shard costs less than an on-demand stream's hourly charge (the plan prices both).
    assert props["StreamModeDetails"] == {"StreamMode": "PROVISIONED"}
    assert props["ShardCount"] == dev.settings.stream_shards == 1
    assert props["RetentionPeriodHours"] == dev.settings.stream_retention_hours == 24
    assert props["StreamEncryption"] == {
        "EncryptionType": "KMS",
        "KeyId": {"Fn::GetAtt": [MESSAGES_STREAM_KEY_LOGICAL_ID, "Arn"]},
    }
    key = dev.stateful_template.to_json()["Resources"][MESSAGES_STREAM_KEY_LOGICAL_ID]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    # dev's data is disposable: the stream and its key go with the stack.
    assert stream["DeletionPolicy"] == key["DeletionPolicy"] == "Delete"


def test_with_the_aws_managed_key_the_stream_uses_aws_kinesis_and_the_stack_has_no_key(kinesis_only):
    assert _stream(kinesis_only)["Properties"]["StreamEncryption"] == {
        "EncryptionType": "KMS",
        "KeyId": "alias/aws/kinesis",
    }
    assert not kinesis_only.stateful_template.find_resources("AWS::KMS::Key")


def test_the_stream_its_key_and_the_consumers_data_are_retained_where_data_is_kept(new_app):
    settings = EnvironmentSettings(
        name="keep",
        retain_data=True,
        sink="kinesis",
        stream_kms="customer-managed",
        stream_retention_hours=168,
        message_ttl_days=7,
        consumer=ConsumerSettings(),
    )
    resources = Template.from_stack(StatefulStack(new_app("prod"), "keep-stateful", settings=settings)).to_json()[
        "Resources"
    ]
    stream, key = resources[MESSAGES_STREAM_LOGICAL_ID], resources[MESSAGES_STREAM_KEY_LOGICAL_ID]
    consumer_data = resources[CONSUMER_BUCKET_LOGICAL_ID], resources[CONSUMER_TABLE_LOGICAL_ID]
    for resource in (stream, key, *consumer_data):
        assert (resource["DeletionPolicy"], resource["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert resources[CONSUMER_TABLE_LOGICAL_ID]["Properties"]["DeletionProtectionEnabled"] is True
    assert stream["Properties"]["RetentionPeriodHours"] == 168
    # The messages table stays whatever the sink.
    assert resources["MessagesTable"]["Type"] == "AWS::DynamoDB::Table"


def test_prod_has_no_stream_no_key_and_no_consumer(prod):
    for type_ in ("AWS::Kinesis::Stream", "AWS::KMS::Key"):
        assert not prod.stateful_template.find_resources(type_)
    assert not prod.service_template.find_resources("AWS::Lambda::EventSourceMapping")
    assert stack_outputs.MESSAGES_STREAM_NAME not in prod.stateful_template.to_json()["Outputs"]
    assert settings_spec.SINK not in _container_environment(prod) and settings_spec.SINK not in _router_environment(prod)


@pytest.mark.parametrize("which", ["dev", "kinesis_only"])
def test_the_stream_name_is_a_stack_output_and_what_worker_and_router_are_given(request, which):
    env = request.getfixturevalue(which)
    env.stateful_template.has_output(
        stack_outputs.MESSAGES_STREAM_NAME, {"Value": {"Ref": MESSAGES_STREAM_LOGICAL_ID}}
    )
    name = _resolved(env, env.service.messages_stream.stream_name)
    assert _container_environment(env)[settings_spec.MESSAGES_STREAM_NAME] == name
    assert _router_environment(env)[settings_spec.MESSAGES_STREAM_NAME] == name


@pytest.mark.parametrize("which", ["dev", "kinesis_only"])
def test_sink_reaches_worker_and_router_as_they_parse_it(request, which):
    env = request.getfixturevalue(which)
    for variables, parse in (
        (_container_environment(env), config.WorkerConfig.from_env),
        ({**_router_environment(env), settings_spec.AWS_REGION: "us-east-1"}, config.RouterConfig.from_env),
    ):
        assert variables[settings_spec.SINK] == ",".join(env.settings.sinks)
        literal = {k: v for k, v in variables.items() if isinstance(v, str)}
        tokens = {k: "resolved-at-deploy" for k, v in variables.items() if not isinstance(v, str)}
        parsed = parse({**literal, **tokens})
        assert parsed.sinks == env.settings.sinks
        assert parsed.messages_stream_name == "resolved-at-deploy"


# --- grants -----------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["dev", "kinesis_only"])
def test_the_worker_may_put_records_on_that_stream_and_do_nothing_else_with_kinesis(request, which):
    env = request.getfixturevalue(which)
    assert _touching(statements(env, _worker_role(env)), "kinesis:") == [
        {
            "Action": "kinesis:PutRecords",
            "Effect": "Allow",
            "Resource": _resolved(env, env.service.messages_stream.stream_arn),
        }
    ]


def test_with_its_own_key_the_worker_may_only_generate_data_keys_through_kinesis_for_that_stream(dev):
    (kms,) = [s for s in _touching(statements(dev, _worker_role(dev)), "kms:") if "kinesis." in json.dumps(s)]
    assert kms == {
        "Action": "kms:GenerateDataKey",
        "Effect": "Allow",
        "Resource": _resolved(dev, dev.service.stream_key.key_arn),
        "Condition": {
            "StringEquals": {
                "kms:ViaService": {"Fn::Join": ["", ["kinesis.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]},
                # Kinesis passes the stream's ARN as the encryption context of every call.
                "kms:EncryptionContext:aws:kinesis:arn": _resolved(dev, dev.service.messages_stream.stream_arn),
            }
        },
    }


def test_with_the_aws_managed_key_no_role_may_use_kms(kinesis_only):
    for policy in kinesis_only.service_template.find_resources("AWS::IAM::Policy").values():
        assert not _touching(policy["Properties"]["PolicyDocument"]["Statement"], "kms:"), policy


@pytest.mark.parametrize("which", ["dev", "prod", "kinesis_only"])
def test_the_router_has_no_kinesis_grant(request, which):
    env = request.getfixturevalue(which)
    router = statements(env, env.service.router.role)
    assert not _touching(router, "kinesis:") and not _touching(router, "kms:")


def test_where_the_table_is_not_a_sink_nothing_is_granted_on_it_nor_named(kinesis_only):
    env = kinesis_only
    messages = json.dumps(_resolved(env, env.service.messages_table.table_arn))
    for role in (_worker_role(env), env.service.router.role):
        for statement in statements(env, role):
            assert messages not in json.dumps(statement), statement
    assert settings_spec.MESSAGES_TABLE_NAME not in _container_environment(env)
    assert settings_spec.MESSAGES_TABLE_NAME not in _router_environment(env)
    # The read API answers 409 without reading: no presigned GETs either. The worker
    # still stores large data in the bucket, and the record points at it.
    assert not _touching(statements(env, env.service.router.role), "s3:")
    assert [actions(s) for s in _touching(statements(env, _worker_role(env)), "s3:")] == [["s3:PutObject"]]
    # The table itself stays.
    assert env.stateful_template.find_resources("AWS::DynamoDB::Table", {"Properties": {"KeySchema": [
        {"AttributeName": schema.MSG_PK, "KeyType": "HASH"}, {"AttributeName": schema.MSG_SK, "KeyType": "RANGE"}
    ]}})


# --- alarms -------------------------------------------------------------------------------------


def test_alarm_when_the_stream_refuses_writes_for_throughput(dev):
    alarm = _alarm(dev, "stream-write-throttled")
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/Kinesis", "WriteProvisionedThroughputExceeded")
    assert alarm["Dimensions"] == [
        {"Name": "StreamName", "Value": _resolved(dev, dev.service.messages_stream.stream_name)}
    ]
    assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"


def test_alarm_when_workers_have_records_throttled(dev):
    alarm = _alarm(dev, "worker-records-throttled")
    assert (alarm["Namespace"], alarm["MetricName"]) == (
        metrics_names.DEFAULT_NAMESPACE,
        metrics_names.RECORDS_THROTTLED,
    )
    assert alarm["Dimensions"] == [{"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": dev.settings.service_name}]
    assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


_EVERY_ENVIRONMENTS_ALARMS = {
    "start-hints-dead-lettered",
    "router-errors",
    "api-5xx",
    "workers-at-max-capacity",
    "connections-unowned",
    "connections-unreachable",
    "worker-loop-errors",
    "connections-quarantined",
    "upstream-refused",
    "worker-event-loop-stalled",
    "feeds-malformed",
}
_STREAM_ALARMS = {"stream-write-throttled", "worker-records-throttled"}
_DELIVERY_ALARMS = {"delivery-to-s3-failed", "delivery-throttled"}
_CONSUMER_ALARMS = {"consumer-iterator-age", "consumer-errors", "consumer-batches-abandoned", "consumer-seqs-abandoned"}


@pytest.mark.parametrize(
    "which, expected",
    [
        ("prod", _EVERY_ENVIRONMENTS_ALARMS),
        ("dev", _EVERY_ENVIRONMENTS_ALARMS | _STREAM_ALARMS | _DELIVERY_ALARMS | _CONSUMER_ALARMS),
        ("kinesis_only", _EVERY_ENVIRONMENTS_ALARMS | _STREAM_ALARMS | _CONSUMER_ALARMS),
    ],
)
def test_stream_and_consumer_alarms_exist_exactly_where_they_do(request, which, expected):
    env = request.getfixturevalue(which)
    prefix = f"wsfleet-{env.settings.name}-"
    names = {
        a["Properties"]["AlarmName"].removeprefix(prefix)
        for a in env.service_template.find_resources("AWS::CloudWatch::Alarm").values()
    }
    assert names == expected
