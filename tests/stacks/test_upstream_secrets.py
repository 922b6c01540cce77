"""Upstream credentials (issue 20): the allowed secret prefix per environment, set on the
router and the worker, and the worker's grant on exactly the secrets under it (plus, when
configured, kms:Decrypt through Secrets Manager on customer-managed keys). The router
reads no secret. Resources are found by what they are, never by generated logical id."""

from __future__ import annotations

import dataclasses
import json

import pytest
from aws_cdk.assertions import Match, Template

import app as cdk_app
from tests.stacks.test_service_stack import _worker_environment
from stacks.constructs.alarms import REFUSED_MINUTES
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import SettingsError
from wsfleet import config, metrics_names, settings_spec, upstream_spec, validation

KEY_ARN = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _secrets_arn(prefix: str) -> dict:
    """arn:<partition>:secretsmanager:<region>:<account>:secret:<prefix>*, as the template
    writes it (pseudo parameters, not literals: the stacks are environment-agnostic)."""
    return {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":secretsmanager:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                f":secret:{prefix}*",
            ],
        ]
    }


def _statements_of(template: Template, role_arn: dict) -> list[dict]:
    role_id = role_arn["Fn::GetAtt"][0]
    return [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def _task_role(template: Template) -> dict:
    (task,) = template.find_resources("AWS::ECS::TaskDefinition").values()
    return task["Properties"]["TaskRoleArn"]


def _actions(statement: dict) -> list[str]:
    return [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]


def _touching(statements: list[dict], *prefixes: str) -> list[dict]:
    """The statements with an action under ``prefixes``, but the messages stream key's
    (KMS only through Kinesis: tests/stacks/test_messages_stream.py)."""
    return [
        s
        for s in statements
        if any(a.startswith(prefixes) for a in _actions(s)) and "kinesis." not in json.dumps(s.get("Condition", {}))
    ]


def _synth(new_app, monkeypatch, **changes) -> Template:
    """The dev app with ``changes`` to its settings, synthesized with cdk-nag (a finding
    nobody acknowledged fails here)."""
    monkeypatch.setitem(cdk_app.ENVIRONMENTS, "dev", dataclasses.replace(cdk_app.ENVIRONMENTS["dev"], **changes))
    app = new_app("dev")
    _, service = cdk_app.create_stacks(app)
    assembly = app.synth()
    return Template.from_json(assembly.get_stack_by_name(service.stack_name).template)


# --- the setting ------------------------------------------------------------------------------


def test_each_environment_names_its_own_prefix_in_app_py():
    assert cdk_app.ENVIRONMENTS["dev"].secret_prefix == "wsfleet/dev/"
    assert cdk_app.ENVIRONMENTS["prod"].secret_prefix == "wsfleet/prod/"


def test_the_default_prefix_is_the_environments_name():
    assert EnvironmentSettings(name="staging").secret_prefix == "wsfleet/staging/"
    assert EnvironmentSettings(name="staging", upstream_secret_prefix="").secret_prefix == ""


@pytest.mark.parametrize("prefix", ["wsfleet/dev/*", "wsfleet dev/", " wsfleet/dev/", "x" * 257, "wsfleet/dév/"])
def test_a_prefix_the_runtime_would_refuse_stops_the_synth_naming_the_setting(prefix):
    with pytest.raises(SettingsError, match="upstream_secret_prefix"):
        EnvironmentSettings(name="dev", upstream_secret_prefix=prefix)
    # The runtime agrees, or strips what the grant would then not match.
    try:
        parsed = config.upstream_secret_prefix({settings_spec.UPSTREAM_SECRET_PREFIX: prefix})
    except settings_spec.ConfigError:
        return
    assert parsed != prefix


@pytest.mark.parametrize(
    "keys",
    [
        ("alias/upstreams",),
        ("arn:aws:kms:eu-west-1:123456789012:alias/upstreams",),
        ("arn:aws:kms:eu-west-1:123456789012:key/*",),
    ],
)
def test_kms_keys_must_be_key_arns(keys):
    with pytest.raises(SettingsError, match="upstream_secret_kms_key_arns"):
        EnvironmentSettings(name="dev", upstream_secret_kms_key_arns=keys)


def test_kms_keys_without_any_allowed_secret_are_refused():
    with pytest.raises(SettingsError, match="upstream_secret_kms_key_arns"):
        EnvironmentSettings(name="dev", upstream_secret_prefix="", upstream_secret_kms_key_arns=(KEY_ARN,))


# --- the environment variable ------------------------------------------------------------------


def test_router_and_worker_get_the_prefix_as_upstream_secret_prefix(env):
    prefix = env.settings.secret_prefix
    env.service_template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "wsfleet.router.handler",
            "Environment": {"Variables": Match.object_like({settings_spec.UPSTREAM_SECRET_PREFIX: prefix})},
        },
    )
    env.service_template.has_resource_properties(
        "AWS::ECS::TaskDefinition",
        {
            "ContainerDefinitions": Match.array_with(
                [
                    Match.object_like(
                        {
                            "Name": "worker",
                            "Environment": Match.array_with([{"Name": settings_spec.UPSTREAM_SECRET_PREFIX, "Value": prefix}]),
                        }
                    )
                ]
            )
        },
    )


