"""How the messages table is billed and the stream provisioned (``messages_capacity``,
``stream_mode``, ``stream_shards``): the settings, each bad combination refused in a
sentence naming the setting, a file's ``[messages_capacity]``, and what the constructs
deploy for them (a bare stack each: no whole app to synthesize)."""

from __future__ import annotations

import dataclasses

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Match, Template

from app import ENVIRONMENTS
from stacks.constructs.messages_stream import MESSAGES_STREAM_LOGICAL_ID, MessagesStream
from stacks.constructs.tables import MESSAGES_LOGICAL_ID, Tables
from stacks.environment_files import load_environment
from stacks.settings_parts import MessagesCapacity, SettingsError
from stacks.synth import with_context
from wsfleet import schema
from wsfleet.plan import environments as plan_environments

PROVISIONED = MessagesCapacity(billing="provisioned", min_write_units=100, max_write_units=2000, min_read_units=50,
                               max_read_units=500, target_utilisation=0.6)


@pytest.mark.parametrize(
    "change, sentence",
    [
        ({"stream_mode": "fixed"}, "stream_mode must be 'on_demand' or 'provisioned', got 'fixed'"),
        ({"stream_shards": None}, 'stream_mode = "provisioned" needs stream_shards, the shards to deploy'),
        ({"stream_mode": "on_demand"}, 'stream_shards applies only to stream_mode = "provisioned": an on-demand stream sizes itself'),
        ({"stream_shards": 0}, "stream_shards must be between 1 and 20,000 (the account's shard quota), got 0"),
        ({"stream_shards": 2.5}, "stream_shards must be a whole number or None, got 2.5"),
        ({"sink": "dynamodb", "consumer": None},
         'stream_mode = "provisioned" needs a stream: sink must include kinesis, got \'dynamodb\''),
        ({"sink": "kinesis", "messages_capacity": PROVISIONED},
         'messages_capacity.billing = "provisioned" needs sink to include dynamodb'),
        ({"messages_capacity": dataclasses.replace(PROVISIONED, max_write_units=50_000)},
         "messages_capacity.max_write_units 50,000 is above the table quota (40,000): raise it in quotas.table_units first"),
        ({"messages_capacity": "provisioned"}, "messages_capacity must be a MessagesCapacity(...) or None, got 'provisioned'"),
    ],
)
def test_bad_capacity_settings_are_refused_in_a_sentence_naming_the_setting(change, sentence):
    # dev: both sinks, the stream provisioned with one shard.
    with pytest.raises(SettingsError) as refused:
        dataclasses.replace(ENVIRONMENTS["dev"], **change)
    assert str(refused.value).startswith(sentence)


@pytest.mark.parametrize(
    "fields, sentence",
    [
        ({"billing": "reserved"}, "messages_capacity.billing must be 'on_demand' or 'provisioned', got 'reserved'"),
        ({"max_write_units": 1000}, 'messages_capacity.max_write_units applies only to billing = "provisioned"'),
        ({"billing": "provisioned", "min_write_units": 10, "max_write_units": 5},
         "messages_capacity: min_write_units must be at least 1 and at most max_write_units, got 10 and 5"),
        ({"billing": "provisioned", "min_read_units": 0}, "messages_capacity: min_read_units must be at least 1"),
        ({"billing": "provisioned", "target_utilisation": 0.95},
         "messages_capacity.target_utilisation must be between 0.2 and 0.9 (what DynamoDB autoscaling targets), got 0.95"),
        ({"billing": "provisioned", "min_write_units": "5"}, "messages_capacity.min_write_units must be a whole number"),
    ],
)
def test_bad_messages_capacity_is_refused_in_a_sentence(fields, sentence):
    with pytest.raises(SettingsError) as refused:
        MessagesCapacity(**fields)
    assert str(refused.value).startswith(sentence)


