"""Per-environment settings: inconsistent ones fail in app.py, naming the setting, before
CloudFormation ever sees them; and app.py builds exactly one environment."""

from __future__ import annotations

import dataclasses
import random

import pytest
from aws_cdk import Stack

from app import ENVIRONMENTS, create_stacks
from stacks.settings import EnvironmentSettings, SettingsError
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
        ({"rebalance_tolerance": 1.5}, "rebalance_tolerance"),
        ({"min_workers": 0}, "min_workers"),
        ({"min_workers": 5, "max_workers": 4}, "min_workers"),
        ({"target_connections_per_worker": 100}, "target_connections_per_worker"),
        ({"worker_cpu": 256, "worker_memory_mib": 4096}, "worker_memory_mib"),
        ({"state_shards": 0}, "state_shards"),
        ({"nat_gateways": 0}, "nat_gateways"),
        ({"name": "Prod"}, "name"),
        ({"message_ttl_days": -1}, "message_ttl_days"),
    ],
)
def test_inconsistent_settings_are_refused_with_the_setting_named(change, named):
    with pytest.raises(SettingsError, match=named):
        dataclasses.replace(ENVIRONMENTS["dev"], **change)


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
    from wsfleet import plan

    for name, settings in ENVIRONMENTS.items():
        # These five; the network, API and capacity settings: tests/stacks/test_plan_environments.py.
        assert {k: plan.ENVIRONMENTS[name][k] for k in ("max_per_worker", "target_per_worker", "shards", "checkpoint_s", "message_ttl_days")} == {
            "max_per_worker": settings.max_connections_per_worker,
            "target_per_worker": settings.target_connections_per_worker,
            "shards": settings.state_shards,
            "checkpoint_s": settings.checkpoint_seconds,
            "message_ttl_days": settings.message_ttl_days,
        }