def test_the_router_accepts_an_arn_under_the_prefix_and_refuses_one_beside_it(env):
    """What the router is told is what it enforces: parse with the value the stack sets."""
    prefix = env.settings.secret_prefix
    under = f"arn:aws:secretsmanager:eu-west-1:123456789012:secret:{prefix}feed-AbCdEf"
    beside = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet/other/feed-AbCdEf"
    parsed = upstream_spec.parse({"secret_headers": {"Authorization": under}}, secret_prefix=prefix)
    assert parsed.item() == {"secret_headers": {"Authorization": under}}
    with pytest.raises(validation.Invalid, match="not under the allowed prefix") as refused:
        upstream_spec.parse({"secret_headers": {"Authorization": beside}}, secret_prefix=prefix)
    assert refused.value.code == upstream_spec.SECRET_NOT_ALLOWED


# --- the grants ----------------------------------------------------------------------------------


def test_the_worker_may_read_exactly_the_secrets_under_the_prefix_and_their_hosts_tags(env):
    prefix = env.settings.secret_prefix
    read = {"Action": ["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"], "Effect": "Allow", "Resource": _secrets_arn(prefix)}
    env.service_template.has_resource_properties(
        "AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([read])}}
    )
    worker = _statements_of(env.service_template, _task_role(env.service_template))
    # DescribeSecret: the wsfleet:hosts tag that says where each secret may be sent.
    assert _touching(worker, "secretsmanager:", "kms:") == [read]


@pytest.mark.parametrize("stack", ["stateful", "service"])
def test_nothing_else_may_touch_secrets_or_keys(env, stack):
    template = env.template(stack)
    task_role = _task_role(env.service_template)["Fn::GetAtt"][0]
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": task_role} in policy["Properties"]["Roles"]:
            continue
        assert not _touching(policy["Properties"]["PolicyDocument"]["Statement"], "secretsmanager:", "kms:"), policy


def test_with_customer_managed_keys_the_worker_may_decrypt_only_through_secrets_manager_for_those_secrets(
    new_app, monkeypatch
):
    template = _synth(new_app, monkeypatch, upstream_secret_kms_key_arns=(KEY_ARN,))
    worker = _statements_of(template, _task_role(template))
    (decrypt,) = _touching(worker, "kms:")
    assert decrypt == {
        "Action": "kms:Decrypt",
        "Effect": "Allow",
        "Resource": KEY_ARN,
        "Condition": {
            "StringEquals": {
                "kms:ViaService": {"Fn::Join": ["", ["secretsmanager.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]}
            },
            # Secrets Manager's encryption context names the secret being decrypted.
            "StringLike": {"kms:EncryptionContext:SecretARN": _secrets_arn("wsfleet/dev/")},
        },
    }
    assert [s["Action"] for s in _touching(worker, "secretsmanager:")] == [["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"]]


def test_with_an_empty_prefix_no_secret_is_allowed_and_none_is_readable(new_app, monkeypatch):
    template = _synth(new_app, monkeypatch, upstream_secret_prefix="")
    worker = _statements_of(template, _task_role(template))
    assert _touching(worker, "secretsmanager:", "kms:") == []
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Environment": {"Variables": Match.object_like({settings_spec.UPSTREAM_SECRET_PREFIX: ""})}},
    )


# --- the alarm ---------------------------------------------------------------------------------


def test_alarm_when_connections_stay_refused_for_minutes_in_a_row(env):
    (alarm,) = [
        a["Properties"]
        for a in env.service_template.find_resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"]["AlarmName"] == f"wsfleet-{env.settings.name}-upstream-refused"
    ]
    assert (alarm["Namespace"], alarm["MetricName"]) == (
        metrics_names.DEFAULT_NAMESPACE,
        metrics_names.REFUSED_CONNECTIONS,
    )
    assert alarm["Dimensions"] == [{"Name": metrics_names.DIMENSION_SERVICE_NAME, "Value": env.settings.service_name}]
    # A gauge per worker: any worker with any refused connection, in 5 one-minute periods
    # (a refused connection retries about once a minute, so one that gets through at its
    # next retry or the one after never fires it) out of 6: a worker's datapoints drift
    # across minute boundaries, and the minute left without one must not reset the count.
    assert alarm["Statistic"] == "Maximum" and alarm["Period"] == 60
    assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["DatapointsToAlarm"] == REFUSED_MINUTES == 5
    assert alarm["EvaluationPeriods"] == REFUSED_MINUTES + 1
    assert alarm["TreatMissingData"] == "notBreaching"
    assert "last_error" in alarm["AlarmDescription"]


def test_the_refused_alarm_is_on_the_dashboards_alarm_status_and_notifies_the_topic(new_app, monkeypatch):
    topic = "arn:aws:sns:eu-west-1:123456789012:wsfleet-alarms"
    template = _synth(new_app, monkeypatch, alarm_topic_arn=topic)
    (logical_id,) = [
        k
        for k, a in template.find_resources("AWS::CloudWatch::Alarm").items()
        if a["Properties"]["MetricName"] == metrics_names.REFUSED_CONNECTIONS
    ]
    assert template.find_resources("AWS::CloudWatch::Alarm")[logical_id]["Properties"]["AlarmActions"] == [topic]
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    assert {"Fn::GetAtt": [logical_id, "Arn"]} in body


def test_prod_requires_secrets_to_be_tagged_with_their_hosts_and_dev_does_not(env):
    variables = _worker_environment(env)
    assert variables[settings_spec.SECRET_HOSTS_REQUIRED] == ("on" if env.settings.name == "prod" else "off")
