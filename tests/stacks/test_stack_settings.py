"""Per-environment settings: inconsistent ones fail in app.py, naming the setting, before
CloudFormation ever sees them; and app.py builds exactly one environment."""

from __future__ import annotations

import dataclasses
import random

import pytest
from aws_cdk import Stack

import app as cdk_app
from app import ENVIRONMENTS, create_stacks
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import ConsumerSettings, SettingsError, WarmThroughput
from stacks.synth import check_plan
from wsfleet import config
from wsfleet.leases import reconcile_pause_s


def test_dev_and_prod_exist_and_prod_keeps_its_data():
    assert {"dev", "prod"} <= set(ENVIRONMENTS)
    assert ENVIRONMENTS["prod"].retain_data and not ENVIRONMENTS["dev"].retain_data


@pytest.mark.parametrize(
    "change, named",
    [
        ({"stop_timeout_seconds": 121}, "stop_timeout_seconds"),
        ({"stop_timeout_seconds": 25, "shutdown_seconds": 25}, "stop_timeout_seconds"),
        ({"lease_seconds": 9, "heartbeat_seconds": 5}, "lease_seconds"),
        ({"max_clock_skew_ms": 15_000}, "max_clock_skew_ms"),
        ({"max_clock_skew_ms": 7_500}, "max_clock_skew_ms"),
        ({"reconcile_seconds": 0}, "reconcile_seconds"),
        ({"checkpoint_seconds": 2}, "checkpoint_seconds"),
        ({"flush_interval_ms": 10_001}, "flush_interval_ms must be from 0 to 10000"),
        ({"rebalance_tolerance": 1.5}, "rebalance_tolerance"),
        ({"min_workers": 0}, "min_workers"),
        ({"min_workers": 5, "max_workers": 4}, "min_workers"),
        ({"target_connections_per_worker": 100}, "target_connections_per_worker"),
        ({"worker_cpu": 256, "worker_memory_mib": 4096}, "worker_memory_mib"),
        ({"state_shards": 0}, "state_shards"),
        ({"worker_architecture": "arm"}, "worker_architecture must be one of arm64, x86_64, got 'arm'"),
        ({"worker_base_image": "Python 3.11"}, "worker_base_image must be an image reference"),
        ({"worker_base_image": "python:3.11-slim@sha256:abc"}, "worker_base_image must be an image reference"),
        ({"use_fargate_spot": True, "worker_architecture": "arm64"}, 'use_fargate_spot needs worker_architecture = "x86_64"'),
        ({"nat_gateways": 0}, "nat_gateways"),
        ({"name": "Prod"}, "name"),
        ({"message_ttl_days": -1}, "message_ttl_days"),
        ({"nat_addresses_per_gateway": 9}, "nat_addresses_per_gateway"),
        ({"nat_addresses_per_gateway": 0}, "nat_addresses_per_gateway"),
        ({"worker_subnet_mask": 17}, "worker_subnet_mask"),
        ({"worker_subnet_mask": 25}, "worker_subnet_mask"),
        ({"nat_addresses_per_gateway": "5"}, "nat_addresses_per_gateway must be a whole number"),
        ({"nat_addresses_per_gateway": 2.5}, "nat_addresses_per_gateway must be a whole number"),
        ({"worker_subnet_mask": 20.0}, "worker_subnet_mask must be a whole number"),
        ({"connections_warm_throughput": {"read": 15_000, "write": 40_000}}, "connections_warm_throughput must be a WarmThroughput"),
        ({"owner_index_warm_throughput": 30_000}, "owner_index_warm_throughput must be a WarmThroughput"),
        ({"quotas": {"tasks": 9000}}, "quotas: unknown quota 'tasks'"),
        ({"quotas": [("tasks_per_service", 9000)]}, "quotas must map"),
        ({"quotas": {"tasks_per_service": 0}}, "quotas: tasks_per_service"),
        ({"quotas": {"tasks_per_service": "9000"}}, "quotas: tasks_per_service"),
        ({"quotas": {"table_units": float("inf")}}, "quotas: table_units must be a positive number"),
        ({"quotas": {"table_units": float("nan")}}, "quotas: table_units must be a positive number"),
        ({"connections_warm_throughput": WarmThroughput(read_units_per_second=12_000, write_units_per_second=100)},
         "connections_warm_throughput: write_units_per_second"),
        ({"owner_index_warm_throughput": WarmThroughput(read_units_per_second=50_000, write_units_per_second=4_000)},
         "owner_index_warm_throughput: read_units_per_second"),
    ],
)
def test_inconsistent_settings_are_refused_with_the_setting_named(change, named):
    with pytest.raises(SettingsError, match=named):
        dataclasses.replace(ENVIRONMENTS["dev"], **change)


def _typed(settings_class, *kinds: str) -> list[str]:
    return [f.name for f in dataclasses.fields(settings_class) if f.type in kinds]


