"""The stacks' environments as a plan reads them: from the same files ``cdk deploy`` reads.

Each environment is one TOML file, ``environments/<name>.toml`` at the repository's top
(``cdk deploy -c env=<name>`` deploys it; the stacks check every setting,
``stacks/environment_files.py``). A plan needs a few of its settings; here they are read
from the file, a setting the file leaves out taking its default from :data:`DEFAULTS`,
which the stacks' settings take theirs from too: one declaration, no copy to drift.

The directory is ``WSFLEET_ENVIRONMENTS`` if set, else ``./environments``, else the one
of the checkout this package runs from.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

from .. import schema, settings_spec

ENVIRONMENTS_VARIABLE = "WSFLEET_ENVIRONMENTS"
SUFFIX = ".toml"
AVAILABILITY_ZONES = 2  # the VPC's: a worker subnet and at most one NAT gateway in each

# How the messages table and the stream are provisioned (``messages_capacity.billing``,
# ``stream_mode``), and a provisioned table's part when the file leaves a key out: write
# and read units autoscaled between their bounds to keep the target utilisation (DynamoDB
# autoscaling takes 20 % to 90 %).
ON_DEMAND, PROVISIONED = "on_demand", "provisioned"
CAPACITY_MODES = (ON_DEMAND, PROVISIONED)
TARGET_UTILISATION_RANGE = (0.2, 0.9)
MESSAGES_CAPACITY_DEFAULTS: dict[str, Any] = {
    "billing": ON_DEMAND,
    "min_write_units": 5,
    "max_write_units": 40_000,
    "min_read_units": 5,
    "max_read_units": 40_000,
    "target_utilisation": 0.7,
}

# The settings a plan reads, with the default each takes when a file leaves it out (the
# stacks' EnvironmentSettings fields default to these same values), and the plan's name
# for each.
DEFAULTS: dict[str, Any] = {
    "max_connections_per_worker": 100,
    "target_connections_per_worker": 70,
    "state_shards": schema.DEFAULT_STATE_SHARDS,
    "checkpoint_seconds": 120,
    "flush_interval_ms": 100,
    "message_ttl_days": 7,
    "min_workers": 1,
    "max_workers": 4,
    "worker_cpu": 256,
    "worker_memory_mib": 512,
    "api_rate_limit": 50,
    "api_burst_limit": 100,
    "nat_gateways": 1,
    "nat_addresses_per_gateway": 1,
    "worker_subnet_mask": 20,
    "lease_seconds": 10,
    "heartbeat_seconds": 2.5,
    "use_fargate_spot": False,
    "worker_architecture": "arm64",
    "max_frame_bytes": settings_spec.VARIABLES[settings_spec.MAX_FRAME_BYTES].default,
    "connections_warm_throughput": None,
    "owner_index_warm_throughput": None,
    "quotas": {},
    # Where frames go and how each is provisioned: the plan prices what these deploy.
    "sink": ",".join(schema.DEFAULT_SINKS),
    "messages_capacity": None,  # None: the messages table on-demand
    "stream_mode": ON_DEMAND,
    "stream_shards": None,
    "stream_retention_hours": 24,
}
PLAN_NAMES = {
    "max_connections_per_worker": "max_per_worker",
    "target_connections_per_worker": "target_per_worker",
    "state_shards": "shards",
    "checkpoint_seconds": "checkpoint_s",
    "flush_interval_ms": "flush_ms",
    "lease_seconds": "lease_s",
    "heartbeat_seconds": "heartbeat_s",
    "use_fargate_spot": "spot",
    "worker_architecture": "architecture",
    "connections_warm_throughput": "connections_warm",
    "owner_index_warm_throughput": "owner_index_warm",
}


class EnvironmentNotFound(LookupError):
    """No file for the environment named; the message lists those there are."""


def plan_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """An environment's settings (a file's, or the stacks' checked ones: warm throughput
    as ``{"read_units_per_second", "write_units_per_second"}``) as the plan reads them."""
    out: dict[str, Any] = {}
    for setting, default in DEFAULTS.items():
        value = values.get(setting, default)
        if setting.endswith("_warm_throughput") and value is not None:
            value = {"read": value["read_units_per_second"], "write": value["write_units_per_second"]}
        elif setting == "quotas":
            value = dict(value)
        elif setting == "messages_capacity" and value is not None:
            value = {**MESSAGES_CAPACITY_DEFAULTS, **value}
        out[PLAN_NAMES.get(setting, setting)] = value
    out["azs"] = AVAILABILITY_ZONES
    return out


def directory(env: Mapping[str, str] | None = None) -> Path:
    """Where the environment files are (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get(ENVIRONMENTS_VARIABLE):
        return Path(env[ENVIRONMENTS_VARIABLE])
    here = Path("environments")
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[3] / "environments"


def names(where: Path) -> list[str]:
    """The environments there are: one per ``<name>.toml``."""
    return sorted(p.name.removesuffix(SUFFIX) for p in where.glob(f"*{SUFFIX}")) if where.is_dir() else []


def read(where: Path, name: str) -> dict[str, Any]:
    """The file of environment ``name``, parsed (EnvironmentNotFound if there is none;
    tomllib.TOMLDecodeError if it is not TOML)."""
    path = where / f"{name}{SUFFIX}"
    if not path.is_file():
        there = ", ".join(names(where)) or "none"
        raise EnvironmentNotFound(f"no environment {name!r}: {path} does not exist (environments in {where}: {there})")
    with path.open("rb") as f:
        return tomllib.load(f)


class BadEnvironment(ValueError):
    """A file a plan cannot read the settings it needs from (``cdk synth`` says more)."""


def load(name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Environment ``name`` as the plan reads it (EnvironmentNotFound, BadEnvironment)."""
    where = directory(env)
    try:
        return plan_settings(read(where, name))
    except tomllib.TOMLDecodeError as error:
        raise BadEnvironment(f"{where / (name + SUFFIX)} is not TOML: {error}") from None
    except (KeyError, TypeError, AttributeError) as error:
        raise BadEnvironment(
            f"{where / (name + SUFFIX)}: a setting the plan reads is not what it should be ({type(error).__name__}: "
            f"{error}); `cdk synth -c env={name}` names it"
        ) from None
