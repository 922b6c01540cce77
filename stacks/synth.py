"""What ``app.py`` does to an environment's settings at synth time: the context values
an operator may override them with, and the plan they must fit."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from stacks.settings import EnvironmentSettings
from stacks.settings_parts import ON_DEMAND, ConsumerSettings, SettingsError
from wsfleet.plan import limits as plan_limits
from wsfleet.plan import model as plan

# The settings an operator may override at synth time without editing the environment's
# file, e.g.
#   cdk synth -c env=prod -c sink=dynamodb,kinesis -c consumer=on -c allowed_ws_hosts=a.example.com,*.b.example.com
CONTEXT_OVERRIDES = (
    "sink", "stream_retention_hours", "stream_kms", "stream_mode", "stream_shards", "consumer", "keep_legacy_ring_index",
    "allowed_ws_hosts",
)
_ON, _OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


def with_context(settings: EnvironmentSettings, lookup: Callable[[str], Any]) -> EnvironmentSettings:
    """``settings`` with the CONTEXT_OVERRIDES that ``lookup`` (the app's
    ``node.try_get_context``) has a value for. ``consumer=on`` deploys the reference
    consumer with the environment's own consumer settings, or the defaults where it has
    none; ``stream_mode=on_demand`` drops the file's ``stream_shards``. A bad value is a
    SettingsError naming the context key."""
    changes: dict[str, Any] = {}
    for key in CONTEXT_OVERRIDES:
        value = lookup(key)
        if value is None:
            continue
        text = str(value).strip()  # the CLI passes strings; cdk.json may hold numbers or booleans
        if key == "consumer":
            if text.lower() in _ON:
                changes[key] = settings.consumer or ConsumerSettings()
            elif text.lower() in _OFF:
                changes[key] = None
            else:
                raise SettingsError(f"-c consumer must be on or off, got {value!r}")
        elif key == "keep_legacy_ring_index":
            if text.lower() not in _ON + _OFF:
                raise SettingsError(f"-c keep_legacy_ring_index must be on or off, got {value!r}")
            changes[key] = text.lower() in _ON
        elif key in ("stream_retention_hours", "stream_shards"):
            try:
                changes[key] = int(text)
            except ValueError:
                unit = "hours" if key == "stream_retention_hours" else "shards"
                raise SettingsError(f"-c {key} must be a whole number of {unit}, got {value!r}") from None
        elif key == "allowed_ws_hosts":
            changes[key] = tuple(host.strip() for host in text.split(",") if host.strip())
        else:
            changes[key] = text
    if changes.get("stream_mode") == ON_DEMAND and "stream_shards" not in changes:
        changes["stream_shards"] = None  # an on-demand stream has no shard count to keep
    if not changes:
        return settings
    try:
        return dataclasses.replace(settings, **changes)
    except SettingsError as error:
        given = " ".join(f"-c {k}={lookup(k)}" for k in changes)
        raise SettingsError(f"{error} (with {given})") from None


def check_plan(settings: EnvironmentSettings, measured: plan.Measured | None = None) -> None:
    """Refuse settings that ``wsfleet plan`` says cannot work at the fleet they are built
    for (:attr:`EnvironmentSettings.capacity_connections`), with the environment's quotas:
    a SettingsError with one sentence per limit exceeded, furthest over first, each naming
    what moves it. The plan's own checks (``plan_limits.evaluate``), not a copy of them."""
    connections = settings.capacity_connections
    result = plan_limits.evaluate(measured or plan.load_measured(), settings.plan_settings, connections=connections)
    if result["refusals"]:
        raise SettingsError(
            f"the plan at {connections:,} connections (max_workers {settings.max_workers} x "
            f"target_connections_per_worker {settings.target_connections_per_worker}) exceeds "
            f"{len(result['refusals'])} limit(s), see `wsfleet plan --env {settings.name} --connections {connections}`:\n"
            + "\n".join(f"  {sentence}." for sentence in result["refusals"])
        )