# A value of the wrong type where a setting wants a whole number or a number: each must
# stop the synth with a sentence naming the setting (a comparison further on would stop it
# with a TypeError traceback, or a string pass into the template).
_NOT_WHOLE = ["4", 4.5, 20.0, True, None]
_NOT_NUMBER = ["4", True, None, float("inf"), float("nan")]


@pytest.mark.parametrize(
    "setting, value",
    [
        *((name, value) for name in _typed(EnvironmentSettings, "int") for value in _NOT_WHOLE),
        *((name, value) for name in _typed(EnvironmentSettings, "float") for value in _NOT_NUMBER),
    ],
)
def test_a_number_setting_of_another_type_is_refused_by_name(setting, value):
    with pytest.raises(SettingsError, match=rf"^{setting} must be a (whole|finite) number, got "):
        dataclasses.replace(ENVIRONMENTS["dev"], **{setting: value})


def test_the_sweep_above_covers_the_scale_settings():
    assert {"max_workers", "min_workers", "nat_gateways", "nat_addresses_per_gateway", "api_rate_limit"} <= set(
        _typed(EnvironmentSettings, "int")
    )
    assert {"lease_seconds", "heartbeat_seconds", "rebalance_tolerance"} <= set(_typed(EnvironmentSettings, "float"))


@pytest.mark.parametrize(
    "change, named",
    [
        ({"retain_data": "yes"}, "retain_data must be True or False, got 'yes'"),
        ({"keep_legacy_ring_index": 1}, "keep_legacy_ring_index must be True or False, got 1"),
        ({"name": 5}, "name must be a string, got 5"),
        ({"sink": None}, "sink must be a string, got None"),
        ({"upstream_secret_prefix": 7}, "upstream_secret_prefix must be a string or None, got 7"),
        ({"allowed_ws_hosts": "*.example.com"}, "allowed_ws_hosts must be a tuple of strings"),
        ({"consumer": {"batch_size": 10}}, r"consumer must be a ConsumerSettings\(...\) or None"),
        ({"log_retention": 7}, "log_retention must be a logs.RetentionDays member, got 7"),
        ({"log_retention": "ONE_WEEK"}, "log_retention must be a logs.RetentionDays member, got 'ONE_WEEK'"),
    ],
)
def test_other_settings_of_another_type_are_refused_by_name(change, named):
    with pytest.raises(SettingsError, match=f"^{named}"):
        dataclasses.replace(ENVIRONMENTS["dev"], **change)


@pytest.mark.parametrize("setting", _typed(ConsumerSettings, "int", "int | None"))
@pytest.mark.parametrize("value", ["10", 2.5, True])
def test_consumer_number_settings_of_another_type_are_refused_by_name(setting, value):
    with pytest.raises(SettingsError, match=rf"^consumer\.{setting} must be a whole number"):
        ConsumerSettings(**{setting: value})


def test_app_stops_on_a_bad_environment_file_with_a_sentence_not_a_traceback(tmp_path):
    (tmp_path / "dev.toml").write_text('max_workers = "20"\n')
    with pytest.raises(SystemExit) as stopped:
        cdk_app.load_all(tmp_path)
    assert str(stopped.value) == f"{tmp_path / 'dev.toml'}: max_workers must be a whole number, got '20'"
    (tmp_path / "dev.toml").write_text("[consumer]\nbatch_size = 2.5\n")
    with pytest.raises(SystemExit, match=r"dev.toml: consumer.batch_size must be a whole number"):
        cdk_app.load_all(tmp_path)
    (tmp_path / "dev.toml").write_text("nat_gateways = 2\n")
    assert cdk_app.load_all(tmp_path)["dev"].nat_gateways == 2


def test_max_frame_bytes_takes_exactly_the_range_the_worker_accepts():
    for limit in (config.MIN_MAX_FRAME_BYTES, config.DEFAULT_MAX_FRAME_BYTES, config.MAX_MAX_FRAME_BYTES):
        assert dataclasses.replace(ENVIRONMENTS["dev"], max_frame_bytes=limit).max_frame_bytes == limit
    for limit in (config.MIN_MAX_FRAME_BYTES - 1, config.MAX_MAX_FRAME_BYTES + 1):
        with pytest.raises(SettingsError, match="max_frame_bytes"):
            dataclasses.replace(ENVIRONMENTS["dev"], max_frame_bytes=limit)


def test_settings_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        EnvironmentSettings("dev")  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ENVIRONMENTS["dev"].max_workers = 9  # type: ignore[misc]


