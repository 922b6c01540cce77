"""Environments as data: ``environments/<name>.toml`` read into checked settings.

A file holds the settings of :class:`~stacks.settings.EnvironmentSettings` by their names;
what it leaves out takes its default. Tables hold the parts (``[consumer]``,
``[tracing]``, ``[connections_warm_throughput]``, ``[owner_index_warm_throughput]``,
``[messages_capacity]``, ``[quotas]``), lists the tuples, and ``log_retention`` names a ``logs.RetentionDays``
member (``"ONE_WEEK"``). The environment's name is the file's. Whatever is wrong (not
TOML, a setting that does not exist, a value of the wrong kind or out of bounds) is a
:class:`SettingsError` naming the file and the setting; ``app.py`` stops the synth with it.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from pathlib import Path
from typing import Any, Mapping

from aws_cdk import aws_logs as logs

from stacks.settings import EnvironmentSettings
from stacks.settings_parts import ConsumerSettings, MessagesCapacity, SettingsError, TracingSettings, WarmThroughput
from wsfleet.plan import environments as plan_environments

# Settings a file gives as a table, and what each becomes.
_PARTS = {
    "consumer": ConsumerSettings,
    "tracing": TracingSettings,
    "connections_warm_throughput": WarmThroughput,
    "owner_index_warm_throughput": WarmThroughput,
    "messages_capacity": MessagesCapacity,
}
_TUPLES = ("allowed_ws_hosts", "upstream_secret_kms_key_arns")
_SETTINGS = tuple(f.name for f in dataclasses.fields(EnvironmentSettings) if f.name != "name")


def load_environments(where: Path) -> dict[str, EnvironmentSettings]:
    """Every environment of directory ``where``, by name."""
    return {name: load_environment(where, name) for name in plan_environments.names(where)}


def load_environment(where: Path, name: str) -> EnvironmentSettings:
    """The environment ``name`` of directory ``where``, checked."""
    path = where / f"{name}{plan_environments.SUFFIX}"
    try:
        raw = plan_environments.read(where, name)
    except plan_environments.EnvironmentNotFound as error:
        raise SettingsError(str(error)) from None
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{path}: not TOML: {error}") from None
    try:
        return settings_from(name, raw)
    except SettingsError as error:
        raise SettingsError(f"{path}: {error}") from None


def settings_from(name: str, raw: Mapping[str, Any]) -> EnvironmentSettings:
    """An environment's settings from a file's values (see the module docstring)."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _SETTINGS:
            close = difflib.get_close_matches(key, _SETTINGS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise SettingsError(f"{key} is not a setting{hint}; the settings are listed in docs/configuration.md, \"Environments\"")
        values[key] = _value(key, value)
    return EnvironmentSettings(name=name, **values)


def _value(key: str, value: Any) -> Any:
    if key in _PARTS:
        if not isinstance(value, dict):
            raise SettingsError(f"{key} must be a table ([{key}] and its settings), got {value!r}")
        kind = _PARTS[key]
        known = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise SettingsError(f"{key}.{unknown[0]} is not a setting; {key} takes {', '.join(sorted(known))}")
        try:
            return kind(**value)
        except TypeError as error:  # a required field left out (WarmThroughput's two)
            raise SettingsError(f"{key}: {error}") from None
    if key in _TUPLES:
        if not isinstance(value, list):
            raise SettingsError(f"{key} must be a list of strings, got {value!r}")
        return tuple(value)
    if key == "log_retention":
        try:
            return logs.RetentionDays[value]
        except (KeyError, TypeError):
            members = ", ".join(m.name for m in logs.RetentionDays)
            raise SettingsError(f"log_retention must be one of {members}, got {value!r}") from None
    return value