def test_a_files_messages_capacity_is_read_by_the_stacks_and_the_plan_alike(tmp_path):
    (tmp_path / "big.toml").write_text(
        'sink = "dynamodb"\n[quotas]\ntable_units = 400000\n'
        '[messages_capacity]\nbilling = "provisioned"\nmax_write_units = 400000\nmin_read_units = 6250\n'
    )
    settings = load_environment(tmp_path, "big")
    assert settings.messages_capacity == MessagesCapacity(billing="provisioned", max_write_units=400_000,
                                                          min_read_units=6250)
    plan = plan_environments.load("big", {"WSFLEET_ENVIRONMENTS": str(tmp_path)})
    assert plan == settings.plan_settings
    assert plan["messages_capacity"]["min_write_units"] == plan_environments.MESSAGES_CAPACITY_DEFAULTS["min_write_units"]
    (tmp_path / "typo.toml").write_text('[messages_capacity]\nbiling = "provisioned"\n')
    with pytest.raises(SettingsError, match=r"messages_capacity\.biling is not a setting; messages_capacity takes billing, "):
        load_environment(tmp_path, "typo")


def _template(build) -> dict:
    stack = Stack(App(), "t")
    build(stack)
    return Template.from_stack(stack)


def test_a_provisioned_messages_table_and_its_index_autoscale_at_the_target():
    t = _template(lambda s: Tables(s, "Tables", retain_data=False, messages_capacity=PROVISIONED))
    table = t.to_json()["Resources"][MESSAGES_LOGICAL_ID]["Properties"]
    assert "BillingMode" not in table  # PROVISIONED, CloudFormation's default
    assert table["ProvisionedThroughput"] == {"ReadCapacityUnits": 50, "WriteCapacityUnits": 100}
    (index,) = table["GlobalSecondaryIndexes"]
    assert index["IndexName"] == schema.MARKERS_INDEX and index["ProvisionedThroughput"]["WriteCapacityUnits"] >= 1
    targets = t.find_resources("AWS::ApplicationAutoScaling::ScalableTarget")
    dimensions = sorted((p["Properties"]["ScalableDimension"], p["Properties"]["MinCapacity"], p["Properties"]["MaxCapacity"])
                        for p in targets.values())
    assert dimensions == sorted([
        ("dynamodb:table:WriteCapacityUnits", 100, 2000), ("dynamodb:table:ReadCapacityUnits", 50, 500),
        ("dynamodb:index:WriteCapacityUnits", 5, 2000), ("dynamodb:index:ReadCapacityUnits", 5, 500),
    ])
    t.resource_properties_count_is("AWS::ApplicationAutoScaling::ScalingPolicy", {
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": Match.object_like({"TargetValue": 60}),
    }, 4)
    # The other two tables stay on-demand.
    t.resource_properties_count_is("AWS::DynamoDB::Table", {"BillingMode": "PAY_PER_REQUEST"}, 2)


def test_without_messages_capacity_every_table_is_on_demand_with_nothing_to_scale():
    t = _template(lambda s: Tables(s, "Tables", retain_data=False))
    t.resource_properties_count_is("AWS::DynamoDB::Table", {"BillingMode": "PAY_PER_REQUEST"}, 3)
    t.resource_count_is("AWS::ApplicationAutoScaling::ScalableTarget", 0)


def test_a_provisioned_stream_has_its_shards_and_an_on_demand_one_none():
    for shards, mode in ((3, "PROVISIONED"), (None, "ON_DEMAND")):
        t = _template(lambda s, n=shards: MessagesStream(s, "Stream", retention_hours=24, customer_managed_key=False,
                                                        retain_data=False, shards=n))
        props = t.to_json()["Resources"][MESSAGES_STREAM_LOGICAL_ID]["Properties"]
        assert props["StreamModeDetails"] == {"StreamMode": mode} and props.get("ShardCount") == shards


def test_the_streams_mode_can_be_given_at_synth_time():
    dev = ENVIRONMENTS["dev"]
    on_demand = with_context(dev, {"stream_mode": "on_demand"}.get)
    assert (on_demand.stream_mode, on_demand.stream_shards) == ("on_demand", None)
    # dev's table alone: the stream's mode goes with the stream.
    table_only = with_context(dev, {"sink": "dynamodb", "consumer": "off", "stream_mode": "on_demand"}.get)
    assert table_only.sinks == ("dynamodb",)
    assert with_context(dev, {"stream_shards": "4"}.get).stream_shards == 4
    with pytest.raises(SettingsError, match=r"^-c stream_shards must be a whole number of shards, got 'many'$"):
        with_context(dev, {"stream_shards": "many"}.get)
    with pytest.raises(SettingsError, match=r"stream_mode = \"provisioned\" needs a stream: .* \(with -c sink=dynamodb -c consumer=off\)$"):
        with_context(dev, {"sink": "dynamodb", "consumer": "off"}.get)