class _Longest(random.Random):
    """Makes every jittered pause of the runtime its longest."""

    def random(self) -> float:
        return 1.0


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_failover_bound_covers_a_session_expiry_a_late_watch_read_and_a_scan(name):
    settings = ENVIRONMENTS[name]
    timing = settings.session_timing
    # A crashed worker's session can be ended a lease plus the skew margin after its last
    # renewal; a watcher that comes to it late does so at its next read; a freed
    # connection whose hint was lost waits for the next FREE# scan.
    slowest = (
        (timing.lease_ms + timing.max_clock_skew_ms) / 1000
        + timing.watch_pause_s(_Longest())
        + reconcile_pause_s(round(settings.reconcile_seconds * 1000), _Longest())
    )
    assert settings.failover_bound_seconds >= slowest


def test_failover_bound_with_the_contract_defaults():
    # lease 10 + skew 1 + watch window 7.25 (10 - 1.5 x 2.5 + 1) + 2 x reconcile 10
    assert EnvironmentSettings(name="defaults").failover_bound_seconds == 39


def test_app_builds_the_stacks_of_the_chosen_environment_only(new_app):
    app = new_app("prod")
    stateful, service = create_stacks(app)
    assert [s.stack_name for s in (stateful, service)] == ["wsfleet-prod-stateful", "wsfleet-prod-service"]
    assert [c for c in app.node.children if isinstance(c, Stack)] == [stateful, service]


@pytest.mark.parametrize("env", [None, "staging"])
def test_app_refuses_a_missing_or_unknown_environment(new_app, env):
    app = new_app("dev")
    app.node.set_context("env", env)
    with pytest.raises(SystemExit, match="-c env="):
        create_stacks(app)


def test_the_operators_plan_uses_each_environments_own_settings():
    from wsfleet.plan import environments as plan

    for name, settings in ENVIRONMENTS.items():
        # These five; the network, API and capacity settings: tests/stacks/test_plan_environments.py.
        assert {k: plan.load(name)[k] for k in ("max_per_worker", "target_per_worker", "shards", "checkpoint_s", "message_ttl_days")} == {
            "max_per_worker": settings.max_connections_per_worker,
            "target_per_worker": settings.target_connections_per_worker,
            "shards": settings.state_shards,
            "checkpoint_s": settings.checkpoint_seconds,
            "message_ttl_days": settings.message_ttl_days,
        }


# dev asked to scale to 3,000 tasks of 70 (210,000 connections) with nothing else changed.
TOO_BIG = {"max_workers": 3000, "worker_subnet_mask": 24}


def test_synth_refuses_what_the_plan_says_cannot_work_one_sentence_per_limit():
    settings = dataclasses.replace(ENVIRONMENTS["dev"], **TOO_BIG)
    with pytest.raises(SettingsError) as refused:
        check_plan(settings)
    header, *sentences = str(refused.value).splitlines()
    assert header.startswith("the plan at 210,000 connections (max_workers 3000 x target_connections_per_worker 70)")
    # A deploy's 6,000 tasks in two /24 subnets of 251 addresses; 210,000 connections
    # through one NAT address; 6,000 tasks over ECS's 5,000 per service.
    assert "  subnet addresses (task ENIs, 2x tasks during a deploy) (deploy): 6,000 needed, 502 available; " \
           "change the worker subnets' size (worker_subnet_mask)." in sentences
    assert "  NAT connections per address to one destination (steady): 210,000 needed, 55,000 available; " \
           "change nat_gateways, or nat_addresses_per_gateway (secondary addresses)." in sentences
    assert any(line.startswith("  ECS tasks per service during a deploy (deploy): 6,000 needed, 5,000 available")
               for line in sentences)
    assert all(line.startswith("  ") and line.endswith(".") for line in sentences)


def test_a_quota_the_settings_say_was_raised_lets_its_limit_pass():
    big = dataclasses.replace(ENVIRONMENTS["dev"], **TOO_BIG)
    with pytest.raises(SettingsError, match="ECS tasks per service during a deploy"):
        check_plan(big)
    raised = dataclasses.replace(big, quotas={"tasks_per_service": 6000})
    with pytest.raises(SettingsError) as refused:
        check_plan(raised)
    assert "ECS tasks per service" not in str(refused.value)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_every_environment_passes_its_own_plan(name):
    check_plan(ENVIRONMENTS[name])


def test_create_stacks_stops_on_settings_the_plan_refuses(new_app, monkeypatch):
    monkeypatch.setitem(cdk_app.ENVIRONMENTS, "dev", dataclasses.replace(ENVIRONMENTS["dev"], **TOO_BIG))
    with pytest.raises(SystemExit) as stopped:
        create_stacks(new_app("dev"))
    assert str(stopped.value.code).startswith("dev: the plan at 210,000 connections")
    assert "worker_subnet_mask" in str(stopped.value.code)


@pytest.mark.parametrize("image", [
    "python:3.11-slim", "python:3.11-slim@sha256:" + "0" * 64, "public.ecr.aws/docker/library/python:3.11-slim",
    "registry.example.com:5000/base/python@sha256:" + "a" * 64,
])
def test_a_worker_base_image_is_any_image_reference(image):
    assert EnvironmentSettings(name="dev", worker_base_image=image).worker_base_image == image
